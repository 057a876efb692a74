"""A video through the whole export as a stream: variable frame rate against hand-computed frame
choices, a frame that only a later chunk of windows uses, and a bounded number of decoded frames
held at once on a long video. Real PyAV-encoded files, real export job, real shards."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from robowds.export.cli.main import main

from videos import camera_store, decode_all, gradient_frames, write_frames

VFR_MS = [0, 100, 200, 330, 400, 720, 800, 900, 1000]  # median interval 100 ms; a 320 ms hole at 400-720

# Query time (ms, episode = file clock) -> source frame, or None where the step is masked.
# nearest: closest frame within half the median interval (50 ms), never outside [0, 1000] ms.
NEAREST = {0: 0, 100: 1, 200: 2, 300: 3,  # 300: 330 is 30 ms away, 200 is 100 ms away
           400: 4, 500: None, 600: None,  # 500: nearest 400 is 100 ms away; 600: nearest 720 is 120 ms away
           700: 5, 800: 6, 900: 7, 1000: 8, 1100: None, 1200: None}  # 700: 720 is 20 ms away; past the end
# causal: latest frame at or before t, less than one median interval (100 ms) old, inside [0, 1000] ms.
CAUSAL = {50: 0, 150: 1, 250: 2, 350: 3,  # 350: 330 is 20 ms old
          450: 4, 550: None, 650: None,  # 400 is 150 / 250 ms old
          750: 5, 850: 6, 950: 7,  # 750: 720 is 30 ms old
          1050: None, 1150: None, 1250: None}  # 1000 is 50 ms old, but 1.05 s is past the episode's end


def _windows(out: Path) -> dict[str, dict]:
    from robowds.reader import ShardDataset
    return {s["__key__"]: s for s in ShardDataset(out, "train", shuffle=False)}


def _export(store: Path, out: Path, *sets: str, fps: str = "10", stride: str = "1") -> None:
    args = ["export", str(store), str(out), "--quiet", "--workers", "1", "--keep-order", "--fps", fps,
            "--stride", stride, "--set", "streams.cam.encoding=raw"]
    for item in sets:
        args += ["--set", item]
    assert main(args) == 0


@pytest.mark.parametrize("selection, offset_ms, table", [("nearest", 0, NEAREST), ("causal", 50, CAUSAL)])
def test_variable_frame_rate_frames_and_masks_per_step(tmp_path: Path, selection: str, offset_ms: int,
                                                       table: dict[int, int | None]) -> None:
    store = tmp_path / "s"
    write_frames(store / "media" / "vfr.mp4", gradient_frames(len(VFR_MS)), VFR_MS)  # lossless, frame k known
    camera_store(store, {"ep0": "media/vfr.mp4"})
    out = tmp_path / "out"
    _export(store, out, f"streams.cam.selection={selection}", f"streams.cam.offset_s={offset_ms / 1000}",
            "streams.cam.duration_s=0.3")
    source = decode_all(store / "media" / "vfr.mp4")  # [9, 48, 64, 3]
    np.testing.assert_array_equal(source, gradient_frames(len(VFR_MS)))
    windows = _windows(out)
    assert sorted(windows) == [f"ep0_{k:06d}" for k in range(11)]  # grid 10 Hz over the video's [0, 1.0] s
    for anchor in range(11):
        sample = windows[f"ep0_{anchor:06d}"]
        wanted = [table[100 * (anchor + j) + offset_ms] for j in range(3)]  # steps at anchor + offset + j/10
        assert sample["cam_mask"].tolist() == [w is not None for w in wanted], (selection, anchor)
        for j, frame in enumerate(wanted):
            expected = source[frame] if frame is not None else np.zeros_like(source[0])  # pad: zero
            np.testing.assert_array_equal(sample["cam"][j], expected, err_msg=f"{selection} anchor {anchor} step {j}")


def test_frame_used_only_by_a_later_chunk_is_kept(tmp_path: Path) -> None:
    """Anchors 1/6 s apart, steps 1/10 s apart over 2 s: chunk 2 (anchors 64+) needs frames that lie
    before chunk 1's last frame but that no window of chunk 1 uses (this used to raise KeyError)."""
    store = tmp_path / "s"
    write_frames(store / "media" / "c.mp4", gradient_frames(450, 16, 16), rate=30)  # 15 s, frame k at k / 30 s
    camera_store(store, {"ep0": "media/c.mp4"}, fps=30.0)
    out = tmp_path / "out"
    _export(store, out, "streams.cam.rate_hz=10", "streams.cam.duration_s=2.0", fps="30", stride="5")
    source = gradient_frames(450, 16, 16)
    for anchor in (315, 320, 325):  # the last window of chunk 1, the first two of chunk 2
        frames = _windows(out)[f"ep0_{anchor:06d}"]["cam"]  # [20, 16, 16, 3]; step j at (anchor + 3 j) / 30 s
        np.testing.assert_array_equal(frames, source[anchor + 3 * np.arange(20)])


def _held(tmp_path: Path, name: str, frames: int) -> tuple[int, int]:
    store = tmp_path / name
    write_frames(store / "media" / "c.mp4", np.zeros((frames, 16, 16, 3), np.uint8), rate=30, codec="mpeg4")
    camera_store(store, {"ep0": "media/c.mp4"}, fps=30.0)
    out = tmp_path / f"{name}_out"
    _export(store, out, "streams.cam.duration_s=1.0", "streams.cam.rate_hz=10")
    manifest = json.loads((out / "manifest.json").read_text())
    return manifest["report"]["video"]["cam"]["frames_held_max"], manifest["report"]["windows"]["emitted"]


def test_long_video_holds_a_bounded_number_of_decoded_frames(tmp_path: Path) -> None:
    short_held, short_windows = _held(tmp_path, "short", 300)  # 10 s at 30 fps
    long_held, long_windows = _held(tmp_path, "long", 3000)  # 100 s at 30 fps
    assert (short_windows, long_windows) == (100, 1000)
    # one chunk of 64 windows (6.4 s of anchors) + one window (10 steps) of every 3rd frame, whatever the length
    assert short_held == long_held and long_held <= 64 + 10
