"""Bad input never gives a traceback: one table of bad stores, configs and output folders, each run
through the real CLI (`validate` where the store is at fault, always `export`).

For every case: a non-zero exit, exactly one `robowds CMD: error:` message naming the file, episode or
field at fault and a `fix:`, no "Traceback", and nothing published in OUT (no manifest, no wids index,
no shard). Cases that need a small or read-only file system mount a tmpfs (root or CAP_SYS_ADMIN,
as on the CI machines); where mounting is not allowed they are skipped with the reason.

To add a case: append a `BadInput` to `CASES` (`make` turns a fresh copy of a valid 3-episode
synthetic store into the bad input; `needs` names fixtures such as `tmpfs`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store

from corrupt import edit_yaml, rewrite_table

EP = "ep_0000"


@dataclass(frozen=True)
class Case:
    """One prepared bad input: the command line's paths and options."""

    store: Path
    out: Path
    options: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class BadInput:
    id: str
    make: Callable[[Path, Path, Path], Case]  # (store copy, out, scratch dir) -> the bad input
    names: tuple[str, ...]  # what the error must name (file, episode, field) and say, each verbatim
    validate: bool = False  # the store itself is at fault: `robowds validate` must refuse it too
    needs: str | None = None  # "tmpfs": a small tmpfs is mounted at scratch/fs (skipped where impossible)


# ---------------------------------------------------------------------------------------- the faults

def _fields_as_list(store: Path, out: Path, scratch: Path) -> Case:
    edit_yaml(store, lambda doc: doc.update(fields=[{name: decl} for name, decl in doc["fields"].items()]))
    return Case(store, out)


def _yaml_not_text(store: Path, out: Path, scratch: Path) -> Case:
    (store / "store.yaml").write_bytes(bytes(range(128, 256)))
    return Case(store, out)


def _yaml_folder(store: Path, out: Path, scratch: Path) -> Case:
    (store / "store.yaml").unlink()
    (store / "store.yaml").mkdir()
    return Case(store, out)


def _clock_list(store: Path, out: Path, scratch: Path) -> Case:
    edit_yaml(store, lambda doc: doc.update(clock=["joints"]))
    return Case(store, out)


def _fps_word(store: Path, out: Path, scratch: Path) -> Case:
    edit_yaml(store, lambda doc: doc["fields"]["joints"].update(fps="fast"))
    return Case(store, out)


def _max_gap_infinite(store: Path, out: Path, scratch: Path) -> Case:
    edit_yaml(store, lambda doc: doc["fields"]["joints"].update(max_gap_s=float("inf")))
    return Case(store, out)


def _invalid_utf8(column: str, row: int, raw: bytes) -> Callable[[Path, Path, Path], Case]:
    """A string column with bytes that are not UTF-8 (pyarrow writes them unchecked through a view)."""
    table = {"task": "text.parquet", "episode_id": "text.parquet"}[column]

    def make(store: Path, out: Path, scratch: Path) -> Case:
        def change(t: pa.Table) -> pa.Table:
            values = [v.encode() for v in t.column(column).to_pylist()]
            values[row] = raw
            bad = pa.array(values, pa.binary()).view(pa.string())
            return t.set_column(t.schema.get_field_index(column), column, bad)
        rewrite_table(store, table, change)
        return Case(store, out)
    return make


def _null_episode_id(store: Path, out: Path, scratch: Path) -> Case:
    def change(t: pa.Table) -> pa.Table:
        return t.set_column(0, "episode_id", pa.array([None, *t.column("episode_id").to_pylist()[1:]], pa.string()))
    rewrite_table(store, "text.parquet", change)
    return Case(store, out)


def _text_like_a_path(store: Path, out: Path, scratch: Path) -> Case:
    """A text column whose first value ends in .png is read as image paths unless declared text."""
    edit_yaml(store, lambda doc: doc["fields"].pop("task"))
    rewrite_table(store, "text.parquet", lambda t: t.set_column(
        1, "task", pa.array(["draw the logo.png", *t.column("task").to_pylist()[1:]])))
    return Case(store, out)


def _extent_as_text(store: Path, out: Path, scratch: Path) -> Case:
    rewrite_table(store, "text.parquet", lambda t: t.append_column("start_s", pa.array(["0.5", "soon", "1"])))
    return Case(store, out)


