"""A label's segment -> the store's video struct and episode extent, from the file's real frame times. Pure numpy.

The video struct's `start_s` / `end_s` are the half-open segment `[start_s, end_s)` in the file's own
clock (docs/store.md): a label in seconds gives them as written; a label in frames gives the pts of its
first frame and of the frame after its last (None when it runs to the file's end), so the segment holds
exactly the frames `[start, end)` of the decoded sequence. An absent start or end stays None (from the
file's first frame, to its last). A frame at file time `pts` sits at episode time `pts - start_s` (`pts`
when start_s is None: a whole clip keeps the file's clock).

The extent. A camera-only episode's extent is its first and last frame (export/core/extent.py), and its
grid `first + k / fps` keeps the points up to the last frame. Containers store pts in a time base
(1 ms in webm): the last of n frames at 15 fps lies at `first + 15.933` s while its grid point is
`first + 15.9333...` s, 0.33 ms later, so the grid held n - 1 points and the segment's last frame got no
window. `grid_extent` therefore gives the episode an explicit extent (the reserved `start_s` / `end_s`
columns), with the end put on the grid point of the last frame when the two differ by no more than
the clock's resolution (one time-base step: the difference of two rounded pts); a real gap (variable
frame rate, dropped frames) is larger and is kept as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from robowds.export.core.extent import segment_frames


class SegmentError(ValueError):
    """A segment that holds no frame or reaches outside its video; carries the fix."""

    def __init__(self, reason: str, hint: str) -> None:
        super().__init__(reason)
        self.reason, self.hint = reason, hint


@dataclass(frozen=True)
class Segment:
    start_s: float | None  # the video struct's segment, file clock, half-open
    end_s: float | None
    lo: int  # the frames [lo, hi) of the file that the segment holds
    hi: int


def frame_period(pts: np.ndarray, fps: float) -> float:
    """The file's frame interval: the median of its pts steps ([F] sorted), 1 / fps for one frame."""
    return float(np.median(np.diff(pts))) if len(pts) > 1 else 1.0 / fps


def file_segment(start: float | int | None, end: float | int | None, unit: str, pts: np.ndarray,
                 fps: float) -> Segment:
    """The segment of a label (`unit` "s": seconds in the file's clock; "frames": 0-based frame numbers,
    end exclusive) over a video whose frames are at `pts` ([F] sorted seconds). Raises SegmentError for
    a segment that holds no frame or reaches outside the video by more than half a frame."""
    count = len(pts)
    if unit == "frames":
        lo = 0 if start is None else int(start)
        hi = count if end is None else int(end)
        if not 0 <= lo < hi <= count:
            raise SegmentError(f"frames [{lo}, {hi}) are outside the video, which has frames [0, {count})",
                               "fix the label's start/end (0-based frame numbers, end exclusive)")
        return Segment(None if start is None else float(pts[lo]), None if hi == count else float(pts[hi]), lo, hi)
    period = frame_period(pts, fps)
    first, after = float(pts[0]), float(pts[-1]) + period  # the frames show over [first, after)
    slack = period / 2  # labels written to a few decimals, or a pts rounded to the time base
    start_s = None if start is None else float(start)
    end_s = None if end is None else float(end)
    lo, hi = segment_frames(pts, start_s, end_s)
    outside = ((start_s is not None and (start_s < first - slack or start_s >= after))
               or (end_s is not None and end_s > after + slack) or hi <= lo)
    if outside:
        empty = "" if hi > lo else ", and holds no frame"
        raise SegmentError(f"segment [{start_s}, {end_s}) s is outside the video, whose frames cover "
                           f"[{first:.6f}, {after:.6f}) s ({count} frames){empty}",
                           "fix the label's start/end (seconds in the video's own clock; --time-unit frames "
                           "for frame numbers)")
    return Segment(start_s, end_s, lo, hi)


def grid_extent(pts: np.ndarray, segment: Segment, fps: float, resolution: float) -> tuple[float, float]:
    """The episode extent [start, end] (episode time) of the segment's frames on the grid `start + k / fps`.

    `pts` [F] sorted file times; `resolution`: the pts clock's step (the stream's time base, s). Start is
    the first frame; end is the last frame, or the grid point it belongs to when within `resolution`
    of it (module docstring)."""
    shift = -float(segment.start_s or 0.0)
    first, last = float(pts[segment.lo]) + shift, float(pts[segment.hi - 1]) + shift
    steps = round((last - first) * fps)
    on_grid = first + steps / fps
    return first, (on_grid if abs(on_grid - last) <= resolution + 1e-9 else last)
