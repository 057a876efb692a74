"""Every code block of the README and of docs/*.md that can run, runs (issue 9 item 9, issue 12 item 4).

A fenced block tagged `python`, `yaml` or `bash` is run here unless the line before it is an HTML
comment `<!-- not run: why -->`; untagged blocks are printed output. So a new README block is
tested by default, and a block that stops working fails the suite instead of a user's first hour.
Blocks are named `file:line` (README.md:31, docs/reader.md:5).

- python: executed in a fresh interpreter in an empty folder that holds a small export at `OUT/`;
- yaml: a block with `fields:` is a `store.yaml`, checked by validating and exporting a store that
  has exactly the fields it declares; any other block is an export config, loaded with
  `load_config` and exported from that store;
- bash: each command line is run with `/tmp/` paths moved into the test's folder (`make demo` runs
  `robowds demo`).
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from fork_runner import ForkRunner
from videos import write_video

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FENCE = re.compile(r"(?:^<!-- not run: (?P<skip>[^>]*) -->\n)?^```(?P<lang>python|yaml|bash)\n(?P<code>.*?)^```",
                   re.S | re.M)


DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def readme_blocks(lang: str) -> list[tuple[str, str, str | None]]:
    """("file:line", code, reason not run or None) of every `lang` block in README.md and docs/*.md."""
    found = []
    for path in DOC_FILES:
        text = path.read_text()
        found += [(f"{path.relative_to(ROOT)}:{text[:m.start('code')].count(chr(10)) + 1}", m.group("code"),
                   m.group("skip")) for m in FENCE.finditer(text) if m.group("lang") == lang]
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    # TMPDIR stays the system's: DataLoader workers put AF_UNIX sockets there, and a pytest tmp_path
    # under xdist is too long for a socket path (108 bytes). A documented `torchrun` gets a free port
    # (PET_MASTER_PORT is torchrun's --master-port): its default 29500 is shared by every run on the machine.
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PET_MASTER_PORT": str(_free_port())}


def _run(cmd: list[str] | str, cwd: Path, shell: bool = False, timeout: int = 240) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), shell=shell, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def test_every_runnable_block_is_found() -> None:
    """The parser sees the blocks it should (a renamed fence must not silently skip them all), in the
    README and in the docs."""
    counts = {lang: len(readme_blocks(lang)) for lang in ("python", "yaml", "bash")}
    assert counts["python"] >= 2 and counts["yaml"] >= 3 and counts["bash"] >= 2, counts
    files = {line.split(":")[0] for lang in counts for line, _, _ in readme_blocks(lang)}
    assert {"README.md", "docs/reader.md", "docs/store.md", "docs/export-config.md"} <= files, files
    for lang in counts:
        for line, _, skip in readme_blocks(lang):
            assert skip is None or len(skip.strip()) > 10, f"{line}: say why the block is not run"


# --- python ---

@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a small export at OUT/ (what the README's reader snippets read)."""
    from robowds.export.cli.main import main
    from robowds.export.cli.synth import write_synthetic_store

    root = tmp_path_factory.mktemp("readme")
    write_synthetic_store(root / "store", episodes=4, seed=0)
    assert main(["export", str(root / "store"), str(root / "OUT"), "--quiet", "--workers", "1"]) == 0
    return root


PRELOAD = "import numpy, torch, torch.utils.data, robowds.reader.dataset, robowds.reader.loader, robowds.export.cli.main"


@pytest.fixture(scope="module")
def forks() -> Iterator[ForkRunner]:
    """Each block runs as `python block.py` would, in a fork of one interpreter that imported torch and
    robowds once (tests/fork_runner.py), instead of a fresh interpreter per block."""
    runner = ForkRunner(PRELOAD, _env())
    yield runner
    runner.close()


@pytest.mark.parametrize("line,code,skip", readme_blocks("python"), ids=lambda v: v if isinstance(v, str) and ":" in v and "\n" not in v else "")
def test_python_block_runs(line: str, code: str, skip: str | None, exported: Path, tmp_path: Path,
                           forks: ForkRunner) -> None:
    if skip:
        pytest.skip(skip)
    work = tmp_path / "work"
    work.mkdir()
    (work / "OUT").symlink_to(exported / "OUT")
    (work / "block.py").write_text(code)
    status, out, err = forks.run(work / "block.py", work)
    assert status == 0, f"{line}: exit {status}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"


def test_a_failing_block_is_reported(forks: ForkRunner, tmp_path: Path) -> None:
    """The fork runner gives a block's exit status and output, as a fresh interpreter would."""
    (tmp_path / "ok.py").write_text("import sys\nprint('out', sys.argv[0].endswith('ok.py'))\nprint('err', file=sys.stderr)\n")
    assert forks.run(tmp_path / "ok.py", tmp_path) == (0, "out True\n", "err\n")
    (tmp_path / "bad.py").write_text("print('before')\nraise KeyError('nope')\n")
    status, out, err = forks.run(tmp_path / "bad.py", tmp_path)
    assert status == 1 and out == "before\n" and "KeyError: 'nope'" in err
    (tmp_path / "exit.py").write_text("import sys\nsys.exit(3)\n")
    assert forks.run(tmp_path / "exit.py", tmp_path)[0] == 3


# --- yaml ---

def _store_for(declaration: dict, root: Path) -> Path:
    """A 2-episode store with exactly the fields a README store.yaml declares (shapes from its names),
    plus the fields the README's config examples name."""
    root.mkdir(parents=True)
    fields = dict(declaration["fields"])
    fields.setdefault("imu", {"names": ["ax", "ay", "az"]})
    fields.setdefault("overview", {"kind": "image"})
    rows, rng = [], np.random.default_rng(0)
    for e in range(2):
        row: dict = {"episode_id": f"ep{e}"}
        for name, decl in fields.items():
            kind = decl.get("kind", "timeseries")
            if kind == "video":
                path = f"media/{name}_{e}.mp4"
                write_video(root / path, [k * 1000 // int(decl.get("fps", 10)) for k in range(40)], size=(64, 48),
                            rate=int(decl.get("fps", 10)))
                row[name] = path
            elif kind == "text":
                row[name] = f"episode {e} notes.png"  # ends in .png: the declaration keeps it text
            elif kind == "image":
                from PIL import Image
                path = root / "media" / f"{name}_{e}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(path)
                row[name] = f"media/{path.name}"
            else:
                dims = len(decl.get("names", [0] * (4 if decl.get("interpolation") == "slerp" else 2)))
                rate = 200.0 if name == "imu" else 50.0
                t = np.arange(int(3 * rate)) / rate  # 3 s
                values = rng.normal(size=(len(t), dims))
                if decl.get("interpolation") == "slerp":
                    values /= np.linalg.norm(values, axis=1, keepdims=True)
                elif decl.get("interpolation") == "hold":
                    values = np.round(np.abs(values))
                row[name] = np.column_stack([t, values]).tolist()
        rows.append(row)
    pq.write_table(pa.Table.from_pylist(rows), root / "episodes.parquet")
    (root / "store.yaml").write_text(yaml.safe_dump(declaration))
    return root


def _store_yaml() -> dict:
    blocks = [yaml.safe_load(code) for _, code, skip in readme_blocks("yaml") if not skip]
    (declaration,) = [b for b in blocks if "fields" in b]
    return declaration


def test_store_yaml_block_declares_an_exportable_store(tmp_path: Path) -> None:
    from robowds.export.cli.main import main
    from robowds.export.store.validate import validate_store

    store = _store_for(_store_yaml(), tmp_path / "store")
    report = validate_store(store)
    assert report.exportable, report.render()
    for name, decl in _store_yaml()["fields"].items():
        assert report.schema.fields[name].kind == decl.get("kind", "timeseries"), name
        assert report.schema.fields[name].declared
    assert main(["export", str(store), str(tmp_path / "out"), "--quiet", "--workers", "1"]) == 0


@pytest.mark.parametrize("line,code,skip", [b for b in readme_blocks("yaml") if "fields" not in yaml.safe_load(b[1])],
                         ids=lambda v: v if isinstance(v, str) and ":" in v and "\n" not in v else "")
def test_config_block_loads_and_exports(line: str, code: str, skip: str | None, tmp_path: Path) -> None:
    from robowds.export.cli.main import main

    if skip:
        pytest.skip(skip)
    store = _store_for(_store_yaml(), tmp_path / "store")
    config = tmp_path / "config.yaml"
    config.write_text(code)
    assert main(["export", str(store), str(tmp_path / "out"), "--config", str(config), "--quiet",
                 "--workers", "1"]) == 0, line


# --- bash ---

def _commands(code: str) -> list[str]:
    lines = [ln.split("#", 1)[0].strip() if not ln.lstrip().startswith("#") else "" for ln in code.splitlines()]
    return [ln for ln in lines if ln]


SHELL_SYNTAX = set("|&;<>()$`*?~'\"\\")  # a command with any of these runs in a shell, as written


def _script_for(command: str, folder: Path) -> Path | None:
    """A Python script that runs `robowds ARGS` or `python scripts/X.py ARGS` as the command line does,
    for the fork runner (~2 s of interpreter start and imports saved per command, ~30 commands in the
    docs); None for anything else or anything a shell must read (pipes, quotes, variables)."""
    if SHELL_SYNTAX & set(command):
        return None
    argv = command.split()
    if argv[0] == "robowds":
        body = f"from robowds.export.cli.main import main\nsys.argv = {argv!r}\nsys.exit(main({argv[1:]!r}))"
    elif argv[0] == "python" and len(argv) > 1 and argv[1].endswith(".py"):
        body = f"import runpy\nsys.argv = {argv[1:]!r}\nrunpy.run_path({argv[1]!r}, run_name='__main__')"
    else:
        return None
    script = folder / "command.py"
    # the guard: a spawned worker (an export's pool) imports this file again as `__mp_main__`
    script.write_text("import sys\nif __name__ == '__main__':\n" + "".join(f"    {ln}\n" for ln in body.splitlines()))
    return script


@pytest.mark.parametrize("line,code,skip", readme_blocks("bash"), ids=lambda v: v if isinstance(v, str) and ":" in v and "\n" not in v else "")
@pytest.mark.slow
def test_bash_block_runs(line: str, code: str, skip: str | None, tmp_path: Path, forks: ForkRunner) -> None:
    if skip:
        pytest.skip(skip)
    logs = tmp_path / ".logs"
    logs.mkdir()
    for command in _commands(code):
        command = command.replace("/tmp/", f"{tmp_path}/")
        if command.startswith("make test"):
            continue  # this very suite
        if command.startswith("make demo"):
            command = f"robowds demo --dir {shlex.quote(str(tmp_path / 'demo'))}"
        assert not command.startswith("make "), f"{line}: {command!r} would recurse into make"
        in_repo = "scripts/" in command or "tests/data/" in command  # paths relative to the repository
        script = _script_for(command, logs)
        if script is None:
            _run(command, ROOT if in_repo else tmp_path, shell=True, timeout=300)
            continue
        status, out, err = forks.run(script, ROOT if in_repo else tmp_path, logs)
        assert status == 0, f"{line}: {command}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
