"""Where an episode starts and ends, and which frames of a video file belong to it. Pure numpy.

One rule, used by `validate` (durations) and by the export (the grid), so the two never disagree:

* The episode **extent** `[start, end]` is closed: both ends are grid times a step may land on.
  `start_s` / `end_s` columns, where present, win (each on its own). Otherwise the `clock` stream's
  first and last cleaned sample; otherwise the first and last sample over all time-series streams;
  and only for an episode with no time-series stream at all (a camera-only export), the first and
  last frame over its video segments; an episode of static fields only (text, images, values) is the
  single point 0. Videos never widen an episode that has time series: a camera
  that starts before the robot's state would otherwise add anchors whose state is all padding.
* A video **segment** `[start_s, end_s)` of a file is half-open, as LeRobot v3's
  `[from_timestamp, to_timestamp)`: `to_timestamp` is the next episode's first frame, so the frame at
  `end_s` belongs to the next episode. A frame within `SEGMENT_EPS` of `end_s` counts as at `end_s`
  (LeRobot computes `to_timestamp` as `from + length / fps` in float64; the file gives `pts *
  time_base`: the two differ in the last bits).
"""

from __future__ import annotations

import numpy as np

SEGMENT_EPS = 1e-6  # s; far below any frame interval (1 ms at 1000 fps), far above float64 noise


class ExtentError(ValueError):
    """An episode whose extent cannot be decided or is empty (end before start)."""


def segment_frames(pts: np.ndarray, start_s: float | None, end_s: float | None) -> tuple[int, int]:
    """Index range [lo, hi) of the frames of `pts` ([F] sorted file times) inside [start_s, end_s)."""
    lo = 0 if start_s is None else int(np.searchsorted(pts, float(start_s) - SEGMENT_EPS, side="left"))
    hi = len(pts) if end_s is None else int(np.searchsorted(pts, float(end_s) - SEGMENT_EPS, side="left"))
    return lo, max(lo, hi)


def in_segment(file_t: np.ndarray, start_s: float | None, end_s: float | None) -> np.ndarray:
    """Whether file times `file_t` ([Q]) lie inside the half-open segment: [Q] bool."""
    inside = np.ones(file_t.shape, dtype=bool)
    if start_s is not None:
        inside &= file_t >= float(start_s) - SEGMENT_EPS
    if end_s is not None:
        inside &= file_t < float(end_s) - SEGMENT_EPS
    return inside


def segment_span(pts: np.ndarray, start_s: float | None, end_s: float | None,
                 clock_offset_s: float | None) -> tuple[float, float] | None:
    """Episode times of the first and last frame inside the segment (None if it holds no frame).

    A frame at file time `pts` sits at episode time `pts - start_s + clock_offset_s`."""
    lo, hi = segment_frames(pts, start_s, end_s)
    if hi <= lo:
        return None
    shift = float(clock_offset_s or 0.0) - float(start_s or 0.0)
    return float(pts[lo]) + shift, float(pts[hi - 1]) + shift


def episode_extent(declared_start: float | None, declared_end: float | None,
                   series: dict[str, tuple[float, float]], clock: str | None,
                   cameras: list[tuple[float, float]]) -> tuple[float, float]:
    """[start, end] of one episode (see the module docstring for the rule).

    `series`: field -> (first, last) cleaned sample time of each time-series stream that counts (the
    exported ones, or every one in `validate`); `cameras`: (first, last) episode time of each video
    segment's frames. Raises ExtentError with a reason and the fix."""
    if clock is not None and clock in series:
        spans = [series[clock]]
    elif series:
        spans = list(series.values())
    else:
        spans = list(cameras)
    # an episode of static fields only (text, images, values) has no time: one grid point at 0
    start = float(declared_start) if declared_start is not None else min((a for a, _ in spans), default=0.0)
    end = float(declared_end) if declared_end is not None else max((b for _, b in spans), default=start)
    if not end >= start:
        raise ExtentError(f"the episode ends ({end}) before it starts ({start}); check start_s / end_s")
    return start, end
