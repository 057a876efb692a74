"""Source videos in the containers and codecs robot datasets ship (mp4/h264, webm/VP9, webm/AV1,
AVI/mpeg4, Matroska/MJPEG, QuickTime/mpeg4): real files written with PyAV, probed by real pts and
exported through the whole job; the exported frames must be the right source frames."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from robowds.export.cli.main import main
from robowds.export.media.frames import probe_video

from videos import camera_store, write_video

CASES = [("mp4", "libx264"), ("webm", "libvpx-vp9"), ("webm", "libsvtav1"), ("avi", "mpeg4"),
         ("matroska", "mjpeg"), ("mov", "mpeg4")]
EXT = {"matroska": "mkv"}
FRAMES = 12  # frame k: flat grey 20 * k, shown at k * 100 ms


@pytest.mark.parametrize("container_format, codec", CASES)
def test_container_and_codec_export_the_right_frames(tmp_path: Path, container_format: str, codec: str) -> None:
    store = tmp_path / "store"
    rel = f"media/ep.{EXT.get(container_format, container_format)}"
    write_video(store / rel, [k * 100 for k in range(FRAMES)], codec=codec, container_format=container_format)
    info = probe_video(store / rel)
    np.testing.assert_allclose(info.pts, np.arange(FRAMES) / 10, atol=1e-3)
    camera_store(store, {"ep0": rel})
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--keep-order",
                 "--set", "streams.cam.encoding=raw", "--set", "streams.cam.duration_s=0.3"]) == 0
    from robowds.reader import ShardDataset

    windows = {s["__key__"]: s for s in ShardDataset(out, "train", shuffle=False)}
    assert sorted(windows) == [f"ep0_{a:06d}" for a in range(FRAMES)]
    for anchor in range(FRAMES):
        sample = windows[f"ep0_{anchor:06d}"]
        steps = [anchor + j for j in range(3)]
        assert sample["cam_mask"].tolist() == [k < FRAMES for k in steps], (container_format, anchor)
        for j, k in enumerate(steps):
            frame = sample["cam"][j]  # [48, 64, 3]
            if k < FRAMES:  # lossy codecs: the flat grey level survives within a few steps
                assert abs(float(frame.mean()) - 20 * k) < 4, (container_format, codec, anchor, j)
            else:
                assert not frame.any()  # padded past the video's end


def test_svt_av1_says_nothing_when_convert_encodes_with_it(tmp_path: Path) -> None:
    """`convert --image-codec libsvtav1` encodes through encode_frames: SVT-AV1's banner (written by
    the C library to the process's stderr, ~30 lines per file) stays quiet unless SVT_LOG is set."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "SVT_LOG"}
    code = ("import numpy as np, pathlib; from robowds.export.media.encode import encode_frames; "
            "encode_frames(np.zeros((3, 64, 64, 3), np.uint8), np.arange(3) / 10, "
            f"pathlib.Path({str(tmp_path / 'v.mkv')!r}), codec='libsvtav1')")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert (tmp_path / "v.mkv").stat().st_size > 0
    assert "Svt[" not in run.stderr, run.stderr[:500]
