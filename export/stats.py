"""Normalisation statistics over valid window steps: one mergeable state per episode, folded per split
into a state whose size does not grow with the number of episodes.

Why this design (issue 9, item 8): the previous state kept up to 512 sorted points per episode and
dimension and concatenated them all for the manifest: 106 MB / 4 s at 1,000 episodes, 426 MB / 26 s
at 4,000, no end at DROID's 92k. Here a state is

- count, exact min and max per dimension;
- the exact moments A = sum M2_i, B = sum n_i*mean_i, C = sum n_i*mean_i**2 over the float64
  partials (n_i, mean_i, M2_i) that numpy computes for each chunk of windows, held as Python
  integers times a power of two (a float64 is m * 2**e with an integer m, so these sums are exact).
  mean = B / N and M2 = A + C - B**2 / N are rounded once, at the end: the result is the same for
  any merge order, and differs from numpy on the concatenated data only by each chunk's own rounding;
- a histogram for q01/q99 over buckets of the float's bits: a bucket is (dimension, sign, binade,
  top mantissa bits), with an int64 count and the exact min and max of its values.

Resolution is chosen per binade (one power-of-two range of one sign of one dimension): the finest
of 2**-40 .. 2**0 (relative to the binade) at which the values seen so far fall into at most
`BINADE_BUCKETS` buckets. The binade's resolution only ever coarsens (a union of data covers at least
as many buckets, a coarser grid covers at most as many), so the state after any sequence of merges
is the same function of the multiset of merged values: the finest resolution that every part
allows and the union fits in. Counts add and min/max are min/max per bucket, so any merge order or
grouping gives the same state, bytes included. Values with |x| < 2**-64 share one bucket.

What it guarantees. Memory: at most `BINADE_BUCKETS` buckets per occupied binade, so a dimension
holds at most 2 signs x 1,088 binades (2**-64 .. 2**1024) x 256 buckets whatever the episode count,
and in practice a few thousand (figures below). Min, max, count, mean and std are exact (not read
off the histogram). A quantile is answered from the bucket holding rank (N-1)*q, interpolated by
rank between that bucket's min and max, so the answer and the true quantile both lie between the
min and max of the real values in that one bucket: the rank error is at most that bucket's share
of N, and the value error at most the bucket's width (<= 2**-8 of the binade's lower bound, far
finer when a binade's values are clustered, e.g. 1000 +- 0.01 gets ~1e-4 wide buckets). A bucket
holding one distinct value (gripper 0/1 flags, any discrete signal) answers that exact value. A
histogram cannot promise a rank bound on adversarial data (a million values spread inside one
2**-40-wide bucket); on the realistic distributions of `scripts/bench_stats.py` the measured q01/q99
rank error is below the issue's 0.5% (figures below).

Figures (`scripts/bench_stats.py`, 2-core development machine, 26 dims, 600 steps per episode):
FIGURES
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
import math

import numpy as np

QUANTILES = {"q01": 0.01, "q99": 0.99}
BINADE_BUCKETS = 256  # most buckets in one binade of one dimension; 2**8 -> never coarser than 2**-8
ZERO_BELOW = 2.0 ** -64  # |x| below this shares one bucket (bounds the count of binades)
MAX_DIMS = 2048  # the dimension index takes the top 11 bits of a bucket key

_DIM_SHIFT = np.uint64(53)  # key = dim << 53 | float bits >> 11: sign (1), exponent (11), mantissa (41)
_GROUP_SHIFT = np.uint64(41)  # key >> 41 = (dim, sign, exponent): one binade of one dimension
_FINEST, _COARSEST = 1, 41  # t: the low t bits of a key are the bucket's; bit t-1 is set as its marker
_FOLD_ENTRIES = 1 << 20  # an accumulator folds its buffered parts once they hold this many buckets


@dataclass
class Moments:
    """Exact sums A, B, C (rows) per dimension as num * 2**exp; num is an object array of Python ints."""
    num: np.ndarray  # [3, N] object (Python int)
    exp: np.ndarray  # [3, N] int64

    @classmethod
    def of(cls, count: int, mean: np.ndarray, m2: np.ndarray) -> "Moments":
        """From float64 partials [N]: every float64 is m * 2**e exactly (m a 53-bit integer)."""
        fm, em = np.frexp(mean)
        fa, ea = np.frexp(m2)
        m = (fm * 2.0 ** 53).astype(np.int64).astype(object)  # [N]
        a = (fa * 2.0 ** 53).astype(np.int64).astype(object)  # [N]
        e = em.astype(np.int64) - 53
        num = np.stack([a, m * count, m * m * count])  # [3, N]: M2, n*mean, n*mean**2
        return cls(num, np.stack([ea.astype(np.int64) - 53, e, 2 * e]))

    @classmethod
    def sum(cls, parts: list["Moments"]) -> "Moments":
        """Exact sum; the exponent is the least over the parts, so the result is order-free."""
        nums = np.stack([p.num for p in parts])  # [P, 3, N]
        exps = np.stack([p.exp for p in parts])  # [P, 3, N]
        low = exps.min(axis=0)  # [3, N]
        return cls((nums << (exps - low)).sum(axis=0), low)

    def fraction(self, row: int, dim: int) -> Fraction:
        n, e = int(self.num[row, dim]), int(self.exp[row, dim])
        return Fraction(n << e) if e >= 0 else Fraction(n, 1 << -e)


@dataclass
class FieldStats:
    count: int
    min: np.ndarray  # [N]
    max: np.ndarray  # [N]
    moments: Moments
    keys: np.ndarray  # [K] uint64 bucket keys, sorted (so by dimension first)
    counts: np.ndarray  # [K] int64
    lo: np.ndarray  # [K] float64 least value in the bucket
    hi: np.ndarray  # [K] float64 greatest value in the bucket

    @property
    def dims(self) -> int:
        return int(self.min.shape[0])

    @classmethod
    def of(cls, values: np.ndarray) -> "FieldStats | None":
        """Statistics of valid steps `values` [M, N]; None when there are none."""
        if len(values) == 0:
            return None
        v = values.astype(np.float64)  # [M, N]
        if v.shape[1] > MAX_DIMS:
            raise ValueError(f"statistics support at most {MAX_DIMS} dimensions per field, got {v.shape[1]}")
        mean = v.mean(axis=0)
        m2 = ((v - mean) ** 2).sum(axis=0)
        keys = _bucket(_raw_keys(v).ravel(), np.uint64(_FINEST))  # [M*N]
        flat = v.ravel()
        ones = np.ones(len(flat), np.int64)
        keys, counts, lo, hi = _normalise(keys, ones, flat, flat)
        return cls(len(v), v.min(axis=0), v.max(axis=0), Moments.of(len(v), mean, m2), keys, counts, lo, hi)

    def to_state(self) -> dict:
        """Compact, msgpack-able state: arrays as little-endian bytes, the exact sums' integers as
        signed little-endian bytes (msgpack has no big integers)."""
        return {"count": self.count, "dims": self.dims,
                "min": _le(self.min, "<f8"), "max": _le(self.max, "<f8"),
                "moment_exp": _le(self.moments.exp, "<i8"),
                "moment_num": [_int_bytes(int(n)) for n in self.moments.num.ravel()],
                "keys": _le(self.keys, "<u8"), "counts": _le(self.counts, "<i8"),
                "lo": _le(self.lo, "<f8"), "hi": _le(self.hi, "<f8")}

    @classmethod
    def from_state(cls, state: dict) -> "FieldStats":
        dims = int(state["dims"])
        num = np.empty(3 * dims, dtype=object)
        num[:] = [int.from_bytes(b, "little", signed=True) for b in state["moment_num"]]
        moments = Moments(num.reshape(3, dims), np.frombuffer(state["moment_exp"], "<i8").reshape(3, dims))
        return cls(int(state["count"]), np.frombuffer(state["min"], "<f8"), np.frombuffer(state["max"], "<f8"),
                   moments, np.frombuffer(state["keys"], "<u8"), np.frombuffer(state["counts"], "<i8"),
                   np.frombuffer(state["lo"], "<f8"), np.frombuffer(state["hi"], "<f8"))

    def summary(self) -> dict[str, object]:
        """The manifest's entry: count, mean, std (population), min, max, q01, q99 per dimension."""
        n = self.count
        mean, std = [], []
        for d in range(self.dims):
            a, b, c = (self.moments.fraction(row, d) for row in range(3))
            mean.append(float(b / n))
            std.append(math.sqrt(float((a + c - b * b / n) / n)))  # M2 >= 0 exactly: no clamp needed
        out: dict[str, object] = {"count": n, "mean": mean, "std": std,
                                  "min": self.min.tolist(), "max": self.max.tolist()}
        dim_of = self.keys >> _DIM_SHIFT  # [K]
        bounds = np.searchsorted(dim_of, np.arange(self.dims + 1, dtype=np.uint64))  # [N+1]
        for name, q in QUANTILES.items():
            out[name] = [_quantile(self.counts[a:b], self.lo[a:b], self.hi[a:b], q, float(self.min[d]),
                                   float(self.max[d])) for d, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
        return out


def _le(a: np.ndarray, dtype: str) -> bytes:
    return np.ascontiguousarray(a, dtype=dtype).tobytes()


def _int_bytes(n: int) -> bytes:
    return n.to_bytes(n.bit_length() // 8 + 1, "little", signed=True)


def _raw_keys(v: np.ndarray) -> np.ndarray:
    """[M, N] float64 -> [M, N] uint64 dim << 53 | bits >> 11; |x| < ZERO_BELOW (and -0.0) -> +0.0."""
    clean = np.where(np.abs(v) < ZERO_BELOW, 0.0, v)
    return (clean.view(np.uint64) >> np.uint64(11)) | (np.arange(v.shape[1], dtype=np.uint64) << _DIM_SHIFT)


def _bucket(keys: np.ndarray, t: np.ndarray | np.uint64) -> np.ndarray:
    """The key of the bucket at resolution t holding each key: low t bits cleared, bit t-1 set."""
    t = np.asarray(t, dtype=np.uint64)
    return ((keys >> t) << t) | (np.uint64(1) << (t - np.uint64(1)))


def _resolution(keys: np.ndarray) -> np.ndarray:
    """t of each bucket key: one more than the index of its lowest set bit (the marker)."""
    low = keys & (~keys + np.uint64(1))
    return np.frexp(low.astype(np.float64))[1].astype(np.uint64)  # low = 2**(t-1) exactly


def _reduce(keys: np.ndarray, counts: np.ndarray, lo: np.ndarray, hi: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One entry per distinct key, sorted: counts add, lo is the min, hi the max."""
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    starts = np.flatnonzero(np.concatenate([[True], k[1:] != k[:-1]]))
    return (k[starts], np.add.reduceat(counts[order], starts), np.minimum.reduceat(lo[order], starts),
            np.maximum.reduceat(hi[order], starts))


def _normalise(keys: np.ndarray, counts: np.ndarray, lo: np.ndarray, hi: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Bring bucket entries (any resolutions, repeats allowed) to the canonical state: per binade the
    coarsest resolution among them, coarsened further while it holds more than BINADE_BUCKETS buckets.
    The result depends only on the multiset of entries, so merging is order- and grouping-free."""
    groups, where = np.unique(keys >> _GROUP_SHIFT, return_inverse=True)  # [G], [K]
    t = np.zeros(len(groups), np.uint64)
    np.maximum.at(t, where, _resolution(keys))
    while True:
        keys, counts, lo, hi = _reduce(_bucket(keys, t[where]), counts, lo, hi)
        where = np.searchsorted(groups, keys >> _GROUP_SHIFT)
        over = np.bincount(where, minlength=len(groups)) > BINADE_BUCKETS  # [G]
        if not over.any():
            return keys, counts, lo, hi
        t[over] += np.uint64(1)  # t reaches _COARSEST (one bucket per binade) at worst


def _quantile(counts: np.ndarray, lo: np.ndarray, hi: np.ndarray, q: float, vmin: float, vmax: float) -> float:
    """numpy's default ('linear') quantile, with each order statistic read off its bucket: buckets are
    disjoint value ranges, so ordering them by their min orders the data; within a bucket holding c
    values, the j-th is taken at lo + (hi - lo) * j / (c - 1) (exact at both ends)."""
    order = np.argsort(lo, kind="stable")
    c, lo, hi = counts[order], lo[order], hi[order]
    cum = np.cumsum(c)  # [B]
    pos = (int(cum[-1]) - 1) * q
    below = math.floor(pos)

    def order_stat(r: int) -> float:
        j = int(np.searchsorted(cum, r, side="right"))
        within = r - (int(cum[j]) - int(c[j]))
        return float(lo[j]) if c[j] == 1 else float(lo[j] + (hi[j] - lo[j]) * (within / (int(c[j]) - 1)))

    a = order_stat(below)
    value = a if pos == below else a + (order_stat(below + 1) - a) * (pos - below)
    return min(max(value, vmin), vmax)


def merge_all(parts: list[FieldStats | None]) -> FieldStats | None:
    """The merge of all parts (None ones skipped); the same state for any order of `parts`."""
    acc = StatsAccumulator()
    for part in parts:
        if part is not None:
            acc.add(part)
    return acc.result()


class StatsAccumulator:
    """Folds FieldStats one at a time into one state. Memory: the folded state (bounded by the value
    range, see the module docstring) plus a buffer of at most ~`_FOLD_ENTRIES` buckets (~32 MB)
    that is folded in one vectorised merge, never one state per episode."""

    def __init__(self) -> None:
        self._state: FieldStats | None = None
        self._buffer: list[FieldStats] = []
        self._buffered = 0

    def add(self, part: FieldStats) -> None:
        self._buffer.append(part)
        self._buffered += len(part.keys)
        if self._buffered >= _FOLD_ENTRIES:
            self._fold()

    def _fold(self) -> None:
        parts = self._buffer + ([self._state] if self._state is not None else [])
        self._buffer, self._buffered = [], 0
        if not parts:
            return
        dims = {p.dims for p in parts}
        if len(dims) != 1:
            raise ValueError(f"cannot merge statistics of different widths {sorted(dims)}")
        keys, counts, lo, hi = _normalise(*(np.concatenate([getattr(p, k) for p in parts])
                                            for k in ("keys", "counts", "lo", "hi")))
        self._state = FieldStats(sum(p.count for p in parts), np.min([p.min for p in parts], axis=0),
                                 np.max([p.max for p in parts], axis=0), Moments.sum([p.moments for p in parts]),
                                 keys, counts, lo, hi)

    def result(self) -> FieldStats | None:
        self._fold()
        return self._state
