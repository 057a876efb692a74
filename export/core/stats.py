"""Normalisation statistics over valid window steps: one mergeable state per episode, folded per split
into a state whose size does not grow with the number of episodes.

Why (issue 9, item 8): the previous state kept up to 512 sorted points per episode and dimension,
and the manifest concatenated them all: 106 MB / 4 s at 1,000 episodes, 426 MB / 26 s at 4,000, no
end at DROID's 92k. Here a state is, per dimension:

- count, exact min and max;
- exact moments A = sum M2_i, B = sum n_i*mean_i, C = sum n_i*mean_i**2 over the float64 partials
  (n_i, mean_i, M2_i) numpy computes for each chunk of windows, as Python integers times a power of
  two (a float64 is m * 2**e with an integer m, so the sums are exact). mean = B / N and
  M2 = A + C - B**2 / N are rounded once, at the end: the same for any merge order, and off numpy's
  on the concatenated data only by each chunk's own float64 rounding. Cost: ~12 Python-int
  operations per dimension and episode (decoding and summing: ~1.8 s for 100k episodes x 26 dims);
- a histogram for q01/q99: a bucket is (dimension, sign, exponent, top mantissa bits) of the float,
  with an int64 count and the exact min and max of its values.

Resolution is chosen per binade (one power-of-two range of one sign of one dimension): the finest of
2**-40 .. 2**0 of the binade at which its values fall into at most `BINADE_BUCKETS` (256) buckets.
A union of data covers at least as many buckets and a coarser grid at most as many, so the state
after any sequence of merges is the same function of the multiset of merged values (the finest
resolution every part allows and the union fits in); counts add and min/max are min/max per bucket:
any merge order or grouping gives the same state, to the byte. Values with |x| < 2**-64 share one
bucket. Alternatives rejected: a fixed log grid (DDSketch, 2**-7) puts 1000 +- 0.01 into one or two
buckets (rank error up to ~50%); KLL / t-digest / GK have rank guarantees but merge with random or
order-dependent compactions, so their bytes depend on the worker count and merge order.

Guarantees. Memory: at most 256 buckets per occupied binade whatever the episode count (bounded by
2 signs x 1,088 binades from 2**-64 to 2**1024 x 256; ~2,700 per dimension on the benchmark's
signals). A quantile is numpy's 'linear' one with each order statistic read off the bucket holding
it, interpolated by rank between that bucket's min and max. The answer and the true quantile both
lie between the min and max of the real values in that bucket: the rank error is at most the
bucket's share of N and the value error at most its width (<= 2**-8 of the binade's lower bound;
far finer where a binade's values cluster: 60M values of 1000 +- 0.01 get ~5e-4 wide buckets). A
bucket holding one distinct value (0/1 grippers, any discrete signal) answers that exact value. No
histogram bounds the rank error on adversarial data (a large share of N spread inside one bucket);
on eight realistic signal kinds (normal, uniform, Student t(2), bimodal, 0/1, 1000 +- 0.01,
1e-9-scale, 7 decades crossing 0) the worst measured q01/q99 rank error is below 0.01% (limit 0.5%).

Figures: `python scripts/bench_stats.py` (2-core development machine, shared with other jobs;
26 dims x 600 steps per episode; fold = decode each staged msgpack state and merge, as the export
does; CPU seconds):

    episodes   old 512-point sketch          this module                 worst q01/q99 rank error
    1,000        2.1 s,  244 MB peak           2.6 s, 31 MB peak           old 0.008%, new 0.0067%
    4,000       12.1 s,  975 MB peak           3.8 s, 31 MB peak
    100,000     not run (21 GB of sketches)   54.6 s, 31 MB peak

The first ~1,000 episodes bring new buckets (a sort of the state per fold); after that a fold adds
into existing buckets through a lookup table (~0.5 ms per 26-dim episode). A staged episode state
is ~138 KB (old: 111 KB). Cost in the export: a chunk's partial (1024 windows x 50 steps x 7 dims)
takes ~36 ms (old: ~23 ms); in a profile of a 150-episode synthetic export (`bench_export.py`'s
store, 1 worker) statistics take ~0.7 of 5.0 profiled seconds (old: ~0.25 of 4.3); wall-clock A/B runs
on the shared machine were within noise (old 5.5-10.0 s, new 5.7-9.2 s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from robowds.export.core.buckets import (DIM_SHIFT, GROUP_SHIFT, bucket_of, bucket_quantile, key_order, normalise,
                                         raw_keys, resolution)

QUANTILES = {"q01": 0.01, "q99": 0.99}
MAX_DIMS = 2048  # the dimension index takes the top 11 bits of a bucket key

_FINEST = 1  # t, 1..41: the low t bits of a key are the bucket's, bit t-1 set as its marker (41: whole binade)
_FOLD_ENTRIES = 1 << 17  # an accumulator folds its buffered parts once they hold this many buckets (~4 MB)
_MANTISSA = np.uint64((1 << 41) - 1)
_DENSE_SPAN = 4096  # a binade whose buckets span at most this many slots gets a direct lookup table


class StatsError(ValueError):
    """Values whose statistics cannot be kept (too large, too many dimensions): an episode error."""


@dataclass
class Moments:
    """Exact sums A, B, C (rows) per dimension as num * 2**exp; num is an object array of Python ints."""
    num: np.ndarray  # [3, N] object (Python int)
    exp: np.ndarray  # [3, N] int64

    @classmethod
    def of(cls, count: int, mean: np.ndarray, m2: np.ndarray) -> "Moments":
        """From float64 partials [N]: every float64 is m * 2**e exactly (m a 53-bit integer)."""
        if not (np.isfinite(mean).all() and np.isfinite(m2).all()):  # |values| beyond ~1e154 square to inf
            raise StatsError("values too large for normalisation statistics (beyond ~1e154, their squares "
                             "overflow float64)")
        fm, em = np.frexp(mean)
        fa, ea = np.frexp(m2)
        m = (fm * 2.0 ** 53).astype(np.int64).astype(object)  # [N]
        a = (fa * 2.0 ** 53).astype(np.int64).astype(object)  # [N]
        e = em.astype(np.int64) - 53
        num = np.stack([a, m * count, m * m * count])  # [3, N]: M2, n*mean, n*mean**2
        return cls(num, np.stack([ea.astype(np.int64) - 53, e, 2 * e]))

    @classmethod
    def sum(cls, parts: list["Moments"], more: tuple[np.ndarray, np.ndarray] | None = None) -> "Moments":
        """Exact sum of `parts` and `more` ([R, 3, N] nums and exps); the exponent is the least over
        them all, so the result is order-free."""
        nums = np.concatenate([p.num[None] for p in parts] + ([more[0]] if more is not None else []))  # [P, 3, N]
        exps = np.concatenate([p.exp[None] for p in parts] + ([more[1]] if more is not None else []))  # [P, 3, N]
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
        v = values.astype(np.float64) + 0.0  # [M, N]; -0.0 + 0.0 = +0.0: min/max ties would be order-dependent
        if v.shape[1] > MAX_DIMS:
            raise StatsError(f"statistics support at most {MAX_DIMS} dimensions per field, got {v.shape[1]}")
        mean = v.mean(axis=0)
        m2 = ((v - mean) ** 2).sum(axis=0)
        flat = key_order(v)  # [N*M]
        keys = bucket_of(raw_keys(flat.reshape(v.shape[1], -1).T).T.ravel(), np.uint64(_FINEST))  # [N*M] sorted
        keys, counts, lo, hi = normalise(keys, np.ones(len(flat), np.int64), flat, flat, presorted=True)
        return cls(len(v), v.min(axis=0), v.max(axis=0), Moments.of(len(v), mean, m2), keys, counts, lo, hi)

    def to_state(self) -> dict:
        """Compact, msgpack-able state (job.py stages one per episode and field). Arrays are
        little-endian bytes; the exact sums' integers signed little-endian bytes (msgpack has no big
        integers). A bucket holding one distinct value (most of an episode's: ~600 per dimension)
        is stored as that value and its count: its key follows from the value and its binade's
        resolution (`groups`/`t`, with how many one-value buckets each binade has: <= 256, so u2).
        10 instead of 32 bytes per bucket: ~140 KB for 26 dims x 600 steps, the old sketch's size."""
        single = self.lo.view(np.uint64) == self.hi.view(np.uint64)  # [K]; bitwise: -0.0 != +0.0
        group = self.keys >> GROUP_SHIFT  # [K] sorted
        first = np.concatenate([[True], group[1:] != group[:-1]])  # [K]
        groups, starts, where = group[first], np.flatnonzero(first), np.cumsum(first) - 1
        return {"count": self.count, "dims": self.dims,
                "min": _le(self.min, "<f8"), "max": _le(self.max, "<f8"),
                "moment_exp": _le(self.moments.exp, "<i8"),
                "moment_num": [_int_bytes(int(n)) for n in self.moments.num.ravel()],
                "groups": _le(groups, "<u8"), "t": _le(resolution(self.keys[starts]), "u1"),
                "single_per_group": _le(np.bincount(where[single], minlength=len(groups)), "<u2"),
                "single_value": _le(self.lo[single], "<f8"), "single_count": _counts_bytes(self.counts[single]),
                "keys": _le(self.keys[~single], "<u8"), "counts": _counts_bytes(self.counts[~single]),
                "lo": _le(self.lo[~single], "<f8"), "hi": _le(self.hi[~single], "<f8")}

    @classmethod
    def from_state(cls, state: dict) -> "FieldStats":
        staged = _Staged.decode([state])
        order = np.argsort(staged.keys, kind="stable")  # two sorted runs (one-value buckets, others)
        return cls(staged.count, staged.min[0], staged.max[0], Moments(staged.num[0], staged.exp[0]),
                   staged.keys[order], staged.counts[order], staged.lo[order], staged.hi[order])

    def summary(self) -> dict[str, object]:
        """The manifest's entry: count, mean, std (population), min, max, q01, q99 per dimension."""
        n = self.count
        mean, std = [], []
        for d in range(self.dims):
            a, b, c = (self.moments.fraction(row, d) for row in range(3))
            mean.append(float(b / n))
            std.append(_sqrt((a + c - b * b / n) / n))  # M2 >= 0 exactly: no clamp needed
        out: dict[str, object] = {"count": n, "mean": mean, "std": std,
                                  "min": self.min.tolist(), "max": self.max.tolist()}
        dim_of = self.keys >> DIM_SHIFT  # [K]
        bounds = np.searchsorted(dim_of, np.arange(self.dims + 1, dtype=np.uint64))  # [N+1]
        for name, q in QUANTILES.items():
            out[name] = [bucket_quantile(self.counts[a:b], self.lo[a:b], self.hi[a:b], q, float(self.min[d]),
                                   float(self.max[d])) for d, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
        return out


def _sqrt(variance: Fraction) -> float:
    """The square root of an exact, non-negative variance as a float64. Within float64's range this is
    `math.sqrt(float(variance))`; beyond it (fields whose values, each episode's finite, lie near
    +-1e154 in different episodes: the merged variance exceeds 1.8e308 while its root does not) the
    variance is scaled by 4**-k first and the root by 2**k after, where `float()` alone raised
    OverflowError."""
    shift = max(0, (variance.numerator.bit_length() - variance.denominator.bit_length()) // 2 - 500)
    return math.ldexp(math.sqrt(float(variance / (1 << (2 * shift)))), shift)


def _le(a: np.ndarray, dtype: str) -> bytes:
    return np.ascontiguousarray(a, dtype=dtype).tobytes()


def _counts_bytes(counts: np.ndarray) -> bytes:
    """Counts in the narrowest unsigned type that holds them, that type's code first."""
    code = next(c for c in "BHIQ" if len(counts) == 0 or int(counts.max()) < 1 << (8 * np.dtype(c).itemsize))
    return code.encode() + _le(counts, "<" + code)


def _counts_array(data: bytes) -> np.ndarray:
    return np.frombuffer(data[1:], "<" + data[:1].decode()).astype(np.int64)


def _int_bytes(n: int) -> bytes:
    return n.to_bytes(n.bit_length() // 8 + 1, "little", signed=True)


def merge_all(parts: list[FieldStats | None]) -> FieldStats | None:
    """The merge of all parts (None ones skipped); the same state for any order of `parts`. One part
    is returned as it is (already canonical): most episodes are one chunk of windows."""
    present = [p for p in parts if p is not None]
    if len(present) == 1:
        return present[0]
    acc = StatsAccumulator()
    for part in present:
        acc.add(part)
    return acc.result()


@dataclass
class _Staged:
    """Many staged states decoded at once (a few dozen numpy calls per batch instead of per state);
    buckets unsorted: folding does not need them sorted."""
    count: int
    min: np.ndarray  # [R, N]
    max: np.ndarray  # [R, N]
    num: np.ndarray  # [R, 3, N] object
    exp: np.ndarray  # [R, 3, N] int64
    keys: np.ndarray  # [K] uint64
    counts: np.ndarray  # [K] int64
    lo: np.ndarray  # [K]
    hi: np.ndarray  # [K]

    @classmethod
    def decode(cls, states: list[dict]) -> "_Staged":
        dims = {int(s["dims"]) for s in states}
        if len(dims) != 1:
            raise ValueError(f"cannot merge statistics of different widths {sorted(dims)}")
        n, r = dims.pop(), len(states)

        def joined(key: str, dtype: str) -> np.ndarray:
            return np.frombuffer(b"".join(s[key] for s in states), dtype)

        num = np.empty(r * 3 * n, dtype=object)
        num[:] = [int.from_bytes(b, "little", signed=True) for s in states for b in s["moment_num"]]
        value = joined("single_value", "<f8")  # [S]
        per_group = joined("single_per_group", "<u2").astype(np.int64)  # [G]
        group = np.repeat(joined("groups", "<u8"), per_group)  # [S] (dim, sign, exponent) of each value
        raw = raw_keys(value[:, None]).ravel() | (group << GROUP_SHIFT)  # the binade bits agree
        t = np.repeat(joined("t", "u1").astype(np.uint64), per_group)  # [S]
        return cls(sum(int(s["count"]) for s in states), joined("min", "<f8").reshape(r, n),
                   joined("max", "<f8").reshape(r, n), num.reshape(r, 3, n), joined("moment_exp", "<i8").reshape(r, 3, n),
                   np.concatenate([bucket_of(raw, t), joined("keys", "<u8")]),
                   np.concatenate([_counts_array(s[k]) for k in ("single_count", "counts") for s in states]),
                   np.concatenate([value, joined("lo", "<f8")]), np.concatenate([value, joined("hi", "<f8")]))


class _Index:
    """Where each bucket of a canonical state sits in its sorted arrays, for folding parts without a
    sort: per binade a table over its bucket range when that is at most `_DENSE_SPAN` wide (a
    clustered binade), else a binary search. Size: O(buckets of the state + dims * 4096)."""

    def __init__(self, keys: np.ndarray, dims: int) -> None:
        self.keys = keys  # [K] sorted
        groups, starts = np.unique(keys >> GROUP_SHIFT, return_index=True)  # [G]
        ends = np.append(starts[1:], len(keys))  # [G]
        g = len(groups)  # an extra group g stands for binades the state does not have
        self.table = np.full(dims << 12, g, np.int64)  # (dim, sign, exponent) -> group
        self.table[groups.astype(np.int64)] = np.arange(g)
        self.t = np.append(resolution(keys[starts]), np.uint64(0))  # [G+1]; 0: nothing matches
        self.low = (np.uint64(1) << self.t) - np.uint64(1)  # [G+1] a part bucket at t' <= t has a bit here
        index = ((keys & _MANTISSA) >> np.repeat(self.t[:g], ends - starts)).view(np.int64)  # [K] in binade
        self.base = np.append(index[starts], 0).view(np.uint64)  # [G+1]
        span = index[ends - 1] - index[starts] + 1  # [G]
        self.far = np.append(span > _DENSE_SPAN, False)  # [G+1] binades looked up by binary search
        self.any_far = bool(self.far.any())
        self.span = np.append(np.where(self.far[:g], 0, span), 0).view(np.uint64)  # [G+1]
        self.offset = np.concatenate([[0], np.cumsum(self.span)]).astype(np.int64)  # [G+1]
        self.lookup = np.full(int(self.span.sum()) + 1, len(keys), np.int64)  # last: a miss
        group = np.repeat(np.arange(g), ends - starts)  # [K]
        inside = ~self.far[group]
        self.lookup[self.offset[group[inside]] + index[inside] - index[starts][group[inside]]] = np.flatnonzero(inside)

    def find(self, keys: np.ndarray) -> np.ndarray:
        """[P] position of the state's bucket holding each part bucket; len(state) where there is none
        at the state's resolution (a new bucket, a new binade, or a part coarser than the state)."""
        group = self.table[(keys >> GROUP_SHIFT).view(np.int64)]  # [P]
        t = self.t[group]
        rel = ((keys & _MANTISSA) >> t) - self.base[group]  # [P] uint64: below base wraps to huge
        ok = (keys & self.low[group]) != 0  # the part's bucket is no coarser than the state's here
        near = ok & (rel < self.span[group])
        pos = self.lookup[np.where(near, self.offset[group] + rel.view(np.int64), len(self.lookup) - 1)]
        if self.any_far:
            far = np.flatnonzero(ok & self.far[group])
            wanted = bucket_of(keys[far], t[far])
            at = np.minimum(np.searchsorted(self.keys, wanted), len(self.keys) - 1)
            pos[far] = np.where(self.keys[at] == wanted, at, len(self.keys))
        return pos


class StatsAccumulator:
    """Folds FieldStats (or their staged states) one at a time into one state. Memory: the folded
    state (bounded by the value range, see the module docstring) plus a buffer of at most
    ~`_FOLD_ENTRIES` part buckets, folded in one vectorised step: buckets the state already has are
    added in place (no sort), only new ones go through `normalise` with the state."""

    def __init__(self, fold_entries: int = _FOLD_ENTRIES) -> None:
        self._fold_entries = fold_entries  # tests vary it: the state must not depend on when folds happen
        self._parts: list[FieldStats] = []
        self._states: list[dict] = []
        self._buffered = 0
        self._count = 0
        self._min: np.ndarray | None = None  # [N]
        self._max: np.ndarray | None = None  # [N]
        self._moments: Moments | None = None
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None  # + a miss slot
        self._index: _Index | None = None

    def add(self, part: FieldStats) -> None:
        self._parts.append(part)
        self._buffered += len(part.keys)
        if self._buffered >= self._fold_entries:
            self._fold()

    def add_state(self, state: dict) -> None:
        """A staged state (FieldStats.to_state), decoded with the others of its batch."""
        self._states.append(state)
        self._buffered += (len(state["single_value"]) + len(state["keys"])) // 8
        if self._buffered >= self._fold_entries:
            self._fold()

    def _fold(self) -> None:
        parts, states = self._parts, self._states
        self._parts, self._states, self._buffered = [], [], 0
        if not parts and not states:
            return
        dims = {p.dims for p in parts} | ({int(states[0]["dims"])} if states else set()) | (
            {self._min.shape[0]} if self._min is not None else set())
        if len(dims) != 1:
            raise ValueError(f"cannot merge statistics of different widths {sorted(dims)}")
        staged = _Staged.decode(states) if states else None
        mins = [p.min[None] for p in parts] + ([staged.min] if staged else []) + (
            [self._min[None]] if self._min is not None else [])
        maxs = [p.max[None] for p in parts] + ([staged.max] if staged else []) + (
            [self._max[None]] if self._max is not None else [])
        self._count += sum(p.count for p in parts) + (staged.count if staged else 0)
        self._min, self._max = np.concatenate(mins).min(axis=0), np.concatenate(maxs).max(axis=0)
        moments = [p.moments for p in parts] + ([self._moments] if self._moments else [])
        self._moments = Moments.sum(moments, (staged.num, staged.exp) if staged else None)
        new = tuple(np.concatenate([getattr(p, k) for p in parts] + ([getattr(staged, k)] if staged else []))
                    for k in ("keys", "counts", "lo", "hi"))
        if self._arrays is not None:
            keys, counts, lo, hi = self._arrays  # one extra slot at the end takes the misses
            if self._index is None:  # built on the second fold: a single fold never needs it
                self._index = _Index(keys[:-1], next(iter(dims)))
            pos = self._index.find(new[0])
            np.add.at(counts, pos, new[1])
            np.minimum.at(lo, pos, new[2])
            np.maximum.at(hi, pos, new[3])
            miss = pos == len(keys) - 1
            if not miss.any():
                return
            new = tuple(np.concatenate([a[:-1], b[miss]]) for a, b in zip(self._arrays, new))
        keys, counts, lo, hi = normalise(*new)
        self._arrays = (np.append(keys, np.uint64(0)), np.append(counts, 0), np.append(lo, np.inf),
                        np.append(hi, -np.inf))
        self._index = None

    def result(self) -> FieldStats | None:
        self._fold()
        if self._arrays is None or self._moments is None or self._min is None or self._max is None:
            return None
        keys, counts, lo, hi = (a[:-1].copy() for a in self._arrays)
        return FieldStats(self._count, self._min.copy(), self._max.copy(), self._moments, keys, counts, lo, hi)
