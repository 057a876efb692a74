"""`robowds validate`'s report: every problem of an episode (bounded per episode), the rate column kept
when the store has errors, and a field's rate shown as min/median/max when episodes disagree."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.store.declarations import Problem
from robowds.export.store.schema import open_store
from robowds.export.store.validate import StoreReport

from corrupt import edit_yaml, rewrite_cell, rewrite_series, rewrite_table, series

TRAJ = "trajectories.parquet"
FIX_NAMES = "(fix: give one name per value column in store.yaml (column 0 is the time))"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return write_synthetic_store(tmp_path / "s", episodes=4, seed=2).root


def validate(store: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["validate", str(store)])
    return code, capsys.readouterr().out.splitlines()


def test_every_problem_of_an_episode_is_listed(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three faults of one episode in three tables: all three listed (before: only the first), and the
    episode's other streams still measured."""
    rewrite_series(store, TRAJ, "joints", "ep_0001", lambda a: a[:, :3])  # 2 value columns, 7 names declared
    rewrite_cell(store, "text.parquet", "task", "ep_0001", lambda v: None)
    rewrite_cell(store, "images.parquet", "overview", "ep_0001", lambda v: "media/overview/gone.png")
    code, lines = validate(store, capsys)
    assert code == 1
    assert lines[-4:] == [
        "  error: episode 'ep_0001', field 'overview': image file 'media/overview/gone.png' cannot be read: "
        "No such file or directory (fix: fix the path (relative to the store folder) or add the file; if "
        "'overview' is text, not a path (its first value ends like a file name), declare `kind: text` for it "
        "under fields in store.yaml)",
        "  error: episode 'ep_0001', field 'task': text value is null (fix: every episode needs this field)",
        f"  error: episode 'ep_0001', field 'joints': declares 7 names but has 2 value columns {FIX_NAMES}",
        "NOT exportable: 3 error(s), 0 warning(s)"]


def test_rate_column_is_kept_when_the_store_has_structural_errors(store: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A bad declaration of `imu` and an episode missing from one table: the other fields' rates are
    still measured (before: every rate was '-')."""
    edit_yaml(store, lambda doc: doc["fields"]["imu"].update(colour="red"))
    rewrite_table(store, "text.parquet", lambda t: t.slice(1))  # ep_0000 has no row there
    code, lines = validate(store, capsys)
    assert code == 1
    assert lines[1:9] == [
        "  field            table                  kind       type     interp    rate (Hz)  source",
        "  actions          trajectories.parquet   timeseries float64  linear        50.00  declared",
        "  gripper_cmd      trajectories.parquet   timeseries float64  hold          10.00  declared",
        "  imu              sensors.parquet        timeseries float64  linear            -  declared",
        "  joints           trajectories.parquet   timeseries float64  linear        50.00  declared",
        "  orientation      trajectories.parquet   timeseries float64  slerp         50.00  declared",
        "  overview         images.parquet         image      -        -                 -  declared",
        "  task             text.parquet           text       -        -                 -  declared"]
    assert lines[9:] == [
        "  error: field 'imu': store.yaml: unknown declaration key(s) ['colour'] (fix: known: fps, "
        "interpolation, kind, max_gap_s, names, quaternion_order, time_unit, units)",
        "  error: episode 'ep_0000': missing from table text.parquet (other tables have it) (fix: every table "
        "needs one row per episode)",
        "NOT exportable: 2 error(s), 0 warning(s)"]


def test_rate_that_differs_across_episodes_is_shown_as_a_spread(store: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """imu recorded at 50, 20, 25 and 100 Hz: min/median/max (20/37.5/100), not one number, and the
    episodes at both ends named."""
    for ep, rate in (("ep_0000", 50.0), ("ep_0001", 20.0), ("ep_0002", 25.0), ("ep_0003", 100.0)):
        first, last = series(store, "sensors.parquet", "imu", ep)[[0, -1], 0]
        times = first + np.arange(int((last - first) * rate)) / rate  # [T]
        rewrite_series(store, "sensors.parquet", "imu", ep,
                       lambda a: np.column_stack([times, np.ones((len(times), 6))]))
    code, lines = validate(store, capsys)
    assert code == 0
    assert lines[1] == "  field            table                  kind       type     interp" + " " * 12 + "rate (Hz)  source"
    assert lines[4] == ("  imu              sensors.parquet        timeseries float64  linear   "
                        "20.00/37.50/100.00  declared")
    assert lines[5] == ("  joints           trajectories.parquet   timeseries float64  linear   "
                        "             50.00  declared")
    assert lines[9] == ("  rate of 'imu' differs across episodes (min/median/max above): 20.00 Hz in episode "
                        "'ep_0001', 100.00 Hz in episode 'ep_0003'")
    assert lines[-1] == "exportable: 0 error(s), 0 warning(s)"


def test_problems_are_bounded_per_episode(store: Path) -> None:
    """At most 20 lines per episode (errors first), then a count of its rest; other episodes unaffected."""
    problems = ([Problem("error", f"fault {i}", "ep_0000", "joints") for i in range(22)]
                + [Problem("warning", f"repair {i}", "ep_0000") for i in range(3)]
                + [Problem("error", "fault", "ep_0001", "imu"), Problem("warning", "store-wide")])
    lines = StoreReport(open_store(store), problems=problems).render().splitlines()
    listed = lines[lines.index("  error: episode 'ep_0000', field 'joints': fault 0"):]
    assert listed == [
        *(f"  error: episode 'ep_0000', field 'joints': fault {i}" for i in range(20)),
        "  ... and 5 more problem(s) of episode 'ep_0000' (2 error(s), 3 warning(s))",
        "  error: episode 'ep_0001', field 'imu': fault",
        "  warning: store-wide",
        "NOT exportable: 23 error(s), 4 warning(s)"]
