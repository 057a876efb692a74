"""Centre crop at export (`crop: null | "center" | [w, h]`, before any `resize`) on real lossless
videos whose pixels are known, through the real export job, shards and reader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from robowds.export.cli.main import main
from robowds.export.media.geometry import CropError, crop_box, output_size

from videos import camera_store, decode_all, gradient_frames, write_frames


def test_crop_box_geometry() -> None:
    assert crop_box(64, 48, "center", (32, 32)) == (8, 0, 48, 48)  # wide source: full height, 1:1
    assert crop_box(48, 64, "center", (40, 20)) == (0, 20, 48, 24)  # tall source: full width, 2:1
    assert crop_box(100, 75, "center", (16, 9)) == (0, 9, 100, 56)  # 100 * 9 / 16 = 56.25 -> 56 rows
    assert crop_box(64, 48, "center", (640, 480)) is None  # same aspect ratio: nothing to crop
    assert crop_box(64, 48, (30, 20), None) == (17, 14, 30, 20)  # offsets floor((64 - 30) / 2), (48 - 20) / 2
    assert crop_box(64, 48, None, (32, 32)) is None
    assert output_size(64, 48, (30, 20), None) == (30, 20) and output_size(64, 48, (30, 20), (8, 6)) == (8, 6)
    with pytest.raises(CropError, match=r"crop \[65, 20\] is larger than the 64x48 source picture"):
        crop_box(64, 48, (65, 20), None)
    with pytest.raises(CropError, match='crop "center" needs resize'):
        crop_box(64, 48, "center", None)


def _store(tmp_path: Path, frames: int = 12) -> tuple[Path, np.ndarray]:
    """One episode, a lossless 64x48 video at 10 fps whose frame k holds gradient_frames(k)."""
    store = tmp_path / "s"
    source = gradient_frames(frames)  # [F, 48, 64, 3]
    write_frames(store / "media" / "cam.mp4", source)
    camera_store(store, {"ep0": "media/cam.mp4"})
    return store, source


def _export(store: Path, out: Path, *sets: str) -> int:
    args = ["export", str(store), str(out), "--quiet", "--workers", "1", "--keep-order",
            "--set", "streams.cam.duration_s=0.3", "--set", "streams.cam.encoding=raw"]
    for item in sets:
        args += ["--set", item]
    return main(args)


def _windows(out: Path) -> dict[str, dict]:
    from robowds.reader import ShardDataset
    return {s["__key__"]: s for s in ShardDataset(out, "train", shuffle=False)}


def test_raw_crop_is_the_exact_source_rectangle(tmp_path: Path) -> None:
    store, source = _store(tmp_path)
    out = tmp_path / "out"
    assert _export(store, out, "streams.cam.crop=[30, 20]") == 0
    windows = _windows(out)
    assert len(windows) == 12
    for anchor in (0, 5, 9):
        frames = windows[f"ep0_{anchor:06d}"]["cam"]  # [3, 20, 30, 3]
        np.testing.assert_array_equal(frames, source[anchor:anchor + 3, 14:34, 17:47])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["videos"]["cam"]["crop"] == [30, 20]
    assert manifest["schema"]["cam"]["shape"] == [3, 20, 30, 3] and manifest["schema"]["cam"]["crop"] == [30, 20]
    assert main(["verify", str(out), "--store", str(store), "--quiet"]) == 0  # recomputed from the manifest


def test_center_crop_to_the_resize_size_keeps_source_pixels(tmp_path: Path) -> None:
    store, source = _store(tmp_path)
    out = tmp_path / "out"
    assert _export(store, out, "streams.cam.crop=center", "streams.cam.resize=[48, 48]") == 0
    frames = _windows(out)["ep0_000004"]["cam"]  # 64x48 -> the centred 48x48 square, no scaling
    np.testing.assert_array_equal(frames, source[4:7, :, 8:56])
    assert json.loads((out / "manifest.json").read_text())["config"]["videos"]["cam"]["crop"] == "center"


def test_center_crop_then_resize_equals_crop_then_pyav_scale(tmp_path: Path) -> None:
    from av import VideoFrame
    from av.video.reformatter import VideoReformatter

    store, source = _store(tmp_path)
    out = tmp_path / "out"
    assert _export(store, out, "streams.cam.crop=center", "streams.cam.resize=[20, 10]") == 0
    frames = _windows(out)["ep0_000002"]["cam"]  # [3, 10, 20, 3]
    assert frames.shape == (3, 10, 20, 3)
    scaler = VideoReformatter()
    for j in range(3):  # 64x48 at 2:1 -> the centred 64x32 band (rows 8..39), then scaled to 20x10
        band = np.ascontiguousarray(decode_all(store / "media" / "cam.mp4")[2 + j, 8:40])  # [32, 64, 3]
        expected = scaler.reformat(VideoFrame.from_ndarray(band, format="rgb24"), width=20, height=10,
                                   threads=1).to_ndarray()
        np.testing.assert_array_equal(frames[j], expected)
    # nothing stretched: the columns keep the source's horizontal gradient (red = 3 x column, 64 -> 20)
    red = frames[0, 5, :, 0].astype(float)
    np.testing.assert_allclose(red, 3 * (np.arange(20) + 0.5) * 64 / 20 - 1.5, atol=3)
    assert source.shape == (12, 48, 64, 3)


def test_crop_errors_name_the_key_or_the_episode_and_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, _ = _store(tmp_path)
    assert _export(store, tmp_path / "o1", "streams.cam.crop=[80, 20]") == 2
    err = capsys.readouterr().err
    assert ("episode 'ep0', field 'cam': video file 'media/cam.mp4': crop [80, 20] is larger than the "
            "64x48 source picture") in err
    assert "change streams.cam.crop / resize / encoding" in err and "Traceback" not in err
    assert _export(store, tmp_path / "o2", "streams.cam.crop=center") == 2
    assert 'config streams.cam.crop is "center" but streams.cam.resize is not set' in capsys.readouterr().err
    assert _export(store, tmp_path / "o3", "streams.cam.crop=left") == 2
    assert "config streams.cam.crop must be null, \"center\" (with resize) or [width, height]" in capsys.readouterr().err
    assert _export(store, tmp_path / "o4", "streams.cam.crop=[31, 20]", "streams.cam.encoding=mp4") == 2
    assert "mp4 encoding needs an even frame size, got 31x20" in capsys.readouterr().err  # the size after the crop
    assert _export(store, tmp_path / "o5", "streams.cam.crop=[31, 20]", "streams.cam.resize=[32, 20]",
                   "streams.cam.encoding=mp4") == 0  # the final size is what must be even