def _split_as_number(store: Path, out: Path, scratch: Path) -> Case:
    rewrite_table(store, "text.parquet", lambda t: t.append_column("split", pa.array([1, 2, 1])))
    return Case(store, out)


def _manifest_not_text(store: Path, out: Path, scratch: Path) -> Case:
    out.mkdir()
    (out / "manifest.json").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    return Case(store, out)


def _set_not_yaml(store: Path, out: Path, scratch: Path) -> Case:
    return Case(store, out, ["--set", "fps=[1,"])


def _config_binary(store: Path, out: Path, scratch: Path) -> Case:
    config = scratch / "export.yaml"
    config.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    return Case(store, out, ["--config", str(config)])


def _config_folder(store: Path, out: Path, scratch: Path) -> Case:
    (scratch / "conf.d").mkdir()
    return Case(store, out, ["--config", str(scratch / "conf.d")])


def _video_keys_on_series(store: Path, out: Path, scratch: Path) -> Case:
    return Case(store, out, ["--set", "streams.joints.encoding=mp4", "--set", "streams.joints.resize=[8, 8]"])


def _window_keys_on_text(store: Path, out: Path, scratch: Path) -> Case:
    return Case(store, out, ["--set", "streams.task.rate_hz=5"])


def _out_is_a_file(store: Path, out: Path, scratch: Path) -> Case:
    out.write_text("my notes")
    return Case(store, out)


def _out_under_a_file(store: Path, out: Path, scratch: Path) -> Case:
    (scratch / "notes.txt").write_text("my notes")
    return Case(store, scratch / "notes.txt" / "out")


def _out_read_only(store: Path, out: Path, scratch: Path) -> Case:
    subprocess.run(["mount", "-o", "remount,ro", str(scratch / "fs")], check=True)
    return Case(store, scratch / "fs" / "out")


def _series_as_json_text(store: Path, out: Path, scratch: Path) -> Case:
    """joints (names declared) written as JSON strings: a common pandas accident."""
    import json as _json
    rewrite_table(store, "trajectories.parquet", lambda t: t.set_column(
        t.schema.get_field_index("joints"), "joints",
        pa.array([_json.dumps(v) for v in t.column("joints").to_pylist()], pa.string())))
    return Case(store, out)


def _too_few_names(store: Path, out: Path, scratch: Path) -> Case:
    edit_yaml(store, lambda doc: doc["fields"]["joints"].update(names=["a", "b", "c"]))
    return Case(store, out)


def _corrupt_png(store: Path, out: Path, scratch: Path) -> Case:
    png = store / "media" / "overview" / "ep_0000.png"
    png.write_bytes(png.read_bytes()[:60])  # PNG signature intact, data gone
    return Case(store, out)


def _end_far_away(store: Path, out: Path, scratch: Path) -> Case:
    rewrite_table(store, "text.parquet", lambda t: t.append_column(
        "end_s", pa.array([1e7] + [None] * (len(t) - 1), pa.float64())))
    return Case(store, out)


def _huge_fps(store: Path, out: Path, scratch: Path) -> Case:
    return Case(store, out, ["--set", "fps=1e5"])


# Each episode's planned size (~1.4 MB at most, a lower bound) fits, so export's free-space check before
# an episode lets it start; the whole export (~4 MB staged) does not: the disk fills while writing.
DISK_FULL_SIZE = "2m"


def _out_disk_full(store: Path, out: Path, scratch: Path) -> Case:
    return Case(store, scratch / "fs" / "out")


