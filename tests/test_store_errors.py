"""A corrupted store gives the right error for each kind of fault.

Each test starts from a valid synthetic store (3 episodes), injects ONE fault by rewriting real Parquet
files or media files, and checks both commands a user runs:

* `robowds validate STORE` exits 1 (0 for repairable faults) and prints the problem on one line that
  names the episode and field and says what is wrong;
* `robowds export STORE OUT` exits 2 with one `robowds export: error:` message (no traceback) naming
  the episode and field, and writes no manifest; repairable faults export and count every repair.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store

from corrupt import (SERIES_F32, edit_yaml, exported_samples, manifest, npy, replace_column, rewrite_cell,
                     rewrite_series, rewrite_table, series)

EP = "ep_0000"  # the episode we corrupt (see test_validate_checks_every_episode_once for the others)
OTHERS = ["ep_0001", "ep_0002"]
TRAJ = "trajectories.parquet"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return write_synthetic_store(tmp_path / "s", episodes=3, seed=0).root


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int | None, str, str]:
    """Run the CLI like a user would; an escaping exception is reported as the traceback it would print."""
    try:
        rc: int | None = main(argv)
    except Exception:  # noqa: BLE001 - a crash is a finding, reported through the assertions
        rc, crash = None, traceback.format_exc()
    else:
        crash = ""
    captured = capsys.readouterr()
    return rc, captured.out, captured.err + crash


def one_line_with(text: str, *parts: str) -> str:
    """The first line of `text` that contains every one of `parts` (fails with the whole text)."""
    for line in text.splitlines():
        if all(p in line for p in parts):
            return line
    raise AssertionError(f"no line contains all of {parts!r} in:\n{text}")


def where(episode: str | None, field: str | None) -> tuple[str, ...]:
    return tuple(s for s in (episode and f"episode {episode!r}", field and f"field {field!r}") if s)


def check_rejected(store: Path, out: Path, capsys: pytest.CaptureFixture[str], phrase: str,
                   episode: str | None = None, field: str | None = None) -> None:
    """validate exits 1 naming the problem; export exits 2 with one clear message and no manifest."""
    rc, stdout, err = run(["validate", str(store)], capsys)
    assert "Traceback" not in stdout + err, err
    assert rc == 1, stdout + err
    one_line_with(stdout, "error: ", phrase, *where(episode, field))
    assert "NOT exportable" in stdout

    rc, stdout, err = run(["export", str(store), str(out), "--quiet"], capsys)
    assert "Traceback" not in stdout + err, err
    assert rc == 2, stdout + err
    assert err.startswith("robowds export: error:"), err
    assert err.count("robowds export: error:") == 1, err
    one_line_with(err, phrase, *where(episode, field))
    assert not (out / "manifest.json").exists()
    assert not list(out.glob("*.wids.json")) and not list(out.glob("*/shard-*.tar"))


def check_exported(store: Path, out: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    rc, stdout, err = run(["export", str(store), str(out), "--quiet", *extra], capsys)
    assert "Traceback" not in stdout + err, err
    assert rc == 0, stdout + err
    return manifest(out)


def with_times(times: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """A series rewrite that replaces column 0 (time) by `times(old times)`."""
    def change(a: np.ndarray) -> np.ndarray:
        a = a.copy()
        a[:, 0] = times(a[:, 0])
        return a
    return change


def swap_rows(*pairs: tuple[int, int]) -> Callable[[np.ndarray], np.ndarray]:
    def change(a: np.ndarray) -> np.ndarray:
        a = a.copy()
        for i, j in pairs:
            a[[i, j]] = a[[j, i]]
        return a
    return change


def nan_rows(*rows: int) -> Callable[[np.ndarray], np.ndarray]:
    def change(a: np.ndarray) -> np.ndarray:
        a = a.copy()
        a[list(rows), 3] = np.nan  # one value column is enough to make the row a missing sample
        return a
    return change


# ------------------------------------------------------------------------------ repairable (warnings)

REPAIRABLE = {
    # fault id: (rewrite of joints of EP, repair kind, count, validate phrase)
    "unsorted": (swap_rows((10, 11), (40, 41), (80, 81)), "unsorted", 3, "3 timestamps out of order"),
    "duplicate_time": (lambda a: np.insert(a, [20, 60], a[[20, 60]], axis=0), "duplicate_time", 2,
                       "2 duplicated timestamps (last row kept)"),
    "nan_rows": (nan_rows(5, 17, 33, 34), "nan_rows", 4, "4 rows with NaN values"),
}


@pytest.mark.parametrize("fault", sorted(REPAIRABLE))
def test_repairable_fault_is_a_warning_and_counted_in_the_report(
        fault: str, store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite, kind, count, phrase = REPAIRABLE[fault]
    rewrite_series(store, TRAJ, "joints", EP, rewrite)

    rc, stdout, err = run(["validate", str(store)], capsys)
    assert rc == 0, stdout + err
    one_line_with(stdout, "warning: ", phrase, *where(EP, "joints"))
    assert "exportable: 0 error(s), 1 warning(s)" in stdout

    report = check_exported(store, tmp_path / "out", capsys)["report"]
    assert report["repairs"] == {"joints": {kind: count}}
    assert report["episodes"]["rejected"] == [] and report["episodes"]["exported"] == 3


def test_duplicate_timestamp_keeps_the_last_row(store: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    joints = series(store, TRAJ, "joints", EP)
    assert joints[10, 0] == pytest.approx(0.2) and joints[0, 0] == 0.0  # grid step 2 of the anchor-0 window
    marked = joints[10].copy()
    marked[1:] = 100.0 + np.arange(joints.shape[1] - 1)
    rewrite_series(store, TRAJ, "joints", EP, lambda a: np.insert(a, 11, marked, axis=0))  # same time, later row

    report = check_exported(store, tmp_path / "out", capsys, "--keep-order")["report"]
    assert report["repairs"] == {"joints": {"duplicate_time": 1}}
    window = npy(exported_samples(tmp_path / "out")[(EP, 0)]["joints.npy"])  # [10, 7] at 10 Hz from t=0
    np.testing.assert_allclose(window[2], marked[1:], rtol=1e-6)
    np.testing.assert_allclose(window[1], joints[5, 1:], rtol=1e-6)  # neighbours untouched


@pytest.mark.parametrize("episode", ["ep_0000", "ep_0001", "ep_0002"])
def test_validate_checks_every_episode_once(episode: str, store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_series(store, TRAJ, "joints", episode, with_times(lambda t: np.full_like(t, 1.5)))
    rc, stdout, err = run(["validate", str(store)], capsys)
    assert rc == 1, stdout + err
    one_line_with(stdout, "error: ", "constant clock", *where(episode, "joints"))
    assert "NOT exportable: 1 error(s), 0 warning(s)" in stdout, stdout


# --------------------------------------------------------------------------------- episode data errors

def ragged(a: np.ndarray) -> list[list[float]]:
    rows = a.tolist()
    rows[5] = rows[5][:-1]
    return rows


DATA_FAULTS = {
    # fault id: (rewrite of joints of EP, phrase the message must contain)
    "constant_timestamps": (with_times(lambda t: np.full_like(t, 1.5)), "constant clock"),
    "all_nan": (lambda a: np.column_stack([a[:, 0], np.full_like(a[:, 1:], np.nan)]), "no valid samples"),
    # an empty list is a stream the episode did not record, not an error: tests/test_missing_streams.py
    "ragged_row": (ragged, "row 5 has 7 columns, row 0 has 8"),
}


@pytest.mark.parametrize("fault", sorted(DATA_FAULTS))
def test_bad_time_series_is_an_error(fault: str, store: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    rewrite, phrase = DATA_FAULTS[fault]
    rewrite_series(store, TRAJ, "joints", EP, rewrite)
    check_rejected(store, tmp_path / "out", capsys, phrase, EP, "joints")


def test_one_sample_stream_is_an_error(store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_series(store, TRAJ, "gripper_cmd", EP, lambda a: a[:1])
    check_rejected(store, tmp_path / "out", capsys, "too short: 1 valid sample(s)", EP, "gripper_cmd")


def test_constant_clock_message_shows_the_time_plainly(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_series(store, TRAJ, "joints", EP, with_times(lambda t: np.full_like(t, 1.5)))
    _, stdout, _ = run(["validate", str(store)], capsys)
    line = one_line_with(stdout, "constant clock", *where(EP, "joints"))
    assert "timestamps are equal (1.5)" in line and "np.float64" not in line, line


def test_missing_image_file_names_the_path(store: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    (store / "media/overview" / f"{EP}.png").unlink()
    check_rejected(store, tmp_path / "out", capsys, f"image file 'media/overview/{EP}.png' cannot be read",
                   EP, "overview")


def test_image_path_leaving_the_store_is_an_error(store: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (store.parent / "x.png").write_bytes((store / "media/overview/ep_0000.png").read_bytes())  # exists outside
    rewrite_cell(store, "images.parquet", "overview", EP, lambda _: "../x.png")
    check_rejected(store, tmp_path / "out", capsys, "media path '../x.png' must be relative to the store",
                   EP, "overview")


def test_skip_bad_episode_exports_the_rest_and_lists_it(store: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_series(store, TRAJ, "joints", EP, with_times(lambda t: np.full_like(t, 1.5)))
    doc = check_exported(store, tmp_path / "out", capsys, "--set", "on_bad_episode=skip")
    episodes = doc["report"]["episodes"]
    assert episodes["total"] == 3 and episodes["exported"] == 2
    [rejected] = episodes["rejected"]
    assert rejected["episode_id"] == EP and rejected["field"] == "joints"
    assert "constant clock" in rejected["message"]
    assert sorted(e for s in doc["splits"].values() for e in s["episodes"]) == OTHERS
    assert {ep for ep, _ in exported_samples(tmp_path / "out")} == set(OTHERS)


# ------------------------------------------------------------------------------- structural errors

def drop_episode(t: pa.Table) -> pa.Table:
    return t.filter(pc.not_equal(t.column("episode_id"), EP))


def only_episode(t: pa.Table) -> pa.Table:
    return t.filter(pc.equal(t.column("episode_id"), EP))


def write_garbage(store: Path) -> None:
    (store / "x.parquet").write_bytes(b"this is not a parquet file\n" * 10)


def add_bad_name(store: Path) -> None:
    rewrite_table(store, TRAJ, lambda t: t.append_column("Joints.Pos", t.column("joints")))


STRUCTURE_FAULTS = {
    # fault id: (injection, phrase, episode, field)
    "episode_missing_from_table": (lambda s: rewrite_table(s, "text.parquet", drop_episode),
                                   "missing from table text.parquet", EP, None),
    "duplicate_episode_id": (lambda s: rewrite_table(s, "text.parquet", lambda t: pa.concat_tables([t, only_episode(t)])),
                             "episode id appears twice in table text.parquet", EP, None),
    "no_episode_id_column": (lambda s: rewrite_table(s, "text.parquet", lambda t: t.drop_columns(["episode_id"])),
                             "table text.parquet has no episode_id column", None, None),
    "float32_time_series": (lambda s: rewrite_table(s, TRAJ, lambda t: replace_column(
        t, "joints", t.column("joints").cast(SERIES_F32))), "time series stored as float32", None, "joints"),
    "invalid_field_name": (add_bad_name, "field name must match", None, "Joints.Pos"),
    "not_parquet": (write_garbage, "table x.parquet cannot be read as Parquet", None, None),
    "yaml_unknown_key": (lambda s: edit_yaml(s, lambda d: d.update(clocks="joints")),
                         "store.yaml: unknown key(s) ['clocks']", None, None),
    "yaml_unknown_declaration_key": (lambda s: edit_yaml(s, lambda d: d["fields"]["joints"].update(interp="linear")),
                                     "unknown declaration key(s) ['interp']", None, "joints"),
    "yaml_unknown_field": (lambda s: edit_yaml(s, lambda d: d["fields"].update(elbow={"units": "rad"})),
                           "store.yaml declares a field that no table has", None, "elbow"),
    "yaml_slerp_without_order": (lambda s: edit_yaml(s, lambda d: d["fields"]["orientation"].pop("quaternion_order")),
                                 "slerp needs quaternion_order", None, "orientation"),
}


@pytest.mark.parametrize("fault", sorted(STRUCTURE_FAULTS))
def test_structural_fault_is_an_error(fault: str, store: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    inject, phrase, episode, field = STRUCTURE_FAULTS[fault]
    inject(store)
    check_rejected(store, tmp_path / "out", capsys, phrase, episode, field)


def test_table_without_episode_id_is_the_only_problem(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    STRUCTURE_FAULTS["no_episode_id_column"][0](store)
    rc, stdout, err = run(["validate", str(store)], capsys)
    assert rc == 1 and "NOT exportable: 1 error(s), 0 warning(s)" in stdout, stdout + err
