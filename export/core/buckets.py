"""Bucket keys of the statistics histogram (see export/core/stats.py for the design). Pure numpy.

A value's key is (dimension, sign, exponent, top mantissa bits) of its float64 bits; a bucket at
resolution t clears the key's low t bits and sets bit t-1 as a marker, so a key says its own
resolution. `normalise` brings any multiset of entries to the one canonical state per binade, which
is what makes merging free of order and grouping. Sizes: every array here has one entry per bucket,
at most BINADE_BUCKETS per occupied binade of a dimension, whatever the number of values.
"""

from __future__ import annotations

import math

import numpy as np

BINADE_BUCKETS = 256  # most buckets in one binade of one dimension; 2**8 -> never coarser than 2**-8
ZERO_BELOW = 2.0 ** -64  # |x| below this shares one bucket (bounds the count of binades)
DIM_SHIFT = np.uint64(53)  # key = dim << 53 | float bits >> 11: sign (1), exponent (11), mantissa (41)
GROUP_SHIFT = np.uint64(41)  # key >> 41 = (dim, sign, exponent): one binade of one dimension


def key_order(v: np.ndarray) -> np.ndarray:
    """[M, N] -> [N*M] the values dimension by dimension in the order of their keys, by a float sort
    per column (an argsort of the keys costs ~2x): keys order |x| < ZERO_BELOW first, then positive
    values ascending, then negative ones by ascending magnitude (the sign bit is the key's top)."""
    out = []
    for col in np.sort(v, axis=0).T:  # [M] ascending
        neg = np.searchsorted(col, -ZERO_BELOW, side="right")  # x <= -ZERO_BELOW: negative keys
        zero = np.searchsorted(col, ZERO_BELOW, side="left")  # |x| < ZERO_BELOW: the zero bucket
        out += [col[neg:zero], col[zero:], col[:neg][::-1]]
    return np.concatenate(out)


def raw_keys(v: np.ndarray) -> np.ndarray:
    """[M, N] float64 -> [M, N] uint64 dim << 53 | bits >> 11; |x| < ZERO_BELOW (and -0.0) -> +0.0."""
    clean = np.where(np.abs(v) < ZERO_BELOW, 0.0, v)
    return (clean.view(np.uint64) >> np.uint64(11)) | (np.arange(v.shape[1], dtype=np.uint64) << DIM_SHIFT)


def bucket_of(keys: np.ndarray, t: np.ndarray | np.uint64) -> np.ndarray:
    """The key of the bucket at resolution t holding each key: low t bits cleared, bit t-1 set."""
    t = np.asarray(t, dtype=np.uint64)
    return ((keys >> t) << t) | (np.uint64(1) << (t - np.uint64(1)))


def resolution(keys: np.ndarray) -> np.ndarray:
    """t of each bucket key: one more than the index of its lowest set bit (the marker)."""
    low = keys & (~keys + np.uint64(1))
    return np.frexp(low.astype(np.float64))[1].astype(np.uint64)  # low = 2**(t-1) exactly


def reduce_sorted(keys: np.ndarray, counts: np.ndarray, lo: np.ndarray, hi: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One entry per distinct key of sorted `keys`: counts add, lo is the min, hi the max."""
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    return (keys[starts], np.add.reduceat(counts, starts), np.minimum.reduceat(lo, starts),
            np.maximum.reduceat(hi, starts))


def normalise(keys: np.ndarray, counts: np.ndarray, lo: np.ndarray, hi: np.ndarray, presorted: bool = False
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Bring bucket entries (any resolutions, repeats allowed) to the canonical state: per binade the
    coarsest resolution among them, coarsened further while it holds more than BINADE_BUCKETS buckets.
    The result depends only on the multiset of entries, so merging is order- and grouping-free.
    One sort: coarsening keeps sorted keys sorted."""
    if not presorted:
        order = np.argsort(keys)  # ties are merged by commutative ops: any sort gives the same result
        keys, counts, lo, hi = keys[order], counts[order], lo[order], hi[order]
    keys, counts, lo, hi = reduce_sorted(keys, counts, lo, hi)
    group = keys >> GROUP_SHIFT  # [K] sorted
    starts = np.flatnonzero(np.concatenate([[True], group[1:] != group[:-1]]))  # [G]
    groups = group[starts]
    where = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(keys))))  # [K] group of each key
    own = resolution(keys)  # [K]
    t = np.maximum.reduceat(own, starts)  # [G]
    if not np.array_equal(own, t[where]):  # some entries are finer than their binade's coarsest
        keys, counts, lo, hi = reduce_sorted(bucket_of(keys, t[where]), counts, lo, hi)
        where = np.searchsorted(groups, keys >> GROUP_SHIFT)
    if not (np.bincount(where, minlength=len(groups)) > BINADE_BUCKETS).any():
        return keys, counts, lo, hi
    final = _coarse_enough(keys, where, t)  # [G]
    return reduce_sorted(bucket_of(keys, final[where]), counts, lo, hi)


def _coarse_enough(keys: np.ndarray, where: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per binade, the least resolution >= `t` [G] at which its distinct sorted `keys` [K] (group
    `where` [K]) fall into at most BINADE_BUCKETS buckets, in one pass over the keys.

    Why not coarsen one step at a time until every binade fits: each step passes over all keys, and a
    binade of finely spread values needs up to ~30 steps (that loop was most of the CPU time of
    folding statistics). Two neighbours in sorted order share a bucket at resolution r iff their keys
    agree from bit r up, i.e. iff the bit length h of their XOR is <= r; so a binade at r holds
    1 + #{neighbour pairs with h > r} buckets, and that count falls as r grows. Same result as the
    step-by-step loop: buckets at r are a function of `key >> r` alone (see `bucket_of`)."""
    width = int(GROUP_SHIFT) + 2  # h and r are <= 41 (one bucket per binade): columns 0..42
    same = where[1:] == where[:-1]  # [K-1] neighbours in one binade
    h = np.frexp((keys[1:] ^ keys[:-1])[same].astype(np.float64))[1]  # [P] exact: the XOR is < 2**41
    pairs = np.bincount(where[1:][same] * width + h, minlength=len(t) * width).reshape(len(t), width)  # [G, 43]
    above = pairs[:, ::-1].cumsum(axis=1)[:, ::-1]  # [G, 43]: above[g, j] = pairs of g with h >= j
    fits = above[:, 1:] < BINADE_BUCKETS  # [G, 42]: fits[g, r] iff 1 + #{h > r} <= BINADE_BUCKETS
    fits &= np.arange(width - 1, dtype=np.uint64)[None, :] >= t[:, None]
    return np.argmax(fits, axis=1).astype(np.uint64)  # the first r that fits; r = 41 always does


def bucket_quantile(counts: np.ndarray, lo: np.ndarray, hi: np.ndarray, q: float, vmin: float, vmax: float) -> float:
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
