"""Runaway exports (issue 10, item 8, and item 6's allocation cases): implausible clocks, extents and
window plans are one clear error (`robowds CMD: error: ...` + `fix: ...`, exit 2 for export, 1 for
validate) before anything big is allocated or written, never a MemoryError or a full disk."""

from __future__ import annotations

import json
import pickle
from collections import namedtuple
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from robowds.export.cli.main import main
from robowds.export.core.plausible import DiskSpaceError, human_bytes

NS_EPOCH = 1_700_000_000_000_000_000


def _store(root: Path, seconds: float = 2.0, rate_hz: float = 50.0, scale: float = 1.0, origin: float = 0.0,
           end_s: float | None = None, episodes: int = 2) -> Path:
    """`episodes` episodes of one 2-column stream `joints`, `seconds` long at `rate_hz`; times are
    `origin + t * scale` float seconds (scale 1e9: int64 ns values written as float seconds)."""
    root.mkdir(parents=True)
    rows = []
    for e in range(episodes):
        n = int(seconds * rate_hz)
        times = origin + np.arange(n) / rate_hz * scale  # [T]
        row = {"episode_id": f"ep{e}", "joints": np.column_stack([times, np.sin(np.arange(n)), np.arange(n)]).tolist()}
        if end_s is not None:
            row["end_s"] = end_s
        rows.append(row)
    pq.write_table(pa.Table.from_pylist(rows), root / "t.parquet")
    (root / "store.yaml").write_text(yaml.safe_dump({"version": 1, "fields": {"joints": {}}}))
    return root


def _export(store: Path, out: Path, *sets: str) -> list[str]:
    args = ["export", str(store), str(out), "--quiet", "--workers", "1"]
    for item in sets:
        args += ["--set", item]
    return args


def _refused(code: int, capsys: pytest.CaptureFixture[str], out: Path, *needles: str, command: str = "export") -> str:
    """Exit 2, one `robowds CMD: error:` message with a fix and every needle, no traceback, no export
    written and no window staged."""
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"robowds {command}: error: "), err
    assert "fix: " in err and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    if out.exists():
        assert not (out / "manifest.json").exists()
        staged = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        assert staged < 10_000, f"{staged} bytes written"
    return err


def test_ns_values_stored_as_float_seconds_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """int64 ns epoch times written as float seconds: a 50 Hz stream has a 2e7 s period and an
    episode of 2e9 s (before: a 148 GiB anchor allocation here, 496 GiB in the issue's store)."""
    store = _store(tmp_path / "s", scale=1e9, origin=float(NS_EPOCH))
    out = tmp_path / "out"
    err = _refused(main(_export(store, out)), capsys, out,
                   "episode 'ep0', field 'joints': median sample period is 2e+07 s",
                   "outside [1e-06 s, 3600 s]", "time unit")
    assert "episode 'ep1'" in err
    assert main(["validate", str(store)]) == 1
    report = capsys.readouterr().out
    assert "error: episode 'ep0', field 'joints': median sample period is 2e+07 s" in report
    assert "more than max_episode_s = 86400 s" in report


def test_microseconds_as_seconds_are_refused_by_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _store(tmp_path / "s", scale=1e6)  # 20 ms period written as 20000 "s"
    assert main(["validate", str(store)]) == 1
    report = capsys.readouterr().out
    assert "median sample period is 20000 s, outside [1e-06 s, 3600 s]" in report
    assert "NOT exportable" in report


