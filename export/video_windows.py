"""Camera windows: frames chosen by real pts for every window step, decoded in one forward pass.

Memory stays bounded: windows are built chunk by chunk in anchor order, the decoder only moves
forward, and only frames some step of the current chunk needs are kept (earlier ones are dropped as
soon as no later window can need them). No seeking, no per-window decoding.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from export.video import VideoError, probe_video, select_frames

ENCODINGS = ("raw", "jpg", "mp4")
MP4_CODEC = "mpeg4"  # byte-reproducible across runs (libx264 is not: see reference/interop.md)
MP4_BITS_PER_PIXEL = 0.6
JPEG_QUALITY = 90


@dataclass(frozen=True)
class VideoOptions:
    selection: str = "nearest"  # nearest | causal
    encoding: str = "jpg"  # raw | jpg
    resize: tuple[int, int] | None = None  # (width, height)
    pad: str = "zero"


class VideoWindows:
    """Frames of one episode's video for batches of window steps, from a single sequential decode."""

    def __init__(self, path: Path, meta: dict[str, Any], options: VideoOptions) -> None:
        self.path, self.options = path, options
        self.info = probe_video(path)
        self.start_s = float(meta.get("start_s") or 0.0)
        self.end_s = meta.get("end_s")
        self.offset_s = float(meta.get("clock_offset_s") or 0.0)
        self._frames: dict[int, np.ndarray] = {}  # frame index -> [H, W, 3] uint8
        self._decoder: Iterator[tuple[int, Any]] | None = None
        self._next = 0  # index of the next frame the decoder will produce
        height, width, _ = self.shape
        if options.encoding == "mp4" and (width % 2 or height % 2):
            raise VideoError(f"{path.name}: mp4 encoding needs an even frame size, got {width}x{height}; "
                             "set resize: [width, height]")

    def span(self) -> tuple[float, float]:
        """Episode times of the first and last frame inside the segment."""
        first = max(float(self.info.pts[0]), self.start_s)
        last = float(self.info.pts[-1]) if self.end_s is None else min(float(self.info.pts[-1]), float(self.end_s))
        return first - self.start_s + self.offset_s, last - self.start_s + self.offset_s

    @property
    def shape(self) -> tuple[int, int, int]:
        width, height = self.options.resize or (self.info.width, self.info.height)
        return height, width, 3

    def frames(self, query: np.ndarray, extent: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
        """(frames [W, n, H, W, 3] uint8, valid [W, n]) for episode times `query` [W, n]."""
        file_t = query.ravel() - self.offset_s + self.start_s  # episode clock -> file clock
        index, valid = select_frames(self.info.pts, file_t, self.options.selection)
        valid &= (query.ravel() >= extent[0] - 1e-9) & (query.ravel() <= extent[1] + 1e-9)
        valid &= file_t >= self.start_s - 1e-9
        if self.end_s is not None:
            valid &= file_t <= float(self.end_s) + 1e-9
        needed = set(index.tolist())
        self._advance(max(needed), needed)
        lowest = min(needed)
        for stale in [i for i in self._frames if i < lowest]:
            del self._frames[stale]  # windows move forward: nothing later needs these
        out = np.stack([self._frames[i] for i in index.tolist()])  # [W*n, H, W, 3]
        if self.options.pad == "zero":
            out[~valid] = 0
        return out.reshape(query.shape + self.shape), valid.reshape(query.shape)

    def _advance(self, last: int, needed: set[int]) -> None:
        if self._decoder is None:
            self._decoder = self._decode()
        while self._next <= last:
            item = next(self._decoder, None)
            if item is None:
                raise VideoError(f"{self.path.name}: decoding ended before frame {last} "
                                 f"({len(self.info.pts)} frames listed by the container)")
            i, frame = item
            self._next = i + 1
            if i in needed:  # convert (and resize) only the frames some window uses
                width, height = self.options.resize or (None, None)
                self._frames[i] = frame.to_ndarray(format="rgb24", width=width, height=height)

    def _decode(self) -> Iterator[tuple[int, Any]]:
        """Decoded frames in presentation order, numbered as in `info.pts` (single-threaded)."""
        import av

        with av.open(str(self.path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "NONE"
            base = float(stream.time_base)
            pts_index = {round(p, 9): k for k, p in enumerate(self.info.pts.tolist())}
            try:
                for frame in container.decode(stream):
                    k = pts_index.get(round(frame.pts * base, 9)) if frame.pts is not None else None
                    if k is None:
                        continue
                    yield k, frame
            except av.FFmpegError as exc:
                raise VideoError(f"{self.path.name}: decoding failed after frame {self._next - 1}: {exc}") from exc

    def encode(self, frames: np.ndarray, rate_hz: float) -> tuple[str, bytes]:
        """One window's frames [n, H, W, 3] as a member (suffix without the field name, bytes)."""
        if self.options.encoding == "raw":
            from reader.format import encode_npy
            return "npy", encode_npy(frames)
        if self.options.encoding == "mp4":
            return "mp4", encode_mp4(frames, rate_hz)
        return "jpgs.msgpack", encode_jpegs(frames)


def encode_mp4(frames: np.ndarray, rate_hz: float) -> bytes:
    """A short mp4 clip (MPEG-4 part 2, yuv420p, single-threaded): its first frame is a keyframe, so
    the reader decodes a window without seeking. Frame i has pts i at time base 1/rate."""
    from fractions import Fraction

    import av

    height, width = frames.shape[1:3]
    rate = Fraction(rate_hz).limit_denominator(1000)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4", options={"fflags": "+bitexact"}) as container:
        stream = container.add_stream(MP4_CODEC, rate=rate, options={"flags": "+bitexact"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.thread_count = 1
        stream.bit_rate = int(max(100_000, MP4_BITS_PER_PIXEL * width * height * float(rate)))
        for i, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 arrays, in dB (capped at 100 for identical arrays)."""
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return 100.0 if mse == 0 else min(100.0, 10 * np.log10(255.0 ** 2 / mse))


def encode_jpegs(frames: np.ndarray) -> bytes:
    """A msgpack list of JPEG images (Pillow, fixed quality, no metadata: deterministic bytes)."""
    import msgpack
    from PIL import Image

    blobs = []
    for frame in frames:
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, format="JPEG", quality=JPEG_QUALITY)
        blobs.append(buf.getvalue())
    return msgpack.packb(blobs, use_bin_type=True)
