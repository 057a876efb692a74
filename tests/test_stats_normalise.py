"""`normalise` (export/core/buckets.py) picks each binade's resolution in one pass; the step-by-step
loop it replaced is kept here as the reference, and both must give the same arrays for every input
(the manifest's statistics bytes depend on them)."""

from __future__ import annotations

import numpy as np
import pytest

from robowds.export.core.buckets import (BINADE_BUCKETS, GROUP_SHIFT, bucket_of, normalise, raw_keys, reduce_sorted,
                                         resolution)


def loop_normalise(keys: np.ndarray, counts: np.ndarray, lo: np.ndarray, hi: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The previous implementation: coarsen every over-full binade by one bit per pass until all fit."""
    order = np.argsort(keys)
    keys, counts, lo, hi = reduce_sorted(keys[order], counts[order], lo[order], hi[order])
    group = keys >> GROUP_SHIFT
    starts = np.flatnonzero(np.concatenate([[True], group[1:] != group[:-1]]))
    groups = group[starts]
    where = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(keys))))
    own = resolution(keys)
    t = np.maximum.reduceat(own, starts)
    if not np.array_equal(own, t[where]):
        keys, counts, lo, hi = reduce_sorted(bucket_of(keys, t[where]), counts, lo, hi)
        where = np.searchsorted(groups, keys >> GROUP_SHIFT)
    while True:
        over = np.bincount(where, minlength=len(groups)) > BINADE_BUCKETS
        if not over.any():
            return keys, counts, lo, hi
        t[over] += np.uint64(1)
        keys, counts, lo, hi = reduce_sorted(bucket_of(keys, t[where]), counts, lo, hi)
        where = np.searchsorted(groups, keys >> GROUP_SHIFT)


def entries(rng: np.random.Generator, n: int, dims: int) -> tuple[np.ndarray, ...]:
    """Bucket entries of `n` x `dims` values of mixed kinds (wide spreads, clusters, a few discrete
    levels, zeros, negatives), each at a random resolution, as merged states hold them."""
    kind = rng.integers(0, 4)
    if kind == 0:
        v = rng.standard_normal((n, dims)) * 10.0 ** rng.integers(-6, 6)
    elif kind == 1:
        v = rng.choice([-2.5, 0.0, 1.0, 3.0, 1e-70], size=(n, dims))
    elif kind == 2:
        v = np.exp(rng.uniform(-40, 40, (n, dims))) * rng.choice([-1, 1], (n, dims))
    else:
        v = 1.0 + rng.uniform(0, 1e-9, (n, dims))  # one binade, finely spread: many coarsening steps
    flat = v.T.ravel()
    keys = raw_keys(v).T.ravel()
    t = rng.integers(1, 42, len(keys)).astype(np.uint64)
    t = np.where(rng.random(len(keys)) < 0.7, np.uint64(1), t)
    return bucket_of(keys, t), rng.integers(1, 5, len(keys)), flat.copy(), flat.copy()


@pytest.mark.parametrize("seed", range(40))
def test_one_pass_equals_the_step_by_step_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    parts = [entries(rng, int(rng.integers(1, 3000)), int(rng.integers(1, 5))) for _ in range(int(rng.integers(1, 4)))]
    dims = {int(p[0][0] >> np.uint64(53)) for p in parts}
    parts = [p for p in parts if int(p[0][0] >> np.uint64(53)) < 4] or parts[:1]
    args = [np.concatenate([p[i] for p in parts]) for i in range(4)]
    expected = loop_normalise(*args)
    got = normalise(*args)
    for a, b in zip(expected, got):
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=False)
    assert dims  # at least one part


def test_finely_spread_binade_keeps_at_most_the_bucket_limit() -> None:
    values = 1.0 + np.arange(100_000)[:, None] * 1e-12  # [M, 1]: one binade, 100k distinct values
    keys = bucket_of(raw_keys(values).ravel(), np.uint64(1))
    out = normalise(keys, np.ones(len(keys), np.int64), values.ravel(), values.ravel())
    assert len(out[0]) <= BINADE_BUCKETS and int(out[1].sum()) == 100_000
    assert [a.tolist() for a in out] == [a.tolist() for a in loop_normalise(keys, np.ones(len(keys), np.int64),
                                                                            values.ravel(), values.ravel())]