def test_huge_fps_is_refused_before_allocating(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """fps=100000 on 2 s episodes: 200000 windows of 100000 steps each (a MemoryError before)."""
    store = _store(tmp_path / "s")
    out = tmp_path / "out"
    _refused(main(_export(store, out, "fps=100000")), capsys, out,
             "episode 'ep0': would write 198001 windows of at least", "of source data", "lower fps")


def test_huge_rate_hz_is_refused_before_allocating(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """rate_hz=1e6 on 5-minute episodes: 3000 windows of 1e6 steps each (a MemoryError before)."""
    store = _store(tmp_path / "s", seconds=300.0, rate_hz=10.0, episodes=1)
    out = tmp_path / "out"
    _refused(main(_export(store, out, "window.rate_hz=1000000")), capsys, out,
             "episode 'ep0': would write 3000 windows of at least 9.0 MB each", "rate_hz")


def test_end_s_far_away_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`end_s: 1e7` on 2 s of data: validate passed it, then the export filled the disk."""
    store = _store(tmp_path / "s", end_s=1e7)
    assert main(["validate", str(store)]) == 1
    report = capsys.readouterr().out
    assert "error: episode 'ep0': the episode lasts 1e+07 s (0 .. 1e+07), more than max_episode_s = 86400 s" in report
    out = tmp_path / "out"
    _refused(main(_export(store, out)), capsys, out, "episode 'ep0': the episode lasts 1e+07 s", "end_s")


def test_extent_far_beyond_its_data_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`end_s: 5000` on 2 s of data: under 24 h, but 2500 x what the data covers."""
    store = _store(tmp_path / "s", end_s=5000.0)
    assert main(["validate", str(store)]) == 1
    assert "the episode's extent is 5000 s (0 .. 5000) but its data covers only 1.98 s" in capsys.readouterr().out
    out = tmp_path / "out"
    _refused(main(_export(store, out)), capsys, out, "data covers only 1.98 s", "fix start_s / end_s")


def test_max_episode_s_is_configurable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _store(tmp_path / "s", seconds=20.0)
    assert main(["validate", str(store)]) == 0
    assert main(["validate", str(store), "--max-episode-s", "10"]) == 1
    assert "the episode lasts 19.98 s (0 .. 19.98), more than max_episode_s = 10 s" in capsys.readouterr().out
    out = tmp_path / "out"
    _refused(main(_export(store, out, "max_episode_s=10")), capsys, out, "more than max_episode_s = 10 s")
    assert main(_export(store, out, "max_episode_s=20")) == 0
    assert json.loads((out / "manifest.json").read_text())["config"]["max_episode_s"] == 20.0
    assert main(["validate", str(store), "--max-episode-s", "0"]) == 2
    assert "--max-episode-s must be a positive number" in capsys.readouterr().err


Usage = namedtuple("Usage", "total used free")  # what shutil.disk_usage returns


def test_episode_larger_than_the_free_disk_stops_the_export(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Not an episode error: `on_bad_episode=skip` does not drop episodes for want of disk, and the
    re-run after freeing space builds them."""
    store = _store(tmp_path / "s", seconds=20.0)
    out = tmp_path / "out"
    monkeypatch.setattr("robowds.export.job.stage.shutil.disk_usage", lambda path: Usage(10**9, 10**9 - 50_000, 50_000))
    err = _refused(main(_export(store, out, "on_bad_episode=skip")), capsys, out)
    assert err.startswith("robowds export: error: episode 'ep0': would write 200 windows of at least 3.1 KB each = "
                          "614.4 KB, but the output disk has 50.0 KB free\n  fix: free disk space and re-run the same "
                          "command, or choose an output folder on a larger disk; or lower fps, raise stride, or "
                          "shorten rate_hz / duration_s in the export config; the unfinished export in ")
    assert err.count("\n") == 2 and "is resumed by re-running the same command" in err
    monkeypatch.undo()
    assert main(_export(store, out, "on_bad_episode=skip")) == 0
    assert json.loads((out / "manifest.json").read_text())["report"]["episodes"]["exported"] == 2


def test_disk_space_error_keeps_its_hint_across_processes() -> None:
    error = pickle.loads(pickle.dumps(DiskSpaceError("episode 'ep0': too big", hint="free disk space")))
    assert isinstance(error, DiskSpaceError) and str(error) == "episode 'ep0': too big\n  fix: free disk space"


def test_shards_larger_than_the_free_disk_are_refused_before_the_reduce(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every episode fits alone, the shards (a copy of all staged windows) do not: refused before any
    shard is written; the staged episodes stay, so the re-run with room finishes the same export."""
    store = _store(tmp_path / "s", seconds=20.0, episodes=4)
    reference = tmp_path / "ref"
    assert main(_export(store, reference)) == 0
    shards = sorted(reference.rglob("*.tar"))
    total = sum(p.stat().st_size for p in shards)
    out = tmp_path / "out"
    free = total // 2
    monkeypatch.setattr("robowds.export.job.shards.shutil.disk_usage", lambda path: Usage(10**9, 10**9 - free, free))
    err = capsys.readouterr().err
    assert main(_export(store, out)) == 2
    err = capsys.readouterr().err
    assert err.startswith("robowds export: error: writing the shards needs "), err
    assert f"needs {human_bytes(total)} on the disk of {out}, but it has {human_bytes(free)} free" in err
    assert "fix: free disk space and re-run" in err
    assert "Traceback" not in err and not (out / "manifest.json").exists() and not list(out.rglob("*.tar"))
    monkeypatch.undo()  # the disk has room again
    assert main(_export(store, out)) == 0
    assert [p.read_bytes() for p in sorted(out.rglob("*.tar"))] == [p.read_bytes() for p in shards]
