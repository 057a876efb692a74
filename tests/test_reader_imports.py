"""Every import of the reader that README.md and docs/*.md show works, in a fresh interpreter and in any order.

`from reader import collate` once recursed forever (the lazy `__getattr__` imported `reader.collate`,
which asked the package's `__getattr__` again), and after `from reader import ShardLoader` the name
`reader.collate` was the submodule reader/collate.py, not the function: the import system binds a
submodule as a package attribute. Both depend on what was imported before, so each case runs in its
own interpreter. The names come from the docs themselves, so a newly documented one is tested too.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fork_runner import ForkRunner

ROOT = Path(__file__).resolve().parent.parent
README = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
PYTHON_BLOCKS = re.findall(r"^```python\n(.*?)^```", README, flags=re.S | re.M)
IMPORT_LINES = sorted({m.strip() for block in PYTHON_BLOCKS
                       for m in re.findall(r"^\s*(?:from robowds\.reader(?:\.\w+)* import [\w, ]+|import robowds\.reader[\w.]*)\s*$",
                                           block, flags=re.M)})
FROM_NAMES = {n.strip() for line in IMPORT_LINES if line.startswith("from robowds.reader import")
              for n in line.split(" import ", 1)[1].split(",")}
SUBMODULES = sorted(p.stem for p in (ROOT / "reader").glob("*.py") if p.stem != "__init__")
PACKAGES = {p.parent.name for p in (ROOT / "reader").glob("*/__init__.py")}  # robowds.reader.transforms
# `robowds.reader.X` anywhere in the README (code blocks and prose), but not file paths like reader/collate.py
# nor module or sub-package paths like robowds.reader.interop (their import lines run verbatim below)
ATTRIBUTE_NAMES = set(re.findall(r"\brobowds\.reader\.([A-Za-z_]\w*)\b(?!\.py|/)", README)) - set(SUBMODULES) - PACKAGES
EXPLICIT = {"ShardDataset", "ShardLoader", "collate", "Collate"}  # issue 9 item 7
NAMES = sorted(FROM_NAMES | ATTRIBUTE_NAMES | EXPLICIT)

# checks every public name after `first` ran; prints OK on success (an exception exits non-zero)
CHECK_ALL = """
import types
import robowds.reader as reader
for name in {names!r}:
    namespace = {{}}
    exec(f"from robowds.reader import {{name}} as obj", namespace)
    obj = namespace["obj"]
    assert not isinstance(obj, types.ModuleType), f"reader.{{name}} is the module {{obj!r}}"
    assert getattr(reader, name) is obj, name
    defined_in = obj.__module__ if isinstance(obj, type) else type(obj).__module__
    assert defined_in.startswith("robowds.reader."), (name, defined_in)
    assert name in dir(reader), name
assert isinstance(reader.collate, reader.Collate) and callable(reader.collate)
assert isinstance(reader.ShardLoader, type) and isinstance(reader.ShardDataset, type)
print("OK")
"""


def run_fresh(code: str) -> str:
    """Run `code` in a new interpreter (the installed `robowds.reader`); returns its stdout."""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"{code}\n---\n{done.stderr[-3000:]}"
    return done.stdout


# Each case runs in a fork of one interpreter that has imported the third-party libraries the reader
# uses, but nothing of robowds (tests/fork_runner.py): the order-dependent faults above live in
# robowds.reader's own imports, which every fork does afresh. A new interpreter per case (importing
# torch each time) took ~57 s for the suite's ~40 cases on 2 cores; this takes a few seconds.
PRELOAD = """
import sys, numpy, torch, torch.utils.data, fsspec, pyarrow
assert not any(m == "robowds" or m.startswith("robowds.") for m in sys.modules), "robowds imported before the forks"
"""


CASES = {**{f"from {name}": f"from robowds.reader import {name}\n" + CHECK_ALL.format(names=NAMES) for name in NAMES},
         **{f"attribute {name}": f"import robowds.reader as reader\nreader.{name}\n" + CHECK_ALL.format(names=NAMES)
            for name in NAMES},
         "every submodule first": "".join(f"import robowds.reader.{m}\n" for m in SUBMODULES) + CHECK_ALL.format(names=NAMES),
         "readme import lines": "\n".join(IMPORT_LINES) + "\n" + CHECK_ALL.format(names=NAMES),
         "a failing case": "print('before')\nfrom robowds.reader import NoSuchName"}


@pytest.fixture(scope="module")
def forked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, str]]:
    """{case: (exit status, stdout, stderr)} of every case of CASES, each run as a script in its own fork."""
    folder = tmp_path_factory.mktemp("imports")
    runner = ForkRunner(PRELOAD, dict(os.environ))
    try:
        results = {}
        for i, (key, code) in enumerate(CASES.items()):
            case = folder / f"case{i}"
            case.mkdir()
            (case / "case.py").write_text(code)
            results[key] = runner.run(case / "case.py", case)
        return results
    finally:
        runner.close()


def test_readme_names_were_found() -> None:
    """The parse works: the README's reader snippet imports ShardDataset/ShardLoader and its prose
    documents reader.collate / reader.Collate."""
    assert {"ShardDataset", "ShardLoader"} <= FROM_NAMES
    assert {"collate", "Collate"} <= ATTRIBUTE_NAMES
    assert set(NAMES) <= set(importlib.import_module("robowds.reader").__all__)


@pytest.mark.parametrize("name", NAMES)
def test_from_import_first(name: str, forked: dict[str, tuple[int, str, str]]) -> None:
    """`from robowds.reader import X` as the first import, then every other name both ways."""
    status, out, err = forked[f"from {name}"]
    assert status == 0 and out.endswith("OK\n"), err[-3000:]


@pytest.mark.parametrize("name", NAMES)
def test_attribute_first(name: str, forked: dict[str, tuple[int, str, str]]) -> None:
    """`import robowds.reader as reader; reader.X` as the first access (e.g. `reader.Collate(...)`), then the rest."""
    status, out, err = forked[f"attribute {name}"]
    assert status == 0 and out.endswith("OK\n"), err[-3000:]


def test_a_fault_in_a_fork_is_reported(forked: dict[str, tuple[int, str, str]]) -> None:
    """The fork driver reports a failing case as such, with its output."""
    status, out, err = forked["a failing case"]
    assert status != 0 and out == "before\n" and "ImportError: cannot import name 'NoSuchName'" in err


def test_every_submodule_imported_first(forked: dict[str, tuple[int, str, str]]) -> None:
    """With every submodule already imported (and so bound on the package), the public names still
    are the functions and classes: no submodule shares a public name."""
    assert not set(SUBMODULES) & set(NAMES)
    status, out, err = forked["every submodule first"]
    assert status == 0 and out.endswith("OK\n"), err[-3000:]


def test_readme_import_lines_run_verbatim(forked: dict[str, tuple[int, str, str]]) -> None:
    assert IMPORT_LINES
    status, out, err = forked["readme import lines"]
    assert status == 0 and out.endswith("OK\n"), err[-3000:]


def test_export_and_reader_package_do_not_import_torch() -> None:
    """`export` reads and writes the format through robowds.reader.format / robowds.reader.manifest; importing those
    (and the reader package itself) must not import torch (an export machine may not have it)."""
    code = ("import sys, robowds.reader, robowds.reader.format, robowds.reader.manifest, robowds.export.cli.main, robowds.export.job.build, robowds.export.check.verify\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    assert run_fresh(code) == "[]\n"
