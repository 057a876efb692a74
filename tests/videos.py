"""Synthetic test videos with known presentation timestamps, written with PyAV (real mp4 files)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Iterable

import av
import numpy as np


def write_video(path: Path, pts_ms: list[int], size: tuple[int, int] = (64, 48), rate: int = 10,
                codec: str = "mpeg4", container_format: str = "mp4") -> None:
    """A video (mp4 unless `container_format` says otherwise) whose frame i is shown at pts_ms[i]
    milliseconds; frame i is a flat grey of value (20 * i) % 256 so tests can tell frames apart after
    decoding."""
    width, height = size
    greys = np.stack([np.full((height, width, 3), (20 * i) % 256, dtype=np.uint8) for i in range(len(pts_ms))])
    write_frames(path, greys, pts_ms, codec=codec, rate=rate, container_format=container_format)


PIX_FMT = {"png": "rgb24", "mjpeg": "yuvj420p"}  # png: lossless RGB; MJPEG takes full-range yuv only


def write_frames(path: Path, frames: np.ndarray, pts_ms: list[int] | None = None, codec: str = "png",
                 rate: int = 10, container_format: str = "mp4") -> None:
    """A video of the given frames [F, H, W, 3] uint8, frame i at pts_ms[i] ms (default i * 1000 / rate).

    codec "png" stores RGB losslessly, so decoded frames equal `frames` exactly (known pixel content);
    other codecs go through yuv420p (yuvj420p for mjpeg)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pts_ms = pts_ms if pts_ms is not None else [round(i * 1000 / rate) for i in range(len(frames))]
    height, width = frames.shape[1:3]
    with av.open(str(path), "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height = width, height
        stream.pix_fmt = PIX_FMT.get(codec, "yuv420p")
        stream.time_base = Fraction(1, 1000)
        stream.codec_context.time_base = Fraction(1, 1000)
        for image, ms in zip(frames, pts_ms):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts = ms
            frame.time_base = Fraction(1, 1000)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def gradient_frames(count: int, width: int = 64, height: int = 48) -> np.ndarray:
    """[F, H, W, 3] uint8 with known content: red = 3 x column, green = 5 x row, blue = 10 x frame,
    so any shift of a crop or a swapped frame changes the pixels."""
    ys, xs = np.mgrid[0:height, 0:width]  # [H, W] each
    frames = np.empty((count, height, width, 3), dtype=np.uint8)
    frames[..., 0] = (3 * xs) % 256
    frames[..., 1] = (5 * ys) % 256
    frames[..., 2] = (10 * np.arange(count) % 256)[:, None, None]
    return frames


def camera_store(root: Path, videos: dict[str, str], fps: float = 10.0) -> Path:
    """A store with one table: episode_id and a video struct column `cam` (paths relative to root)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    column = pa.array([{"path": path, "fps": fps} for path in videos.values()],
                      type=pa.struct([("path", pa.string()), ("fps", pa.float64())]))
    pq.write_table(pa.table({"episode_id": list(videos), "cam": column}), root / "videos.parquet")
    return root


def to_rgb(frames: Iterable[av.VideoFrame], width: int | None = None, height: int | None = None) -> np.ndarray:
    """Frames as rgb24 [F, H, W, 3] through one single-threaded swscale context: the same pixels as
    PyAV's `to_ndarray(format="rgb24")`, without leaving swscale threads in the test process (which
    forked DataLoader workers must not inherit, see test_fork_safety.py)."""
    from av.video.reformatter import VideoReformatter

    reformatter = VideoReformatter()
    return np.stack([reformatter.reformat(f, format="rgb24", width=width, height=height, threads=1).to_ndarray()
                     for f in frames])


def decode_all(path: Path) -> np.ndarray:
    """Every frame of a video as rgb24, [F, H, W, 3]."""
    with av.open(str(path)) as container:
        return to_rgb(container.decode(video=0))
