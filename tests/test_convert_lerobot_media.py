"""LeRobot per-frame image features and table/video clock offsets, on copies of the vendored real G1
data: image features become one video per episode (JPEG bytes muxed as they are, PNG frames lossless),
and a table clock that starts a frame after the video keeps LeRobot's row <-> frame pairing."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from PIL import Image

from robowds.export.cli.main import main
from robowds.export.convert.lerobot import clock_offset

from exports import export_members, npy
from realdata import G1_EPISODES, g1, g1_parquet
from videos import decode_all

KEY = "observation.images.cam_high"


def _small_frames(episode: str, count: int) -> np.ndarray:
    """The first `count` real G1 frames of `episode`, downscaled to 64x48: [count, 48, 64, 3] uint8."""
    from realdata import g1_video

    with av.open(str(g1_video(episode))) as container:
        frames = []
        for frame in container.decode(video=0):
            frames.append(frame.reformat(width=64, height=48, format="rgb24").to_ndarray())
            if len(frames) == count:
                break
    return np.stack(frames)


def _image_dataset(root: Path, fmt: str, count: int = 12) -> tuple[Path, dict[str, list[bytes]]]:
    """The vendored G1 dataset cut to `count` frames per episode, its video feature replaced by an image
    feature whose frames (real G1 frames, small) are embedded in the Parquet rows as `fmt` bytes."""
    shutil.copytree(g1("meta"), root / "meta")
    info = json.loads((root / "meta" / "info.json").read_text())
    info["features"][KEY] = {"dtype": "image", "shape": [48, 64, 3], "names": ["height", "width", "channel"]}
    (root / "meta" / "info.json").write_text(json.dumps(info))
    encoded = {}
    for episode in G1_EPISODES:
        table = pq.read_table(g1_parquet(episode)).slice(0, count)
        frames = []
        for image in _small_frames(episode, count):
            buffer = io.BytesIO()
            Image.fromarray(image).save(buffer, fmt)
            frames.append(buffer.getvalue())
        encoded[episode] = frames
        images = pa.array([{"bytes": b, "path": None} for b in frames],
                          pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
        path = root / "data" / "chunk-000" / f"{episode}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.append_column(KEY, images), path)
    return root, encoded


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_image_features_become_one_exact_video_per_episode(tmp_path: Path, fmt: str) -> None:
    src, encoded = _image_dataset(tmp_path / "src", fmt)
    store = tmp_path / "store"
    assert main(["convert", "lerobot", str(src), str(store), "--quiet", "--workers", "1"]) == 0
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--fps", "30", "--keep-order",
                 "--set", "exclude=[action, observation_state]", "--set", "shard.min_shards=1",
                 "--set", "streams.observation_images_cam_high.duration_s=0.0333333333333333",
                 "--set", "streams.observation_images_cam_high.rate_hz=30",
                 "--set", "streams.observation_images_cam_high.encoding=raw"]) == 0
    samples = export_members(out)
    for episode in G1_EPISODES:
        video = store / "media" / "observation_images_cam_high" / f"{episode}.mkv"
        with av.open(str(video)) as container:
            packets = [bytes(p) for p in container.demux(video=0) if p.size]
        if fmt == "JPEG":
            assert packets == encoded[episode]  # muxed byte for byte
            expected = [_decode_jpeg(b) for b in encoded[episode]]  # the same decoder the export uses
        else:
            expected = [np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in encoded[episode]]
        assert len(expected) == 12
        for k, frame in enumerate(expected):
            got = npy(samples[f"{episode}_{k:06d}"]["observation_images_cam_high.npy"])[0]
            np.testing.assert_array_equal(got, frame)  # FFV1: the PNG pixels exactly


def _decode_jpeg(data: bytes) -> np.ndarray:
    codec = av.CodecContext.create("mjpeg", "r")
    (frame,) = codec.decode(av.Packet(data))
    return frame.to_ndarray(format="rgb24")


def test_a_table_clock_one_frame_late_keeps_lerobots_pairing(tmp_path: Path) -> None:
    """Timestamps that start at 1/fps (frame_index 0 at 0.0333 s): LeRobot pairs row k with the frame at
    pts = timestamp[k], i.e. video frame k + 1; the converter detects the constant offset, reports it,
    and the exported window of row k shows that frame."""
    src = tmp_path / "src"
    shutil.copytree(g1(), src)
    for episode in G1_EPISODES:
        path = src / "data" / "chunk-000" / f"{episode}.parquet"
        table = pq.read_table(path)
        late = pc.add(table.column("timestamp"), pa.scalar(np.float32(1 / 30)))
        pq.write_table(table.set_column(table.schema.get_field_index("timestamp"), "timestamp", late), path)
    store = tmp_path / "store"
    assert main(["convert", "lerobot", str(src), str(store), "--quiet", "--workers", "1"]) == 0
    report = json.loads((store / "convert_report.json").read_text())
    assert len(report["notes"]) == 2 and "clock_offset_s = -0.033333" in report["notes"][0]
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--fps", "30", "--stride", "50",
                 "--keep-order", "--set", "exclude=[action]",  # the state keeps the grid on frame_index / fps
                 "--set", "streams.observation_images_cam_high.duration_s=0.0333333333333333",
                 "--set", "streams.observation_images_cam_high.rate_hz=30",
                 "--set", "streams.observation_images_cam_high.encoding=raw"]) == 0
    samples = export_members(out)
    from realdata import g1_video

    source = decode_all(g1_video(G1_EPISODES[0]))  # [F, 480, 640, 3]
    for k in (0, 50, 100, 300):
        got = npy(samples[f"{G1_EPISODES[0]}_{k:06d}"]["observation_images_cam_high.npy"])[0]
        np.testing.assert_array_equal(got, source[k + 1])


def test_clock_offset_is_a_constant_beyond_float32_noise_or_nothing() -> None:
    frames = np.arange(400)
    exact = (frames / 30.0).astype(np.float32)  # LeRobot's float32 timestamps: noise only
    assert clock_offset(frames, exact, 30.0) == 0.0
    assert clock_offset(frames, exact + np.float32(1 / 30), 30.0) == pytest.approx(-1 / 30, abs=1e-12)
    jittery = exact + np.where(frames % 2 == 0, 0.02, 0.0).astype(np.float32)  # not one constant
    assert clock_offset(frames, jittery, 30.0) == 0.0
    assert clock_offset(np.zeros(0, np.int64), np.zeros(0, np.float32), 30.0) == 0.0