CASES: list[BadInput] = [
    BadInput("store.yaml fields is a list", _fields_as_list,
             ("store.yaml: fields must be a mapping", "got a list"), validate=True),
    BadInput("store.yaml is not text", _yaml_not_text, ("store.yaml is not a YAML text file", "byte 0"),
             validate=True),
    BadInput("store.yaml is a folder", _yaml_folder, ("store.yaml cannot be read: Is a directory",), validate=True),
    BadInput("store.yaml clock is a list", _clock_list, ("store.yaml: clock must be a field name",), validate=True),
    BadInput("store.yaml fps is a word", _fps_word, ("field 'joints'", "fps must be a positive number, got 'fast'"),
             validate=True),
    BadInput("store.yaml max_gap_s is infinite", _max_gap_infinite,
             ("field 'joints'", "max_gap_s must be a positive number, got inf"), validate=True),
    BadInput("text column not UTF-8", _invalid_utf8("task", 0, b"pick \xff\xfe up"),
             (f"episode {EP!r}", "field 'task'", "not valid UTF-8", "byte 5"), validate=True),
    BadInput("episode id not UTF-8", _invalid_utf8("episode_id", 2, b"ep_\xc3\x28"),
             ("table text.parquet", "episode_id of row 2 is not valid UTF-8"), validate=True),
    BadInput("text column looks like a path", _text_like_a_path,
             (f"episode {EP!r}", "field 'task'", "'draw the logo.png'", "declare `kind: text`"), validate=True),
    BadInput("start_s is text", _extent_as_text,
             ("reserved column start_s in table text.parquet must hold seconds (float64), not string",), validate=True),
    BadInput("episode id is null", _null_episode_id, ("table text.parquet: episode_id of row 0 is null",),
             validate=True),
    BadInput("split is a number", _split_as_number,
             ("reserved column split in table text.parquet must hold split names (string), not int64",),
             validate=True),
    BadInput("OUT has a binary manifest.json", _manifest_not_text,
             ("manifest.json is not valid JSON", "byte 0x89", "move")),
    BadInput("--set value not YAML", _set_not_yaml, ("--set fps=[1,", "not valid YAML")),
    BadInput("--config is binary", _config_binary, ("cannot read config", "export.yaml", "not a YAML text file")),
    BadInput("--config is a folder", _config_folder, ("cannot read config", "conf.d")),
    BadInput("video keys on a time series", _video_keys_on_series,
             ("streams.joints", "['encoding', 'resize']", "'joints' is a time series")),
    BadInput("window keys on a text field", _window_keys_on_text, ("streams.task", "['rate_hz']", "'task' is a text")),
    BadInput("OUT is a file", _out_is_a_file, ("output folder", "is a file")),
    BadInput("OUT is under a file", _out_under_a_file, ("notes.txt is a file, not a folder",)),
    BadInput("OUT is read-only", _out_read_only, ("output folder", "read-only file system"), needs="tmpfs"),
    # stopped by the free-space check before an episode, or by ENOSPC while writing (the message of
    # ENOSPC itself is checked in test_os_error_messages): either way one error and nothing published
    BadInput("OUT disk is full", _out_disk_full, ("disk", "free", ".robowds-work"),
             needs="tmpfs"),
]
# Cases of the other items of issue 10 (each also has its own test file with exact messages)
CASES += [
    BadInput("time series stored as JSON text", _series_as_json_text,
             ("field 'joints'", "which only a time series has", "not a JSON string"), validate=True),
    BadInput("3 names for 7 columns", _too_few_names,
             ("episode 'ep_0000', field 'joints'", "declares 3 names but has 7 value columns"), validate=True),
    BadInput("PNG that does not decode", _corrupt_png,
             ("episode 'ep_0000', field 'overview'", "media/overview/ep_0000.png", "cannot be decoded"),
             validate=True),
    BadInput("end_s far beyond the data", _end_far_away, ("episode 'ep_0000'", "1e+07 s", "end_s"), validate=True),
    BadInput("fps 1e5", _huge_fps, ("fps",)),
]


# ------------------------------------------------------------------------------------------ harness

@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_store(tmp_path_factory.mktemp("pristine") / "store", episodes=3, seed=0).root


def mount_tmpfs(path: Path, size: str) -> None:
    """Mount a tmpfs of `size` at `path`, or skip the test (not root, no CAP_SYS_ADMIN, no mount)."""
    path.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("no mount command here")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    yield tmp_path / "scratch"
    fs = tmp_path / "scratch" / "fs"
    if fs.is_dir() and os.path.ismount(fs):
        subprocess.run(["umount", str(fs)], check=True)


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int | None, str, str]:
    """The CLI in-process, as a user runs it; an escaping exception counts as the traceback it prints."""
    try:
        rc: int | None = main(argv)
    except BaseException:  # noqa: BLE001 - SystemExit included: argparse errors are not ours to test here
        rc, crash = None, traceback.format_exc()
    else:
        crash = ""
    captured = capsys.readouterr()
    return rc, captured.out, captured.err + crash


def published(out: Path) -> dict[str, bytes]:
    """What a reader could see in OUT: manifest, wids indexes, shards (the work folder is not published)."""
    if not out.is_dir():
        return {}
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and ".robowds-work" not in p.parts
            and (p.name == "manifest.json" or p.name.endswith(".wids.json") or p.suffix == ".tar")}


