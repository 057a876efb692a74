"""Source videos: real presentation timestamps and frame selection on the grid by those timestamps.

Never `round(t * fps)`: containers lie about their rate (variable frame rate, dropped frames, a
declared fps that is not the real one), so frames are chosen by their decoded pts. Probing reads only
packets (no decoding), so it is cheap enough for `validate` to run on every video.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Protocol

import numpy as np

from robowds.export.core.resample import TIME_EPS

SELECTION_MODES = ("nearest", "causal")
# a camera lacking frames (holes, truncation) for more than this share of an episode's steps inside
# its span makes the episode an error; any share at all is a warning in the report
MISSING_FRAMES_LIMIT = 0.25
PTS_MATCH = 5e-10  # s: a decoded frame's pts and the probe's are the same ticks x time base


@dataclass(frozen=True)
class VideoInfo:
    pts: np.ndarray  # [F] float64 seconds in the file's clock, sorted (presentation order)
    declared_fps: float | None  # what the container says (average rate)
    width: int
    height: int
    codec: str
    listed_frames: int = 0  # frames the container's index lists (0: it does not say); > len(pts): truncated
    declared_end: float | None = None  # end of the stream by the container's duration, file clock
    time_base: float = 0.0  # the container's pts unit in seconds (Matroska/webm: 1 ms)
    # random access points, from the packets' key flags: where a decode may start (VideoWindows seeks
    # to the last one before an episode's segment instead of decoding the file from its start)
    keyframe_pts: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [K] float64 s, sorted
    keyframe_ticks: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # [K] the same, in pts units

    @property
    def span_end(self) -> float:
        """File time of the video's last frame as the container declares it: the last readable frame, or
        later when the index lists frames whose data is gone (a truncated file whose index is in front)."""
        last = float(self.pts[-1])
        if self.declared_end is None or len(self.pts) < 2:
            return last
        return max(last, self.declared_end - float(np.median(np.diff(self.pts))))

    def index_of(self, t: float) -> int | None:
        """The frame index whose pts is `t` (file seconds, as a decoded frame's pts x time base), or None."""
        k = int(np.searchsorted(self.pts, t, side="right")) - 1  # the last of equal pts, as before
        return k if k >= 0 and abs(self.pts[k] - t) <= PTS_MATCH else None

    def seek_points(self, frame: int) -> list[tuple[int, int]]:
        """(seek target in pts units, frame index) of the keyframes at or before frame `frame`, the
        latest first; empty when that is the file's first frame or the file lists no keyframe."""
        j = int(np.searchsorted(self.keyframe_pts, self.pts[frame] + PTS_MATCH, side="right"))
        points = []
        for t, ticks in zip(self.keyframe_pts[:j][::-1].tolist(), self.keyframe_ticks[:j][::-1].tolist()):
            k = self.index_of(t)
            if not k:  # the file's first frame (decode from the start) or a key packet without a frame
                break
            points.append((int(ticks), k))
        return points

    def is_keyframe(self, frame: int) -> bool:
        j = int(np.searchsorted(self.keyframe_pts, self.pts[frame] - PTS_MATCH))
        return j < len(self.keyframe_pts) and abs(self.keyframe_pts[j] - self.pts[frame]) <= PTS_MATCH

    @property
    def unreadable_frames(self) -> int:
        """Frames the container lists but whose packets cannot be read."""
        return max(0, self.listed_frames - len(self.pts))

    @property
    def measured_fps(self) -> float | None:
        """1 / the mean of the regular frame intervals: those within 5% (plus one pts unit) of the median.
        The median alone ignores gaps but not rounding: Matroska's ms pts give 30 Hz steps of 33 and
        34 ms, a median of 33 ms and a false 30.303 fps. None for fewer than 2 frames."""
        if len(self.pts) < 2:
            return None
        steps = np.diff(self.pts)  # [F-1]
        median = float(np.median(steps))
        regular = steps[np.abs(steps - median) <= 0.05 * median + self.time_base]
        return float(1.0 / regular.mean())


class VideoError(ValueError):
    """A video that cannot be opened or has no decodable video stream."""


class VideoReadError(VideoError):
    """A video whose bytes cannot be read (object storage: access denied, connection lost): the file
    may be fine, so the fix is access, not re-encoding."""

    hint = "check the store's credentials and permissions (--storage-options) and the connection"


class VideoSizeError(VideoError):
    """A video whose frames do not fit the configured crop or encoding: fixed in the config."""


class RangedFile(Protocol):
    """A media file of a store in object storage (export/store/location.py: StoreFile)."""

    name: str

    def open(self) -> Any: ...


@contextlib.contextmanager
def open_container(source: Path | RangedFile) -> Iterator[Any]:
    """A PyAV input container of a local file, or of a store file in object storage read through a
    seekable file object (ranged reads in blocks, never a whole download: PyAV seeks where the
    container needs it, e.g. to an mp4 index at the end). PyAV leaves a file object open: closed here."""
    import av  # lazy: only stores with video need PyAV

    if isinstance(source, (str, os.PathLike)):
        with av.open(os.fspath(source)) as container:
            yield container
        return
    try:
        fh = source.open()
    except OSError as exc:  # access denied, connection lost: the message names the URL
        raise VideoReadError(f"{source.name} cannot be read: {exc}") from exc
    with fh:
        try:
            with av.open(fh) as container:
                yield container
        except OSError as exc:  # a ranged read failed for good (PyAV hands the file object's error on)
            raise VideoReadError(f"{source.name} cannot be read: {exc}") from exc


def probe_video(path: Path | RangedFile) -> VideoInfo:
    """Presentation timestamps of every frame and the keyframes, from the packets (demux only, no
    decode). The last few probes of this process are kept (`_PROBES`): LeRobot v3 keeps hundreds of
    episodes in one mp4, and each episode's export would otherwise demux the whole file again."""
    key = _probe_key(path)
    info = _PROBES.pop(key, None) if key is not None else None
    if info is None:
        info = _probe(path)
    if key is not None:
        _PROBES[key] = info  # most recent last
        while len(_PROBES) > PROBES_KEPT:
            del _PROBES[next(iter(_PROBES))]
    return info


# Per-process memo of probes, least recently used first: at most PROBES_KEPT videos, each 8 bytes per
# frame plus 16 per keyframe (a LeRobot v3 file of ~500 MB holds ~50k frames: ~0.5 MB; a 1M-frame
# file ~8 MB). 16 covers an episode's cameras (one file each) with room to spare, so episodes in
# file order never re-probe. Keyed by path, size, mtime and inode, so a file rewritten in place is
# probed again; remote files by URL and size.
PROBES_KEPT = 16
_PROBES: dict[tuple[Any, ...], VideoInfo] = {}


def _probe_key(path: Path | RangedFile) -> tuple[Any, ...] | None:
    try:
        if isinstance(path, (str, os.PathLike)):
            st = os.stat(path)
            return (os.fspath(path), st.st_size, st.st_mtime_ns, st.st_ino)
        size = getattr(path, "size", None)
        return (str(path), size()) if size is not None else None
    except OSError:
        return None  # probing says what is wrong with it


def _probe(path: Path | RangedFile) -> VideoInfo:
    import av  # lazy: only stores with video need PyAV

    try:
        with open_container(path) as container:
            if not container.streams.video:
                raise VideoError(f"{path.name} has no video stream")
            stream = container.streams.video[0]
            base = float(stream.time_base)
            pts: list[int] = []
            keys: list[int] = []  # pts of key packets
            for p in container.demux(stream):
                if p.pts is not None and p.size > 0:
                    pts.append(p.pts)
                    if p.is_keyframe:
                        keys.append(p.pts)
            rate = stream.average_rate or stream.guessed_rate
            declared_end = (float((stream.start_time or 0) + stream.duration) * base
                            if stream.duration else None)
            keys.sort()
            info = VideoInfo(np.sort(np.asarray(pts, dtype=np.float64) * base),
                             float(rate) if rate else None, stream.codec_context.width,
                             stream.codec_context.height, stream.codec_context.name,
                             int(stream.frames or 0), declared_end, base,
                             np.asarray(keys, dtype=np.float64) * base, np.asarray(keys, dtype=np.int64))
    except av.FFmpegError as exc:
        raise VideoError(f"{path.name} cannot be read as a video: {exc}") from exc
    if not len(info.pts):
        raise VideoError(f"{path.name} has no frames")
    for array in (info.pts, info.keyframe_pts, info.keyframe_ticks):
        array.flags.writeable = False  # shared by every episode of the file (the memo above)
    return info


def select_frames(pts: np.ndarray, query: np.ndarray, mode: str = "nearest",
                  tolerance: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Frame index for each query time and whether it is real: (index [Q] int64, valid [Q] bool).

    `nearest`: the frame whose pts is closest (ties to the earlier), valid if within `tolerance`
    (default: half the median frame interval). `causal`: the latest frame with pts <= q, valid if it
    is less than one median interval old (or `tolerance`). Queries before the first frame or past the
    last one get the edge frame and valid = False, like any stream.
    """
    if mode not in SELECTION_MODES:
        raise ValueError(f"frame selection must be one of {SELECTION_MODES}, got {mode!r}")
    pts = np.asarray(pts, dtype=np.float64)
    q = np.asarray(query, dtype=np.float64)  # [Q]
    period = float(np.median(np.diff(pts))) if len(pts) > 1 else np.inf
    before = np.searchsorted(pts, q + TIME_EPS, side="right") - 1  # latest frame at or before q
    if mode == "causal":
        index = np.clip(before, 0, len(pts) - 1)
        limit = period if tolerance is None else tolerance
        valid = (before >= 0) & (q - pts[index] < limit - TIME_EPS)
        return index.astype(np.int64), valid
    lo = np.clip(before, 0, len(pts) - 1)
    hi = np.clip(before + 1, 0, len(pts) - 1)
    index = np.where(np.abs(pts[hi] - q) < np.abs(q - pts[lo]), hi, lo)
    limit = period / 2 if tolerance is None else tolerance
    valid = np.abs(pts[index] - q) <= limit + TIME_EPS
    return index.astype(np.int64), valid
