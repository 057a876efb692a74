"""The package's shape holds: no import circles, each export/ sub-package imports only the layers
below it, the pure core touches no I/O library, each converter format is a folder that imports no other
format (and the shared conversion driver imports none), and pyproject installs every sub-package.

Imports are read from the source with `ast` (every `import`/`from ... import`, inside functions and
`if TYPE_CHECKING:` blocks too: a circle hidden behind a lazy import is still a circle a reader has to
untangle), so the test needs no import side effects and names the offending file and line.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"robowds.export": ROOT / "export", "robowds.reader": ROOT / "reader"}

# export/ sub-packages, lowest first: a module may import its own layer and the layers before it.
# robowds.export (the package root: __version__, errors) and robowds.reader sit below all of them.
LAYERS = ["core", "media", "store", "executors", "output", "job", "convert", "check", "report", "cli"]
# (executors and output know nothing of windows or configs: the job drives both; convert runs on executors;
# report reads a finished export: the manifest, the side files the job wrote, the store)
# The format sub-packages of convert/ (robowds.export.convert.<format>) and the CLI's options for each
# (robowds.export.cli.convert.<format>): a new format is one new folder in each, touching no other.
FORMAT_PARENTS = ("robowds.export.convert", "robowds.export.cli.convert")
IO_LIBRARIES = {"av", "pyarrow", "PIL", "tqdm", "fsspec", "torch", "yaml", "msgpack", "subprocess", "shutil"}


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of both packages (`pkg.__init__` is named `pkg`)."""
    found = {}
    for package, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


MODULES = module_files()


def imports_of(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file; `from pkg import sub` counts as `pkg.sub`
    when sub is a module, else as `pkg`. Relative imports are resolved against the module's package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.append((full if full in MODULES else base, node.lineno))
    return out


def internal_graph() -> dict[str, list[tuple[str, int]]]:
    """module -> [(internal module it imports, line)]. A name that is not a module (`from a.b import
    f`) is an edge to the nearest enclosing module or package that exists (`a.b`)."""
    graph: dict[str, list[tuple[str, int]]] = {}
    for name, path in MODULES.items():
        edges = []
        for target, line in imports_of(name, path):
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.append((target, line))
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, list[tuple[str, int]]]) -> list[str] | None:
    """One import circle as a list of modules (first == last), or None. Iterative DFS, O(V + E)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    for start in graph:
        if state.get(start):
            continue
        path, stack = [start], [iter(graph[start])]
        state[start] = 1
        while stack:
            step = next(stack[-1], None)
            if step is None:
                state[path.pop()] = 2
                stack.pop()
                continue
            target = step[0]
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if not state.get(target):
                state[target] = 1
                path.append(target)
                stack.append(iter(graph[target]))
    return None


def layer_of(module: str) -> int:
    """Index in LAYERS for robowds.export.<layer>...; -1 for the package root and robowds.reader."""
    parts = module.split(".")
    if parts[:2] == ["robowds", "export"] and len(parts) > 2 and parts[2] in LAYERS:
        return LAYERS.index(parts[2])
    return -1


# The format names: robowds.export.convert's sub-packages.
FORMATS = {name.split(".")[3] for name, path in MODULES.items()
           if name.startswith(FORMAT_PARENTS[0] + ".") and name.count(".") == 3 and path.name == "__init__.py"}


def format_of(module: str) -> str | None:
    """The format whose folder (or CLI module) holds the module, else None."""
    for parent in FORMAT_PARENTS:
        first = module.removeprefix(parent + ".").split(".")[0]
        if module.startswith(parent + ".") and first in FORMATS:
            return first
    return None


def format_crossings(graph: dict[str, list[tuple[str, int]]]) -> list[tuple[str, str, int]]:
    """(module, target, line) for every import that ties formats together: a module of one format's
    folder importing another format's, or the parent package (its `__init__` re-exports formats);
    a module of a parent's shared driver (convert/run.py, ...) importing any format."""
    out = []
    for module, edges in graph.items():
        own = format_of(module)
        for target, line in edges:
            other = format_of(target)
            if own is not None and ((other is not None and other != own) or target in FORMAT_PARENTS):
                out.append((module, target, line))
            elif own is None and module not in FORMAT_PARENTS and other is not None \
                    and any(module.startswith(p + ".") for p in FORMAT_PARENTS):
                out.append((module, target, line))
    return out