def prepare(case: BadInput, pristine: Path, scratch: Path) -> Case:
    scratch.mkdir(parents=True)
    if case.needs == "tmpfs":
        mount_tmpfs(scratch / "fs", DISK_FULL_SIZE)
    store = scratch / "store"
    shutil.copytree(pristine, store)
    return case.make(store, scratch / "out", scratch)


def check_one_error(text: str, command: str, names: tuple[str, ...]) -> None:
    assert "Traceback" not in text, text
    assert text.startswith(f"robowds {command}: error: "), text
    assert text.count(f"robowds {command}: error:") == 1 and text.count("\n  fix: ") == 1, text
    for name in names:
        assert name in text, f"{name!r} not in:\n{text}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_clear_error(case: BadInput, pristine: Path, scratch: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    bad = prepare(case, pristine, scratch)
    if case.validate:
        rc, stdout, err = run_cli(["validate", str(bad.store)], capsys)
        assert "Traceback" not in stdout + err, err
        assert rc == 1, stdout + err
        lines = [line for line in stdout.splitlines() if line.lstrip().startswith("error: ")]
        assert lines and "(fix: " in lines[0], stdout
        for name in case.names:
            assert name in lines[0], f"{name!r} not in:\n{lines[0]}"
        assert "NOT exportable" in stdout
    before = published(bad.out)  # a user's own (bad) manifest.json stays as it was
    rc, stdout, err = run_cli(["export", str(bad.store), str(bad.out), "--quiet", "--workers", "1", *bad.options],
                              capsys)
    assert rc == 2, stdout + err
    check_one_error(err, "export", case.names)
    assert published(bad.out) == before


@pytest.mark.parametrize("case", [c for c in CASES if c.id in ("--config is binary", "text column not UTF-8")],
                         ids=lambda c: c.id)
