"""Per-step image sequences (RLDS, HDF5, ROS) -> one video file per episode, without waste.

- JPEG frames are muxed as MJPEG packets byte for byte (no decode, no re-encode: the decoded frames are
  the source's own JPEG decodes, bit-exact);
- raw frames are encoded losslessly with FFV1 (bgr0: this FFmpeg build has no 8-bit planar RGB for
  FFV1), or with a chosen lossy codec.

Container: Matroska with FFmpeg's `+bitexact` flag (without it the muxer writes a random segment id and
the same frames give different files). Matroska's time base is 1 ms, so each frame's pts is its step
time rounded to the millisecond (0.5 ms at most from the step time: far below any frame period, so
`nearest` frame selection returns the right frame). Step times must be strictly increasing once rounded.
"""

from __future__ import annotations

import itertools
import os
from fractions import Fraction
from pathlib import Path
from typing import Iterable, Sequence

import av
import numpy as np

TIME_BASE = Fraction(1, 1000)  # Matroska's
BITEXACT = {"fflags": "+bitexact"}
LOSSLESS_CODECS = ("ffv1",)
LOSSY_CODECS = ("mpeg4", "libsvtav1", "mjpeg")


def _pts_ms(times_s: np.ndarray, path: Path) -> np.ndarray:
    """Step times (float64 seconds, [T]) -> integer ms, checked strictly increasing."""
    times = np.asarray(times_s, np.float64)
    pts = np.rint((times - times[0]) * 1000.0).astype(np.int64) if len(times) else np.zeros(0, np.int64)
    if len(pts) > 1 and np.any(np.diff(pts) <= 0):
        k = int(np.argmin(np.diff(pts)))
        raise ValueError(f"{path}: frame times {times[k]:.6f} s and {times[k + 1]:.6f} s are not 1 ms apart "
                         "(Matroska stores ms): frames must be strictly increasing in time")
    return pts


def mux_jpegs(jpegs: Sequence[bytes], times_s: np.ndarray, path: Path, width: int, height: int) -> float:
    """Write `jpegs` ([T] JPEG files as bytes) as an MJPEG Matroska file at `path`, pts = `times_s`
    (relative to times_s[0]); returns the first frame's time (the video's `clock_offset_s`)."""
    pts = _pts_ms(times_s, path)
    with av.open(str(path), "w", format="matroska", options=BITEXACT) as out:
        stream = out.add_stream("mjpeg", rate=_nominal_rate(times_s))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuvj420p"
        stream.time_base = TIME_BASE
        for data, p in zip(jpegs, pts):
            packet = av.Packet(bytes(data))
            packet.stream, packet.pts, packet.dts, packet.time_base = stream, int(p), int(p), TIME_BASE
            packet.is_keyframe = True
            out.mux(packet)
    return float(times_s[0]) if len(times_s) else 0.0


def encode_frames(frames: Iterable[np.ndarray], times_s: np.ndarray, path: Path, codec: str = "ffv1") -> float:
    """Encode `frames` (an array [T, H, W, 3] or an iterable of [H, W, 3], uint8 RGB: an iterable lets a
    long episode stream from its source instead of sitting in memory whole) into a Matroska file at
    `path`, pts = `times_s` (relative to times_s[0]); FFV1 is lossless, a lossy codec trades exactness
    for size. Returns the first frame's time (the video's `clock_offset_s`)."""
    if codec not in LOSSLESS_CODECS + LOSSY_CODECS:
        raise ValueError(f"unknown codec {codec!r}; choose one of {LOSSLESS_CODECS + LOSSY_CODECS}")
    pts = _pts_ms(times_s, path)
    frames = iter(frames)
    first = next(frames, None)
    if first is None:
        raise ValueError(f"{path}: no frames to encode")
    height, width = first.shape[:2]
    if codec == "libsvtav1":
        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1's banner (~30 lines per file) stays quiet, as in clips.py
    with av.open(str(path), "w", format="matroska", options=BITEXACT) as out:
        stream = out.add_stream(codec, rate=_nominal_rate(times_s))
        stream.width, stream.height = width, height
        stream.pix_fmt = {"ffv1": "bgr0", "mjpeg": "yuvj420p"}.get(codec, "yuv420p")
        stream.time_base = TIME_BASE
        stream.codec_context.flags |= av.codec.context.Flags.bitexact
        stream.codec_context.thread_count = 1  # same bytes on any machine
        if codec == "ffv1":
            stream.codec_context.options = {"level": "3", "slicecrc": "1"}
        for image, p in zip(itertools.chain([first], frames), pts):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24").reformat(format=stream.pix_fmt)
            frame.pts, frame.time_base = int(p), TIME_BASE
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return float(times_s[0]) if len(times_s) else 0.0


def _nominal_rate(times_s: np.ndarray) -> Fraction:
    """The container's nominal frame rate: the median step, to the ms (pts carry the real times)."""
    times = np.asarray(times_s, np.float64)
    if len(times) < 2:
        return Fraction(30)
    step = float(np.median(np.diff(times)))
    return Fraction(round(1.0 / step * 1000), 1000) if step > 0 else Fraction(30)
