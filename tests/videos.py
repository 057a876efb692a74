"""Synthetic test videos with known presentation timestamps, written with PyAV (real mp4 files)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np


def write_video(path: Path, pts_ms: list[int], size: tuple[int, int] = (64, 48), rate: int = 10,
                codec: str = "mpeg4") -> None:
    """An mp4 whose frame i is shown at pts_ms[i] milliseconds; frame i is a flat grey of value
    (20 * i) % 256 so tests can tell frames apart after decoding."""
    path.parent.mkdir(parents=True, exist_ok=True)
    width, height = size
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = Fraction(1, 1000)
        stream.codec_context.time_base = Fraction(1, 1000)
        for i, ms in enumerate(pts_ms):
            image = np.full((height, width, 3), (20 * i) % 256, dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = ms
            frame.time_base = Fraction(1, 1000)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
