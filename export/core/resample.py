"""Resampling one stream onto arbitrary query times, without extrapolation.

Pure numpy, no I/O. The policy (SPEC, "Resampling policy"):

* Times are float64 seconds. Two times at most `tolerance` apart count as equal: `TIME_EPS` (1 ns), or
  twice the resolution of the stream's own stored clock where that is coarser (`Stream.resolution`:
  float64 times near 1.3e9 s, Unix epoch seconds, are only stored to 238 ns),
  so a grid time computed as `t0 + k / fps` that lands a rounding step past a sample still selects it.
  The export resamples on times relative to the episode's start (`Stream.shifted`), computed once by an
  exact subtraction, so a store and the same store shifted by 1.3e9 s give the same windows.
* `clean_stream` turns a raw stream (`[T, N+1]` rows, or a `RawSeries`: times and typed values
  apart) into strictly increasing times: rows with a non-finite
  time or any NaN or infinite value are dropped (missing samples), as are a slerp stream's zero-norm
  quaternions (no rotation), unsorted rows are stably sorted, rows with an
  exactly duplicated time collapse to the last one. Every repair is counted. A stream whose times are
  all equal, or with fewer than 2 valid samples, is rejected (naming the zero-norm quaternions when
  those are what is missing, not the timestamps).
* `resample` evaluates the stream at query times with `linear`, `slerp`, `hold` or `nearest`:
    - before the first sample / after the last: the first / last value, valid = False;
    - strictly inside a gap longer than `max_gap` (default 2.5 x the median period): the value of the
      sample before the gap (hold), valid = False;
    - at a sample time (within the stream's `tolerance`): that sample, valid = True, whatever the method.
  `hold` and `nearest` return stored samples, so integer and bool values keep their dtype and exact
  value; `linear` and `slerp` compute in float64 (bool values are refused for them: the store's schema
  and the export config say so before any data is read).
  `linear`: v_i + (v_j - v_i) * (q - t_i) / (t_j - t_i). `hold`: the last sample at or before q
  (causal, as diffusion_policy does). `nearest`: the closer of the two neighbours, ties go to the
  earlier one. `slerp`: quaternions are normalised and sign-fixed onto one hemisphere (q_i . q_{i-1} >= 0)
  in the declared order (xyzw or wxyz), interpolated on the great arc (normalised lerp when the
  neighbours are within 1e-3 rad), and returned in the declared order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

TIME_EPS = 1e-9
DEFAULT_GAP_FACTOR = 2.5
MIN_SAMPLES = 2
Method = Literal["linear", "slerp", "hold", "nearest"]
METHODS: tuple[str, ...] = ("linear", "slerp", "hold", "nearest")
ZERO_QUATERNION_HINT = ("these quaternions hold no orientation: drop the field with exclude (or convert the source "
                        "without it), or store real orientations")
QUAT_ORDERS: tuple[str, ...] = ("xyzw", "wxyz")  # slerp itself is invariant to component order


class StreamError(ValueError):
    """A stream that cannot be resampled (empty, constant clock, bad shape); `hint` says how to fix it."""

    def __init__(self, message: str, hint: str = "fix the timestamps in the store, or drop the field with exclude"):
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class RawSeries:
    """A stream as loaded from the typed store layout `{t, v}`: times and values apart, so the values
    keep their own dtype (bool, int8..uint64, float32/64) while the times are float64 seconds (or int64
    ns / integer seconds). The `[T, N+1]` rows layout can only hold one dtype for both."""

    times: np.ndarray  # [T] float64 or int64
    values: np.ndarray  # [T, N] any numeric or bool dtype

    def __len__(self) -> int:
        """T, the samples."""
        return len(self.times)

    @property
    def width(self) -> int:
        """N, the values per sample."""
        return int(self.values.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.times.nbytes + self.values.nbytes)


def split_raw(raw: np.ndarray | RawSeries) -> tuple[np.ndarray, np.ndarray]:
    """(times [T], values [T, N]) of either raw layout; raises `StreamError` on a bad shape."""
    if isinstance(raw, RawSeries):
        if raw.times.ndim != 1 or raw.values.ndim != 2 or raw.values.shape[1] < 1 or len(raw.times) != len(raw.values):
            raise StreamError(f"expected times [T] and values [T, N] with N >= 1, got shapes "
                              f"{list(raw.times.shape)} and {list(raw.values.shape)}",
                              hint="store t as a list of times and v as one row of N >= 1 values per time")
        return raw.times, raw.values
    if raw.ndim != 2 or raw.shape[1] < 2:
        raise StreamError(f"expected a [T, N+1] array with N >= 1, got shape {list(raw.shape)}",
                          hint="store each row as [time, v1..vN] with at least one value")
    return raw[:, 0], raw[:, 1:]


@dataclass(frozen=True)
class Repairs:
    """Counts of rows repaired or dropped while cleaning one stream."""

    nonfinite_time: int = 0
    nan_rows: int = 0
    unsorted: int = 0
    duplicate_time: int = 0
    zero_quaternion: int = 0

    def as_dict(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.__dict__.items()}

    def total(self) -> int:
        return sum(self.__dict__.values())


@dataclass(frozen=True)
class Stream:
    """A cleaned stream: strictly increasing times and their values."""

    times: np.ndarray  # [T] float64, strictly increasing
    values: np.ndarray  # [T, N] source dtype (float64 for linear/slerp)
    repairs: Repairs = field(default_factory=Repairs)
    # s: spacing of the stored time values at the stream's largest |time|, in the stored dtype (0 for
    # integer clocks): stored times are only known to this, so closer times count as equal
    resolution: float = 0.0

    @property
    def tolerance(self) -> float:
        """How far apart two times may be and still count as equal, for this stream (s): 2 spacings,
        since a relative time carries the rounding of the stored time and of the origin (half a
        spacing each when correctly rounded, more after `int64 ns / 1e9`, which rounds twice)."""
        return max(TIME_EPS, 2.0 * self.resolution)

    def shifted(self, origin: float) -> "Stream":
        """The stream with `origin` subtracted from every time (same values, repairs, resolution).

        Exact when the times lie within a factor 2 of `origin` (Sterbenz), which is the case that
        matters: epoch-second clocks, where absolute grid arithmetic would lose 238 ns per step."""
        return Stream(times=self.times - origin, values=self.values, repairs=self.repairs, resolution=self.resolution)

    @property
    def median_period(self) -> float:
        if len(self.times) < 2:
            return float("inf")
        return float(np.median(np.diff(self.times)))


def clean_stream(raw: np.ndarray | RawSeries, method: str = "linear", strict: bool = False) -> Stream:
    """Clean a `[T, N+1]` array (column 0 = time in seconds), or a `RawSeries`, into a `Stream`.

    Integer-nanosecond clocks are converted before this, relative to an integer origin
    (`robowds.export.store.episodes.ns_to_seconds`), so that distinct nanosecond times stay distinct in float64.
    With `strict`, any repair other than dropping missing samples raises instead of being counted.
    """
    stored_times, values = split_raw(raw)  # [T], [T, N]
    if len(stored_times) == 0:
        raise StreamError("stream has no samples")
    times = stored_times.astype(np.float64)  # [T]
    resolution = clock_resolution(stored_times)
    if method in ("linear", "slerp"):
        values = values.astype(np.float64)

    finite_t = np.isfinite(times)
    if values.dtype.kind == "f":
        nan_row = ~np.isfinite(values).all(axis=1) & finite_t  # NaN or infinite: a missing sample
    else:
        nan_row = np.zeros(len(times), dtype=bool)
    zero_quat = np.zeros(len(times), dtype=bool)
    if method == "slerp":
        if values.shape[1] != 4:
            raise StreamError(f"slerp needs 4 quaternion components, got {values.shape[1]}",
                              hint="store [time, x, y, z, w] rows (or w first with quaternion_order: wxyz), "
                                   "or declare another interpolation for the field")
        zero_quat = finite_t & ~nan_row & zero_quaternions(values)
    keep = finite_t & ~nan_row & ~zero_quat
    times, values = times[keep], values[keep]
    zeros = int(np.count_nonzero(zero_quat))
    if len(times) == 0:
        if zeros:
            raise StreamError(f"stream has no valid samples: {zeros} of {len(keep)} rows are zero-norm quaternions "
                              "(no orientation: an IMU driver that publishes none sends zeros)"
                              + _dropped_besides(finite_t, nan_row), hint=ZERO_QUATERNION_HINT)
        raise StreamError("stream has no valid samples (all times non-finite or all rows NaN)")

    steps = np.diff(times)
    unsorted = int(np.count_nonzero(steps < 0))
    if unsorted:
        order = np.argsort(times, kind="stable")
        times, values = times[order], values[order]
    dup = np.diff(times) == 0  # [T-1]; True where row i+1 repeats row i's time
    duplicates = int(np.count_nonzero(dup))
    if len(times) > 1 and duplicates == len(times) - 1:
        raise StreamError(f"all {len(times)} timestamps are equal ({float(times[0])}): constant clock")
    if duplicates:
        last_of_run = np.append(~dup, True)  # keep the last row of each run of equal times
        times, values = times[last_of_run], values[last_of_run]
    if len(times) < MIN_SAMPLES:
        if zeros:
            raise StreamError(f"too short: {len(times)} valid sample(s), need >= {MIN_SAMPLES}; the other "
                              f"{zeros} of {len(keep)} rows are zero-norm quaternions (no orientation)"
                              + _dropped_besides(finite_t, nan_row), hint=ZERO_QUATERNION_HINT)
        raise StreamError(f"too short: {len(times)} valid sample(s), need >= {MIN_SAMPLES} "
                          "(no rate or gap can be told from fewer)")
    if strict and (unsorted or duplicates):
        raise StreamError(f"timestamps need repair ({unsorted} out of order, {duplicates} duplicated)"
                          " and the timestamp policy is 'reject'")
    if method == "slerp":
        values = _hemisphere_fixed(_normalised(values))
    repairs = Repairs(nonfinite_time=int(np.count_nonzero(~finite_t)), nan_rows=int(np.count_nonzero(nan_row)),
                      unsorted=unsorted, duplicate_time=duplicates, zero_quaternion=zeros)
    return Stream(times=times, values=values, repairs=repairs, resolution=resolution)


def zero_quaternions(values: np.ndarray) -> np.ndarray:
    """[T, 4] -> [T] bool: rows whose norm is zero (NaN counted as 0), which name no rotation and are
    dropped like missing samples; the rosbag converter uses the same test to leave out orientations a
    driver never filled in."""
    return ~np.any(np.nan_to_num(np.asarray(values, np.float64)) != 0, axis=1)  # not a norm: 1e-170's squares underflow


def _dropped_besides(finite_t: np.ndarray, nan_row: np.ndarray) -> str:
    """The other rows a stream lost, for a message about its zero quaternions ("" when none)."""
    parts = [f"{n} {what}" for n, what in ((int(np.count_nonzero(~finite_t)), "with a non-finite time"),
                                           (int(np.count_nonzero(nan_row)), "with NaN values")) if n]
    return f" ({' and '.join(parts)} dropped too)" if parts else ""


def clock_resolution(times: np.ndarray) -> float:
    """Spacing of representable times at the largest finite |time| of `times` ([T]), in their own
    dtype: 2.4e-7 s for float64 epoch seconds (1.3e9), 9.5e-7 s for float32 seconds near 10 s, 0 for
    integers (exact)."""
    if times.dtype.kind != "f":
        return 0.0
    finite = np.abs(times[np.isfinite(times)])
    if not len(finite):
        return 0.0
    return float(np.spacing(finite.max()))


def _normalised(q: np.ndarray) -> np.ndarray:  # [T, 4] -> [T, 4]
    """Unit quaternions. A row whose norm leaves [1e-150, 1e150] (its squares underflow to subnormals or
    overflow: components like 1e-160 came out 4e-5 off unit length, 1e200 as zeros) is divided by its
    largest |component| first; every other row is `q / |q|` exactly as before, bit for bit."""
    q = np.asarray(q, dtype=np.float64)
    norm = np.linalg.norm(q, axis=1, keepdims=True)  # [T, 1]
    extreme = ~((norm >= 1e-150) & (norm <= 1e150))[:, 0]  # [T]
    if np.any(extreme):
        q = q.copy()
        q[extreme] /= np.abs(q[extreme]).max(axis=1, keepdims=True)
        norm[extreme] = np.linalg.norm(q[extreme], axis=1, keepdims=True)
    return q / norm


def _hemisphere_fixed(q: np.ndarray) -> np.ndarray:  # [T, 4] -> [T, 4]
    """Flip signs so consecutive quaternions have a non-negative dot product (q and -q are one rotation)."""
    if len(q) < 2:
        return q
    dots = np.einsum("ij,ij->i", q[1:], q[:-1])  # [T-1]
    signs = np.cumprod(np.where(dots < 0, -1.0, 1.0))
    return q * np.concatenate([[1.0], signs])[:, None]


def resample(stream: Stream, query: np.ndarray, method: str, max_gap: float | None = None,
             valid_range: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Evaluate `stream` at `query` times; returns (values [Q, N], valid [Q] bool).

    Invalid steps carry the edge value (first, last, or the sample before a gap); padding them is the
    window's job. `valid_range` is the episode's extent: queries outside it are invalid and evaluated
    at the nearest end of the extent, so data recorded beyond the episode never leaks in.
    """
    if method not in METHODS:
        raise StreamError(f"unknown interpolation {method!r}; use one of {', '.join(METHODS)}")
    t, v = stream.times, stream.values
    n = len(t)
    eps = stream.tolerance
    if max_gap is None:
        max_gap = DEFAULT_GAP_FACTOR * stream.median_period
    q = np.asarray(query, dtype=np.float64)  # [Q]
    outside = np.zeros(q.shape, dtype=bool)
    if valid_range is not None:  # outside the episode: the value at its edge, never data beyond it
        outside = (q < valid_range[0] - eps) | (q > valid_range[1] + eps)
        q = np.clip(q, valid_range[0], valid_range[1])

    # the last sample at or before q, or the next one when it is within eps after q; `at_sample`
    # below uses the same difference, so selection and "at a sample" never disagree at the boundary
    i = np.searchsorted(t, q, side="right") - 1
    nxt = np.minimum(i + 1, n - 1)
    i = np.where((i + 1 < n) & (t[nxt] - q <= eps), i + 1, i)
    before = i < 0
    i = np.clip(i, 0, n - 1)
    j = np.minimum(i + 1, n - 1)
    at_sample = ~before & (np.abs(q - t[i]) <= eps)
    after = (i == n - 1) & ~at_sample & ~before
    inside = ~before & ~after
    span = t[j] - t[i]  # [Q]; 0 at the last sample
    in_gap = inside & ~at_sample & (span > max_gap)
    valid = inside & ~in_gap & ~outside
    interior = inside & ~in_gap & ~at_sample  # strictly between two samples, interpolate

    if method == "hold":
        return v[i], valid
    if method == "nearest":
        take_j = interior & ((t[j] - q) < (q - t[i]))
        return v[np.where(take_j, j, i)], valid

    frac = np.zeros_like(q)
    np.divide(q - t[i], span, out=frac, where=interior)
    if method == "linear":
        out = v[i].copy()
        out[interior] = v[i][interior] + (v[j][interior] - v[i][interior]) * frac[interior, None]
        return out, valid
    return _slerp(v[i], v[j], frac, interior), valid


def _slerp(qa: np.ndarray, qb: np.ndarray, frac: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Great-arc interpolation of unit quaternions [Q, 4] (hemisphere already fixed); order-agnostic."""
    out = qa.copy()
    a, b, f = qa[where], qb[where], frac[where][:, None]
    dot = np.clip(np.einsum("ij,ij->i", a, b), -1.0, 1.0)[:, None]
    theta = np.arccos(dot)
    small = theta < 1e-3
    sin_t = np.sin(theta)
    with np.errstate(invalid="ignore", divide="ignore"):
        arc = (np.sin((1.0 - f) * theta) * a + np.sin(f * theta) * b) / sin_t
    lerp = a + (b - a) * f
    mixed = np.where(small, lerp, arc)
    out[where] = mixed / np.linalg.norm(mixed, axis=1, keepdims=True)
    return out
