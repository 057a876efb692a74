"""Window geometry: the episode grid, anchors, per-stream query times, padding. Pure numpy.

The grid of an episode is `t_k = start + k / fps` for integer k in [0, K) with K the number of grid
points inside [start, end]. A window at anchor k samples stream s at
`start + k / fps + offset_s + j / rate_hz` for j in [0, steps): every time is computed from integers,
never accumulated, so windows of one anchor are identical however the anchors are batched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StreamWindow:
    """How one time-series field is windowed: `steps` samples at `rate_hz` from anchor + `offset_s`."""

    rate_hz: float
    duration_s: float
    offset_s: float
    pad: str
    steps: int
    max_gap_s: float | None
    interpolation: str



SNAP_TOLERANCE_S = 1e-4  # LeRobot's default `tolerance_s` for delta_timestamps: 3.3e-5 s off at -0.0333 (-1/30)


def snap_to_step(value_s: float, rate_hz: float, tolerance_s: float = SNAP_TOLERANCE_S) -> float:
    """`k / rate_hz` when `value_s` lies within `tolerance_s` of that whole number of steps, else
    `value_s` unchanged.

    Why: offsets and durations written with a few decimals (`-0.0333` for -1/30 s) would otherwise
    put every query 33 us off the frames and be interpolated between two of them; LeRobot takes such
    deltas as whole frames. The snapped value is computed, not accumulated, so snapping it again gives
    the same float (the manifest's resolved config re-resolves to itself)."""
    scaled = value_s * rate_hz
    if not math.isfinite(scaled):  # 1e300 s: no whole step to speak of (and round() would raise)
        return value_s
    steps = round(scaled)
    exact = steps / rate_hz
    return exact if abs(value_s - exact) <= tolerance_s else value_s


def grid_frame_count(start: float, end: float, fps: float, resolution: float = 0.0) -> int:
    """Number of grid points start + k/fps that lie in [start, end] (at least 1).

    A grid point within 1e-6 frames, or within 2 x `resolution` seconds (how finely the clock that gave
    `start` and `end` is stored: 238 ns for float64 epoch seconds; `Stream.tolerance`), before `end` counts."""
    if end < start:
        return 0
    return int(math.floor((end - start) * fps + max(1e-6, 2.0 * resolution * fps))) + 1


def anchor_frames(frame_count: int, stride: int) -> np.ndarray:  # [W] int64
    return np.arange(0, frame_count, stride, dtype=np.int64)


def query_times(start: float, fps: float, anchors: np.ndarray, window: StreamWindow) -> np.ndarray:
    """Sample times of `window` for each anchor: [W, steps] float64."""
    steps = np.arange(window.steps, dtype=np.float64) / window.rate_hz  # [n]
    anchor_t = start + anchors.astype(np.float64) / fps + window.offset_s  # [W]
    return anchor_t[:, None] + steps[None, :]


def pad_invalid(values: np.ndarray, valid: np.ndarray, pad: str) -> np.ndarray:
    """Replace invalid steps with zeros (`zero`) or keep the resampler's edge values (`edge`).

    values [W, n, N], valid [W, n] -> [W, n, N]
    """
    if pad == "edge":
        return values
    out = values.copy()
    out[~valid] = 0
    return out


def valid_fraction(masks: list[np.ndarray]) -> np.ndarray:
    """Fraction of real steps over all time-series steps of each window: list of [W, n_s] -> [W]."""
    if not masks:
        return np.ones(0)
    total = sum(m.shape[1] for m in masks)
    return sum(m.sum(axis=1) for m in masks) / total
