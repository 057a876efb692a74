"""Two cameras in one episode with different frame rates, lengths and window rates: each camera's
frames are chosen by its own pts and padded past its own end, on a grid shared with the episode."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from robowds.export.cli.main import main

from videos import write_video

A_MS = [k * 100 for k in range(12)]  # cam_a: 10 fps, 0 .. 1.1 s, frame k = grey 20 k
B_MS = [k * 125 for k in range(7)]  # cam_b: 8 fps, 0 .. 0.75 s (shorter), frame k = grey 20 k


def _expected_b(t: float) -> int | None:
    """cam_b's frame at episode time t: the nearest within half its period (62.5 ms), by hand:
    t / 0.125 rounded, and no frame past 0.75 s + 62.5 ms (t is a multiple of 0.1, never a tie)."""
    k = round(t / 0.125)
    return k if k <= 6 and abs(t - 0.125 * k) <= 0.0625 else None


def test_two_cameras_with_their_own_rates_lengths_and_windows(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_video(store / "media" / "a.mp4", A_MS, rate=10)
    write_video(store / "media" / "b.mp4", B_MS, rate=8)
    struct = pa.struct([("path", pa.string()), ("fps", pa.float64())])
    pq.write_table(pa.table({"episode_id": ["ep0"],
                             "cam_a": pa.array([{"path": "media/a.mp4", "fps": 10.0}], type=struct),
                             "cam_b": pa.array([{"path": "media/b.mp4", "fps": 8.0}], type=struct)}),
                   store / "videos.parquet")
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--keep-order",
                 "--set", "streams.cam_a.encoding=raw", "--set", "streams.cam_a.duration_s=0.3",
                 "--set", "streams.cam_b.encoding=raw", "--set", "streams.cam_b.rate_hz=5",
                 "--set", "streams.cam_b.duration_s=0.4"]) == 0
    from robowds.reader import ShardDataset

    windows = {s["__key__"]: s for s in ShardDataset(out, "train", shuffle=False)}
    assert sorted(windows) == [f"ep0_{a:06d}" for a in range(12)]  # the episode spans both: 0 .. 1.1 s
    for anchor in range(12):
        sample = windows[f"ep0_{anchor:06d}"]
        assert sample["cam_a"].shape == (3, 48, 64, 3) and sample["cam_b"].shape == (2, 48, 64, 3)
        want_a = [anchor + j if anchor + j <= 11 else None for j in range(3)]  # steps every 0.1 s
        want_b = [_expected_b(round(anchor / 10 + 0.2 * j, 9)) for j in range(2)]  # steps every 0.2 s
        for name, wanted in (("cam_a", want_a), ("cam_b", want_b)):
            assert sample[f"{name}_mask"].tolist() == [k is not None for k in wanted], (name, anchor)
            for frame, k in zip(sample[name], wanted):
                if k is None:
                    assert not frame.any()
                else:
                    assert abs(float(frame.mean()) - 20 * k) < 4, (name, anchor, k, float(frame.mean()))