def test_bad_input_in_a_real_process_with_workers(case: BadInput, pristine: Path, scratch: Path) -> None:
    """The same, as a separate process with a worker pool (errors come back from the workers)."""
    bad = prepare(case, pristine, scratch)
    done = subprocess.run([sys.executable, "-m", "robowds.export", str(bad.store), str(bad.out), "--quiet",
                           "--workers", "2", *bad.options], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    check_one_error(done.stderr, "export", case.names)
    assert published(bad.out) == {}


def tree_bytes(out: Path) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("workers", [1, 2])
def test_disk_full_then_rerun_after_freeing_space_is_byte_identical(
        workers: int, pristine: Path, scratch: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scratch.mkdir()
    fs = scratch / "fs"
    mount_tmpfs(fs, DISK_FULL_SIZE)
    argv = ["--quiet", "--workers", str(workers)]
    rc, _, err = run_cli(["export", str(pristine), str(fs / "out"), *argv], capsys)
    assert rc == 2
    check_one_error(err, "export", ("disk", "free", f"{fs / 'out'}/.robowds-work"))
    assert published(fs / "out") == {}
    subprocess.run(["mount", "-o", "remount,size=64m", str(fs)], check=True)  # space freed
    assert run_cli(["export", str(pristine), str(fs / "out"), *argv], capsys)[0] == 0
    assert run_cli(["export", str(pristine), str(tmp_path / "ref"), *argv], capsys)[0] == 0
    assert tree_bytes(fs / "out") == tree_bytes(tmp_path / "ref")


def test_failed_export_says_how_to_remove_its_work_folder(pristine: Path, scratch: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """An export that stops on bad episodes leaves its staging (and perhaps `*.tmp-PID` files) in the
    work folder: the message says a re-run resumes from it and how to delete it."""
    bad = prepare(CASES[[c.id for c in CASES].index("text column not UTF-8")], pristine, scratch)
    rc, _, err = run_cli(["export", str(bad.store), str(bad.out), "--quiet", "--workers", "1"], capsys)
    assert rc == 2
    work = bad.out.resolve() / ".robowds-work"
    assert work.is_dir()
    check_one_error(err, "export", (f"the unfinished export in {work} (", "is resumed by re-running the same command",
                                    "delete that folder to start over"))


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_binary_manifest_is_one_error_for_verify_and_inspect(command: str, pristine: Path, scratch: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    bad = prepare(CASES[[c.id for c in CASES].index("OUT has a binary manifest.json")], pristine, scratch)
    rc, _, err = run_cli([command, str(bad.out)], capsys)
    assert rc == 2
    check_one_error(err, command, (f"{bad.out / 'manifest.json'} is not valid JSON", "byte 0x89",
                                   "export again into a new folder"))


def test_any_other_os_error_on_a_user_path_is_one_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's last resort: an OSError no command turned into its own message (here matplotlib
    writing `--png` into a folder that does not exist) is still one message, not a traceback."""
    from exports import export_synthetic
    out = export_synthetic(tmp_path, 2, 0)
    png = tmp_path / "no" / "such" / "folder" / "w.png"
    rc, stdout, err = run_cli(["inspect", str(out), "--png", str(png)], capsys)
    assert rc == 2
    check_one_error(err, "inspect", (f"{png} does not exist (No such file or directory)", "fix: check the path"))


@pytest.mark.parametrize("code, filename, expected", [
    (13, "{out}/.robowds-work/ep-000001.bin", "no permission to write output folder {out} "
                                              "({out}/.robowds-work/ep-000001.bin: Permission denied)"),
    (2, "{store}/text.parquet", "{store}/text.parquet does not exist (No such file or directory)"),
    (28, None, "disk full while writing into output folder {out} (No space left on device)"),
], ids=["EACCES in OUT", "ENOENT in the store", "ENOSPC without a path"])
def test_os_errors_name_the_right_folder(code: int, filename: str | None, expected: str, tmp_path: Path) -> None:
    """Mapping of the errors root cannot provoke here (root may write anywhere): an error on a store
    file during the export is not blamed on the output folder."""
    from robowds.export.output.oserrors import os_error
    out, store = tmp_path / "out", tmp_path / "store"
    names = {"out": out, "store": store}
    exc = OSError(code, os.strerror(code), *([filename.format(**names)] if filename else []))
    error = os_error(exc, "export", out, out / ".robowds-work")
    assert error.message == expected.format(**names)
    assert error.hint


def test_demo_never_deletes_a_folder_it_did_not_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`robowds demo --dir D` used to `rmtree(D)` whatever D held (`--dir ~` would take the home folder)."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    rc, _, err = run_cli(["demo", "--dir", str(mine), "--episodes", "1"], capsys)
    assert rc == 2
    check_one_error(err, "demo", (f"demo folder {mine} exists and holds more than a previous demo",))
    assert (mine / "thesis.tex").read_text() == "years of work"


@pytest.mark.parametrize("argv, names", [
    (["verify", "{out}", "--store", "{tmp}/nope"], ("store {tmp}/nope is not a folder",)),
    (["verify", "{out}", "--store", "{tmp}/store", "--check-windows", "-1"], ("--check-windows must be >= 0, got -1",)),
    (["demo", "--dir", "{tmp}/demo", "--episodes", "0"], ("--episodes and --workers must be >= 1, got 0 and 2",)),
    (["export", "{tmp}/store", "{tmp}/o", "--workers", "0"], ("--workers must be >= 1, got 0",)),
], ids=["verify --store missing", "verify --check-windows -1", "demo --episodes 0", "export --workers 0"])
def test_bad_command_line_numbers_and_paths(argv: list[str], names: tuple[str, ...], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from exports import export_synthetic
    out = export_synthetic(tmp_path, 2, 0)
    fill = {"out": out, "tmp": tmp_path}
    rc, _, err = run_cli([a.format(**fill) for a in argv], capsys)
    assert rc == 2
    check_one_error(err, argv[0], tuple(n.format(**fill) for n in names))


def test_inspect_of_a_damaged_shard_is_one_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from exports import export_synthetic
    out = export_synthetic(tmp_path, 2, 0)
    shard = json.loads((out / "manifest.json").read_text())["splits"]["train"]["shards"][0]
    data = bytearray((out / shard["path"]).read_bytes())
    from offsets import shard_offsets
    at = shard_offsets(out, shard)[3]
    data[at + 100] ^= 0xFF  # inside the tar header of the sample's first member: its checksum fails
    (out / shard["path"]).write_bytes(bytes(data))
    rc, _, err = run_cli(["inspect", str(out), "--index", "3"], capsys)
    assert rc == 2
    check_one_error(err, "inspect", (f"shard {shard['path']}: bad tar header at byte {at}: checksum mismatch",
                                     f"robowds verify {out}"))
    assert err.count(shard["path"]) == 1
