"""float32 storage that erases a field's variation is reported, and a per-field dtype fixes it (issue 13,
item 3): UTM northings near 5e6 m moving by centimetres were exported with 0.25 m errors, silently.

Real Parquet stores, real exports through the CLI, shards read back with the reader.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.main import main
from robowds.export.core.precision import FLOAT32_LOSS_FRACTION, PrecisionLoss, float32_loss

T = np.arange(20) / 10.0  # [20] s, 10 Hz
NORTHING = 5_000_000.0 + 0.02 * np.arange(20)  # [20] m: 2 cm steps at 5e6 m (float32 spacing 0.5 m)
EASTING = 400_000.0 + 0.02 * np.arange(20)  # [20] m: float32 spacing there is 0.03 m, a loss too


def _store(root: Path) -> Path:
    """Two episodes: `utm` [time, northing, easting] and `joints` [time, sin, cos] (a normal field)."""
    root.mkdir(parents=True)
    rows = []
    for e in range(2):
        utm = np.column_stack([T, NORTHING + e, EASTING])  # [20, 3]
        joints = np.column_stack([T, np.sin(T + e), np.cos(T)])  # [20, 3]
        rows.append({"episode_id": f"ep{e}", "utm": utm.tolist(), "joints": joints.tolist()})
    pq.write_table(pa.Table.from_pylist(rows), root / "t.parquet")
    return root


def _northing_loss(episode: int) -> tuple[float, float]:
    """(max |x - float32(x)|, spread) of episode `episode`'s northing column, computed directly."""
    exact = NORTHING + episode
    return float(np.abs(exact - exact.astype(np.float32)).max()), float(exact.max() - exact.min())


def _loss_text() -> str:
    """The expected description: the northing column (0) of the episode that loses the larger share
    (the first on a tie), both episodes counted; easting loses less (float32 spacing 0.03 m there)."""
    (e0, s0), (e1, s1) = _northing_loss(0), _northing_loss(1)
    episode, (error, spread) = ("ep1", (e1, s1)) if e1 / s1 > e0 / s0 else ("ep0", (e0, s0))
    return (f"its values change by up to {error:.3g}, {100 * error / spread:.3g}% of the spread {spread:.3g} of "
            f"value column 0 in episode {episode!r} (2 episode(s) over the limit of 0.1%)")


FIX = "set float_dtype: float64 in the export config, or streams.utm.dtype: float64 for this field alone"


def test_float32_loss_flags_the_column_float32_cannot_resolve() -> None:
    utm = np.column_stack([NORTHING, np.linspace(0.0, 1.0, 20)])  # [20, 2]
    loss = float32_loss(utm)
    assert loss == PrecisionLoss(0, float(np.abs(NORTHING - NORTHING.astype(np.float32)).max()),
                                 float(NORTHING[-1] - NORTHING[0]))
    assert loss.max_error > FLOAT32_LOSS_FRACTION * loss.spread
    assert float32_loss(np.column_stack([np.sin(T), np.cos(T)])) is None  # normal values: ~1e-8 of the spread
    assert float32_loss(np.full((5, 1), 0.1)) is None  # constant: nothing to resolve, no warning
    assert float32_loss(NORTHING.astype(np.float32)[:, None]) is None  # already float32


def test_validate_warns_once_per_field_naming_it_and_the_fix(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(_store(tmp_path / "s"))]) == 0
    out = capsys.readouterr().out
    warnings = [line.strip() for line in out.splitlines() if line.strip().startswith("warning:")]
    assert warnings == [f"warning: field 'utm': stored as float32 (the export's default float_dtype), "
                        f"{_loss_text()} (fix: {FIX})"]
    assert out.splitlines()[-1] == "exportable: 0 error(s), 1 warning(s)"


