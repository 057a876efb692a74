"""Camera windows: frames chosen by real pts for every window step, decoded in one forward pass.

Memory stays bounded: windows are built chunk by chunk in anchor order and the decoder only moves
forward. Before decoding, every chunk's frame choice is registered with `expect`, so the decoder
converts (crop, resize: export/media/planes.py) and keeps exactly the frames some window will use, and
drops each one once no later window can need it. One seek at most (an episode that is a segment
of a longer file starts at the keyframe before it), no per-window decoding.

A frame is in several windows when windows overlap (2 frames of history at stride 1: every frame is
in 2 windows), so what a window's member is made of is computed once per frame and reused: the JPEG
bytes of a frame (`jpg`), its yuv420p picture for the clip encoders (`mp4`, `av1`), its intra packet
(`mp4-intra`: a window is then only muxed). Windows are assembled from frame indices; a chunk's
frames are never stacked or copied as a whole. For `jpg` a held frame is swscale's RGBX output itself
([H, W, 4], the 4th byte unused), which Pillow encodes without a copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from robowds.export.core.extent import in_segment, segment_frames, segment_span
from robowds.export.media.clips import AV1_MIN_SIZE, IntraClips, encode_clip, pack_jpegs, to_yuv420p
from robowds.export.media.frames import RangedFile, VideoError, VideoSizeError, open_container, probe_video, select_frames
from robowds.export.media.geometry import Crop, CropError, crop_box, output_size
from robowds.export.media.images import jpeg_bytes
from robowds.export.media.planes import FrameConverter

ENCODINGS = ("raw", "jpg", "mp4", "mp4-intra", "av1")
MEMBER_EXT = {"raw": "npy", "jpg": "jpgs.msgpack", "mp4": "mp4", "mp4-intra": "mp4", "av1": "mp4"}  # .mp4: PyAV
PAD = -1  # the frame index of a zero-padded step, for the per-frame member parts


SEEK_TRIES = 3  # keyframes tried, latest first, before decoding from the file's start


class _SeekMissed(Exception):
    """The seek to a keyframe did not land on one at or before the wanted frame."""


@dataclass(frozen=True)
class VideoOptions:
    selection: str = "nearest"  # nearest | causal
    encoding: str = "jpg"  # raw | jpg | mp4 | mp4-intra | av1
    resize: tuple[int, int] | None = None  # (width, height)
    pad: str = "zero"
    crop: Crop = None  # None | "center" | (width, height), applied before the resize


class VideoWindows:
    """Frames of one episode's video for batches of window steps, from a single sequential decode."""

    def __init__(self, path: Path | RangedFile, meta: dict[str, Any], options: VideoOptions) -> None:
        self.path, self.options = path, options
        self.info = probe_video(path)
        self.start_s = float(meta.get("start_s") or 0.0)
        self.end_s = None if meta.get("end_s") is None else float(meta["end_s"])
        self.offset_s = float(meta.get("clock_offset_s") or 0.0)
        # frames [lo, hi) of the file are this episode's: the segment is half-open (export/core/extent.py)
        self._lo, self._hi = segment_frames(self.info.pts, self.start_s, self.end_s)
        if self._hi <= self._lo:
            raise VideoError(f"its segment [{self.start_s}, {self.end_s}) s holds no frame (the file's frames "
                             f"run from {self.info.pts[0]:.6f} to {self.info.pts[-1]:.6f} s)")
        # the whole file's frame interval: a segment of one or two frames has no interval of its own
        self._period = float(np.median(np.diff(self.info.pts))) if len(self.info.pts) > 1 else np.inf
        self._span_end = self.info.span_end  # file time of the last frame the container declares (a median)
        # frame index -> [H, W, 3] uint8, [H, W, 4] RGBX (jpg) or a yuv420p VideoFrame (mp4-intra): `_held`
        self._frames: dict[int, Any] = {}
        # frame index -> what members are made of (JPEG bytes, a yuv420p VideoFrame, or an intra packet),
        # made once per frame and dropped with the frame; PAD: the zero frame's
        self._parts: dict[int, Any] = {}
        self._wanted = np.zeros(len(self.info.pts), dtype=bool)  # [F] frames some window uses
        self._decoder: Iterator[tuple[int, Any]] | None = None
        self._next = 0  # index of the next frame the decoder will produce
        self._converter: FrameConverter | None = None  # made at the first frame (needs its pixel format)
        self._yuv: Any = None  # one swscale context for rgb -> yuv420p (clip encodings)
        self._intra: IntraClips | None = None  # mp4-intra: the video's one encoder
        self.peak_frames = 0  # most decoded frames held at once: the memory bound, reported per camera
        self.decoded_frames = 0  # frames the decoder produced (from the seek point on)
        self.missed_seeks = 0  # seeks that did not land on a keyframe at or before the wanted frame
        self.span_steps = 0  # window steps inside the video's own span (see _count_missing)
        self.missing_steps = 0  # of those, steps with no frame: frames missing from the file
        try:
            self._box = crop_box(self.info.width, self.info.height, options.crop, options.resize)
        except CropError as exc:
            raise VideoSizeError(str(exc)) from exc
        self._check_size()

    def _check_size(self) -> None:
        """The encoders' size limits, on the stored (cropped, resized) size."""
        height, width, _ = self.shape
        if self.options.encoding in ("mp4", "mp4-intra") and (width % 2 or height % 2):
            raise VideoSizeError(f"{self.options.encoding} encoding needs an even frame size, got {width}x{height}; "
                             "set resize: [width, height] (or an even crop)")
        if self.options.encoding == "av1" and min(width, height) < AV1_MIN_SIZE:
            raise VideoSizeError(f"av1 encoding needs frames of at least {AV1_MIN_SIZE}x{AV1_MIN_SIZE} "
                             f"pixels, got {width}x{height}; set a larger resize or use encoding raw or jpg")

    def span(self) -> tuple[float, float]:
        """Episode times of the first and last frame inside the segment."""
        span = segment_span(self.info.pts, self.start_s, self.end_s, self.offset_s)
        assert span is not None  # __init__ refused an empty segment
        return span

    @property
    def shape(self) -> tuple[int, int, int]:
        """(height, width, 3) of the stored frames: after crop and resize."""
        width, height = output_size(self.info.width, self.info.height, self.options.crop, self.options.resize)
        return height, width, 3

    def _file_times(self, query: np.ndarray) -> np.ndarray:
        """Episode times (any shape) -> times in the video file's clock, flattened: [Q]."""
        return query.ravel() - self.offset_s + self.start_s

    def _choose(self, file_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Frame index and validity ([Q] each) for file times `file_t` [Q], among this segment's frames
        only: the next episode's first frame (at `end_s`) is never chosen, even when it is the nearest."""
        tolerance = self._period if self.options.selection == "causal" else self._period / 2
        index, valid = select_frames(self.info.pts[self._lo:self._hi], file_t, self.options.selection, tolerance)
        return index + self._lo, valid & in_segment(file_t, self.start_s, self.end_s)

    def _select(self, query: np.ndarray, extent: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
        """Frame index and validity (both [Q]) for episode times `query` (any shape, flattened)."""
        index, valid = self._choose(self._file_times(query))
        valid &= (query.ravel() >= extent[0] - 1e-9) & (query.ravel() <= extent[1] + 1e-9)
        return index, valid

    def expect(self, query: np.ndarray) -> None:
        """Register times [W, n] that a later `frames` call will ask for, before any frames are decoded.

        Needed because chunks overlap in frame index: when windows are longer than the anchor spacing
        and their steps fall between the grid's, a later chunk can need a frame that lies before the
        current chunk's last one but that no window of the current chunk uses."""
        index, _ = self._choose(self._file_times(query))
        self._wanted[index] = True

    def select(self, query: np.ndarray, extent: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
        """(frame index [W, n] int64, valid [W, n]) for episode times `query` [W, n], with every chosen
        frame decoded and held, and the frames no later window can use dropped. `window` and `encode`
        then build each window from its row of indices."""
        index, valid = self._select(query, extent)
        self._count_missing(query.ravel(), valid, extent)
        self._wanted[index] = True  # callers that did not `expect` still get this chunk's frames
        lowest = int(index.min())
        for stale in [i for i in self._frames if i < lowest]:
            del self._frames[stale]  # windows move forward: nothing later needs these
            self._parts.pop(stale, None)
        self._advance(int(index.max()))
        return index.reshape(query.shape), valid.reshape(query.shape)

    def window(self, index: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """One window's frames [n, H, W, 3] uint8 from its row of `select` (index [n], valid [n]):
        padded steps are zeros (`pad: zero`) or the edge frame the selection chose (`pad: edge`)."""
        zero = self.options.pad == "zero"
        out = np.empty((len(index),) + self.shape, dtype=np.uint8)  # [n, H, W, 3]
        for j, (i, real) in enumerate(zip(index.tolist(), valid.tolist())):
            if zero and not real:
                out[j] = 0
            else:
                out[j] = self._rgb(i)
        return out

    def _count_missing(self, query: np.ndarray, valid: np.ndarray, extent: tuple[float, float]) -> None:
        """Count steps ([Q] episode times) inside the video's own span, its segment and the extent that
        got no frame: frames missing from the file (a hole in the timestamps, or a truncated file whose
        index lists frames that are gone), as opposed to steps simply outside the video."""
        file_t = self._file_times(query)
        half = self._period / 2 if np.isfinite(self._period) else 0.0
        inside = ((file_t >= self.info.pts[self._lo] - half) & (file_t <= self._span_end + half)
                  & in_segment(file_t, self.start_s, self.end_s)
                  & (query >= extent[0] - 1e-9) & (query <= extent[1] + 1e-9))
        self.span_steps += int(inside.sum())
        self.missing_steps += int((inside & ~valid).sum())

    def _advance(self, last: int) -> None:
        """Decode up to frame `last`, keeping (converted) only the frames some window wants."""
        if self._decoder is None:
            self._decoder = self._decode()
        while self._next <= last:
            item = next(self._decoder, None)
            if item is None:
                raise VideoError(f"{self.path.name}: decoding ended before frame {last} "
                                 f"({len(self.info.pts)} frames listed by the container)")
            i, frame = item
            self._next = i + 1
            if self._wanted[i]:
                self._frames[i] = self._held(frame)
                self.peak_frames = max(self.peak_frames, len(self._frames))

    def _held(self, frame: Any) -> Any:
        """A decoded frame -> what is held of it: the stored uint8 [H, W, 3] (crop, resize, colour
        conversion: planes.py), [H, W, 4] RGBX for jpg, or for mp4-intra the scaled yuv420p picture
        itself where it can go to the encoder as it is (`_encodable`), which skips RGB and back. One
        converter (its swscale contexts and crop filter) serves every frame of the video."""
        if self._converter is None:
            self._converter = FrameConverter(self.info.width, self.info.height, frame.format.name, self._box,
                                             self.options.resize, rgbx=self.options.encoding == "jpg")
        if self.options.encoding == "mp4-intra":
            scaled = self._converter.scaled(frame)
            if scaled is not None and _encodable(scaled):
                return scaled
        return self._converter(frame)

    def _rgb(self, i: int) -> np.ndarray:
        """Held frame `i` as stored RGB [H, W, 3] (a view for RGB and RGBX)."""
        held = self._frames[i]
        if isinstance(held, np.ndarray):
            return held[..., :3]
        assert self._converter is not None
        return self._converter.to_rgb(held)

    def _decode(self) -> Iterator[tuple[int, Any]]:
        """Decoded frames in presentation order, numbered as in `info.pts` (single-threaded), from the
        last keyframe before the first frame any window wants: an episode that is a late segment of a
        long file (LeRobot v3) does not decode the episodes before it (scripts/bench_segments.py:
        without the seek, 40 segments of one file exported 8.4x slower than 40 files).

        Frames decoded from a keyframe are the frames a decode from the file's start gives (a keyframe
        is a random access point; the frames before it in presentation order are never used). The seek
        is checked: the first frame out must be a keyframe at or before the wanted one, else (a
        container whose seek lands later, e.g. one that seeks by dts) the keyframe before is tried, and
        after SEEK_TRIES the decode starts from the file's start."""
        first = int(np.argmax(self._wanted)) if self._wanted.any() else self._lo
        for seek in self.info.seek_points(first)[:SEEK_TRIES]:  # a seek that lands late: the keyframe before
            try:
                yield from self._decode_from(seek, first)
                return
            except _SeekMissed:
                self.missed_seeks += 1
        yield from self._decode_from(None, first)

    def _decode_from(self, seek: tuple[int, int] | None, first: int) -> Iterator[tuple[int, Any]]:
        import av

        with open_container(self.path) as container:
            stream = container.streams.video[0]
            stream.thread_type = "NONE"
            stream.codec_context.thread_count = 1  # libdav1d threads on its own unless told
            base = float(stream.time_base)
            try:
                if seek is not None:
                    container.seek(seek[0], stream=stream, backward=True, any_frame=False)
                checked = seek is None
                for frame in container.decode(stream):
                    k = self.info.index_of(frame.pts * base) if frame.pts is not None else None
                    if k is None:
                        continue
                    if not checked:
                        if k > first or not self.info.is_keyframe(k):
                            raise _SeekMissed  # nothing yielded yet: the caller tries an earlier start
                        checked = True
                    self.decoded_frames += 1
                    yield k, frame
            except av.FFmpegError as exc:
                if not checked:
                    raise _SeekMissed from exc
                raise VideoError(f"{self.path.name}: decoding failed after frame {self._next - 1}: {exc}") from exc

    def encode(self, index: np.ndarray, valid: np.ndarray, rate_hz: float) -> tuple[str, bytes]:
        """One window (its row of `select`: index [n], valid [n]) as a member: (suffix without the
        field name, bytes). Each frame's JPEG bytes or yuv420p picture is made once and reused by every
        window that holds the frame: the bytes are those of encoding the window's frames afresh."""
        encoding = self.options.encoding
        if encoding == "raw":
            from robowds.reader.format import encode_npy
            return MEMBER_EXT[encoding], encode_npy(self.window(index, valid))
        if encoding == "mp4-intra" and self._intra is None:  # the video's one encoder: one rate per camera
            height, width, _ = self.shape
            self._intra = IntraClips(width, height, rate_hz)
        parts = [self._part(i if real or self.options.pad != "zero" else PAD)
                 for i, real in zip(index.tolist(), valid.tolist())]
        if encoding == "jpg":
            return MEMBER_EXT[encoding], pack_jpegs(parts)
        if self._intra is not None:
            return MEMBER_EXT[encoding], self._intra.clip(parts)
        return MEMBER_EXT[encoding], encode_clip(parts, rate_hz, encoding)

    def _part(self, i: int) -> Any:
        """Frame `i`'s JPEG bytes (jpg), yuv420p VideoFrame (mp4, av1) or intra packet (mp4-intra), made
        on first use; PAD: the zero frame's."""
        part = self._parts.get(i)
        if part is None:
            held = np.zeros(self.shape, dtype=np.uint8) if i == PAD else self._frames[i]  # [H, W, 3|4] or yuv420p
            if self.options.encoding == "jpg":
                part = jpeg_bytes(held)
            elif isinstance(held, np.ndarray):
                if self._yuv is None:
                    from av.video.reformatter import VideoReformatter
                    self._yuv = VideoReformatter()
                part = to_yuv420p(held, self._yuv)
            else:
                part = held  # mp4-intra: the scaled planes, encoded as they are
            if self._intra is not None:
                part = self._intra.packet(part)
            self._parts[i] = part
        return part


# colour tags under which yuv420p planes mean what an untagged mp4 clip's decoders take them for
# (BT.601, limited range: also what RGB -> yuv420p gives); by FFmpeg's numbers
BT601_SPACES = (2, 5, 6)  # unspecified, BT470BG, SMPTE170M
LIMITED_RANGES = (0, 1)  # unspecified, MPEG


def _encodable(scaled: Any) -> bool:
    """Whether a scaled picture can go to the mp4-intra encoder without the RGB round trip: yuv420p with
    colour tags its clip's decoders read the same way (the clip carries no tags)."""
    return (scaled.format.name == "yuv420p" and int(scaled.colorspace) in BT601_SPACES
            and int(scaled.color_range) in LIMITED_RANGES)