def test_the_walk_sees_the_packages() -> None:
    """The walk is not vacuous: it finds both packages' modules and real edges between them."""
    graph = internal_graph()
    assert {"robowds.export.core.resample", "robowds.export.job.run", "robowds.reader.plan"} <= set(graph)
    assert "robowds.reader.format" in {target for target, _ in graph["robowds.export.job.build"]}
    assert "robowds.export.core.resample" in {target for target, _ in graph["robowds.export.store.validate"]}
    assert FORMATS == {"lerobot", "hdf5", "rlds", "rosbag", "clips"}
    assert {f"robowds.export.cli.convert.{f}" for f in FORMATS} <= set(graph)


def test_no_import_circles() -> None:
    cycle = find_cycle(internal_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_one() -> None:
    """The finder itself: a planted two-module circle (the old job <-> report shape) is reported."""
    graph = {"a.job": [("a.report", 1)], "a.report": [("a.job", 9)], "a.core": []}
    assert find_cycle(graph) == ["a.job", "a.report", "a.job"]
    assert find_cycle({"a": [("b", 1)], "b": []}) is None


def test_each_layer_imports_only_layers_below() -> None:
    problems = []
    for module, edges in internal_graph().items():
        for target, line in edges:
            if layer_of(target) > layer_of(module) >= 0 or (layer_of(module) < 0 and layer_of(target) >= 0
                                                             and module != "robowds.export.__main__"):
                problems.append(f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}")
    assert not problems, "\n".join(problems)


def test_formats_import_no_other_format() -> None:
    """A format's folder may import its own modules, the shared driver (convert/run.py, episode_store.py,
    store_writer.py) and the layers below; the driver imports no format. So formats never tie up."""
    problems = [f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}"
                for module, target, line in format_crossings(internal_graph())]
    assert not problems, "\n".join(problems)


def test_format_crossings_are_found() -> None:
    """The rule itself, on the real format names: each kind of crossing is reported, an own import is not."""
    c, cli = "robowds.export.convert", "robowds.export.cli.convert"
    graph = {f"{cli}.hdf5": [(f"{c}.hdf5", 8), (f"{c}.rlds.records", 9)],
             f"{c}.hdf5.plan": [(f"{c}.hdf5.layout", 1), (f"{c}.rosbag.mapping", 2), (f"{c}.episode_store", 3)],
             f"{c}.rlds": [(c, 4)], f"{c}.run": [(f"{c}.clips.labels", 5), (f"{c}.store_writer", 6)],
             c: [(f"{c}.lerobot", 7)]}
    assert format_crossings(graph) == [(f"{cli}.hdf5", f"{c}.rlds.records", 9),
                                       (f"{c}.hdf5.plan", f"{c}.rosbag.mapping", 2), (f"{c}.rlds", c, 4),
                                       (f"{c}.run", f"{c}.clips.labels", 5)]


def test_core_is_pure() -> None:
    """The core computes; media, files and progress bars belong to the layers above it."""
    problems = []
    for module, path in MODULES.items():
        if layer_of(module) == 0:
            for target, line in imports_of(module, path):
                if target.split(".")[0] in IO_LIBRARIES or target.startswith("robowds.reader"):
                    problems.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("package", sorted(FOLDERS))
def test_pyproject_installs_every_sub_package(package: str) -> None:
    """A sub-package missing from pyproject works in the editable install and is absent from the wheel."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {name for name, path in MODULES.items() if name.startswith(package) and path.name == "__init__.py"}
    assert on_disk and on_disk <= listed, sorted(on_disk - listed)


def test_reader_stands_alone() -> None:
    """`reader/` owns the shard format and manifest schema; `export/` imports them, never the reverse,
    so a training machine needs nothing of the exporter."""
    problems = [f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}"
                for module, edges in internal_graph().items() if module.startswith("robowds.reader")
                for target, line in edges if target.startswith("robowds.export")]
    assert not problems, "\n".join(problems)
