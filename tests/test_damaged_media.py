"""Damaged media are caught at validate/export time, not in training (issue 10, item 4): a corrupt
PNG, and a truncated mp4 whose index (moov in front) still lists every frame."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from robowds.export.cli.main import main

VIDEO_TYPE = pa.struct([("path", pa.string()), ("fps", pa.float64())])


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.out + captured.err


def test_corrupt_png_is_an_error_in_validate_and_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "s"
    (store / "img").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for e in range(2):
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(store / "img" / f"ep{e}.png")
    good = (store / "img" / "ep1.png").read_bytes()
    (store / "img" / "ep1.png").write_bytes(good[:len(good) // 2])  # the PNG signature is intact, the data is not
    t = np.arange(20) / 10.0
    pq.write_table(pa.table({"episode_id": ["ep0", "ep1"], "x": [np.column_stack([t, t]).tolist()] * 2,
                             "overview": ["img/ep0.png", "img/ep1.png"]}), store / "t.parquet")
    code, out = _run(["validate", str(store)], capsys)
    assert code == 1 and "error: episode 'ep1', field 'overview': image 'img/ep1.png' cannot be decoded" in out
    code, out = _run(["export", str(store), str(tmp_path / "out"), "--quiet", "--workers", "1"], capsys)
    assert code == 2 and "episode 'ep1', field 'overview': image 'img/ep1.png' cannot be decoded" in out
    assert not (tmp_path / "out" / "manifest.json").exists()


def _faststart_video(path: Path, frames: int, keep: float) -> None:
    """An mp4 with its index in front (movflags faststart) of `frames` frames at 10 fps, cut to `keep`
    of its bytes: the index still lists every frame, the data of the last ones is gone."""
    rng = np.random.default_rng(1)
    with av.open(str(path), "w", format="mp4", options={"movflags": "faststart"}) as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def _video_store(root: Path, keep: float) -> Path:
    root.mkdir(parents=True)
    _faststart_video(root / "v.mp4", 100, keep)
    t = np.arange(100) / 10.0  # 10 s of state: the video's own span
    pq.write_table(pa.table({"episode_id": ["ep"], "x": [np.column_stack([t, t]).tolist()],
                             "cam": pa.array([{"path": "v.mp4", "fps": 10.0}], type=VIDEO_TYPE)}),
                   root / "t.parquet")
    return root


def test_truncated_video_is_an_error_when_most_frames_are_gone(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    store = _video_store(tmp_path / "s", keep=0.4)
    code, out = _run(["validate", str(store)], capsys)
    assert code == 1 and "error: episode 'ep', field 'cam': 'v.mp4' lists 100 frames but" in out
    assert "cannot be read (a truncated file?)" in out
    code, out = _run(["export", str(store), str(tmp_path / "out"), "--quiet", "--workers", "1"], capsys)
    assert code == 2 and "inside the span of 'v.mp4' have no frame: frames are missing from the file" in out
    assert "truncated?" in out


def test_slightly_truncated_video_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _video_store(tmp_path / "s", keep=0.93)
    code, out = _run(["validate", str(store)], capsys)
    assert code == 0 and "warning: episode 'ep', field 'cam': 'v.mp4' lists 100 frames but" in out
    out_dir = tmp_path / "out"
    code, out = _run(["export", str(store), str(out_dir), "--workers", "1", "--set", "streams.cam.encoding=raw"],
                     capsys)
    assert code == 0 and "warning: camera 'cam':" in out and "have no frame" in out
    video = json.loads((out_dir / "manifest.json").read_text())["report"]["video"]["cam"]
    assert 0 < video["missing_frame_fraction"] <= 0.25 and video["missing_frame_steps"] > 0
    assert video["missing_frame_episodes"][0]["episode_id"] == "ep"
    # the count is exact: steps of the 10 Hz grid whose frame index is past the last readable frame
    from robowds.export.media.frames import probe_video
    readable = len(probe_video(store / "v.mp4").pts)
    steps = np.arange(100)[:, None] + np.arange(10)[None, :]  # anchor k, step j -> frame k + j
    assert video["missing_frame_steps"] == int(((steps >= readable) & (steps < 100)).sum())


def test_intact_video_reports_no_missing_frames(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _video_store(tmp_path / "s", keep=1.0)
    code, out = _run(["export", str(store), str(tmp_path / "out"), "--workers", "1"], capsys)
    assert code == 0 and "warning" not in out
    video = json.loads((tmp_path / "out" / "manifest.json").read_text())["report"]["video"]["cam"]
    assert video["missing_frame_steps"] == 0 and video["missing_frame_episodes"] == []