def test_export_report_and_summary_warn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _store(tmp_path / "s")
    assert main(["export", str(store), str(tmp_path / "out"), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert (f"warning: field 'utm' is stored as float32: {_loss_text()}: {FIX} "
            "(report.float32_loss.utm in the manifest)") in out.splitlines()
    assert "'joints'" not in out
    assert main(["export", str(store), str(tmp_path / "f64"), "--quiet", "--set", "float_dtype=float64"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("exported 2 episodes") and "warning" not in out  # the global fix silences it
    report = json.loads((tmp_path / "out" / "manifest.json").read_text())["report"]
    (e0, s0), (e1, s1) = _northing_loss(0), _northing_loss(1)
    episode, error, spread = ("ep1", e1, s1) if e1 / s1 > e0 / s0 else ("ep0", e0, s0)
    assert report["float32_loss"] == {"utm": {"episode_id": episode, "column": 0, "max_error": error,
                                              "spread": spread, "episodes": 2}}


def test_per_field_dtype_keeps_that_field_float64(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from robowds.reader import ShardDataset

    store = _store(tmp_path / "s")
    assert main(["export", str(store), str(tmp_path / "out"), "--workers", "1", "--keep-order",
                 "--set", "streams.utm.dtype=float64"]) == 0
    assert "warning" not in capsys.readouterr().out
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert (manifest["schema"]["utm"]["dtype"], manifest["schema"]["joints"]["dtype"]) == ("float64", "float32")
    assert manifest["config"]["streams"]["utm"]["dtype"] == "float64"
    assert "dtype" not in manifest["config"]["streams"]["joints"]  # recorded where set only
    assert "float32_loss" not in manifest["report"]
    samples = {s["__key__"]: s for s in ShardDataset(tmp_path / "out", "train", shuffle=False)}
    first = samples["ep1_000000"]
    assert first["utm"].dtype == np.float64 and first["joints"].dtype == np.float32
    # 10 steps at 10 Hz from t = 0: the stored samples, exact (linear at a sample time is that sample)
    assert first["utm"].tolist() == np.column_stack([NORTHING + 1, EASTING])[:10].tolist()
    assert main(["verify", str(tmp_path / "out"), "--store", str(store), "--quiet"]) == 0  # the override replays


@pytest.mark.parametrize(("sets", "message"), [
    (["streams.utm.dtype=float16"], "robowds export: error: config streams.utm.dtype must be one of float32, "
                                    "float64, got 'float16' (from --set streams.utm.dtype=float16)\n"
                                    "  fix: give streams.utm.dtype one of float32, float64, e.g. "
                                    "--set streams.utm.dtype=float64\n"),
    (["streams.utm.dtype=[float64]"], "robowds export: error: config streams.utm.dtype must be one of float32, "
                                      "float64, got ['float64'] (from --set streams.utm.dtype=[float64])\n"
                                      "  fix: give streams.utm.dtype one of float32, float64, e.g. "
                                      "--set streams.utm.dtype=float64\n"),
    (["window.dtype=float64"], "robowds export: error: unknown config key 'window.dtype' in --set window.dtype=float64\n"
                               "  fix: known keys here: duration_s, offset_s, pad, rate_hz\n"),
])
def test_invalid_dtype_is_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], sets: list[str],
                                         message: str) -> None:
    store = _store(tmp_path / "s")
    args = ["export", str(store), str(tmp_path / "out"), "--quiet"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 2
    assert capsys.readouterr().err == message
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_dtype_on_a_field_that_is_not_a_time_series_is_refused(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from videos import write_video

    store = _store(tmp_path / "s")
    for e in range(2):
        write_video(store / f"cam_{e}.mp4", [k * 100 for k in range(20)])
    pq.write_table(pa.table({"episode_id": ["ep0", "ep1"], "task": ["pick", "place"],
                             "cam": [{"path": f"cam_{e}.mp4", "fps": 10.0} for e in range(2)]}), store / "more.parquet")
    assert main(["export", str(store), str(tmp_path / "out"), "--quiet", "--set", "streams.task.dtype=float64"]) == 2
    assert capsys.readouterr().err == ("robowds export: error: config streams.task sets ['dtype'], but 'task' is a "
                                       "text field (one per episode, not windowed): they would be ignored\n"
                                       "  fix: remove streams.task from the config\n")
    assert main(["export", str(store), str(tmp_path / "out"), "--quiet", "--set", "streams.cam.dtype=float64"]) == 2
    assert capsys.readouterr().err == ("robowds export: error: config streams.cam sets dtype, but 'cam' is a video "
                                       "field (frames are uint8)\n  fix: dtype is the output dtype of a time series; "
                                       "remove it from streams.cam\n")
