"""Normalisation statistics: exact moments, worker-independent merging, bounded quantile error."""

from __future__ import annotations

import msgpack
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from export.stats import SKETCH_POINTS, FieldStats, merge_all


def test_small_field_is_exact() -> None:
    v = np.array([[1.0, -2.0], [3.0, 0.0], [5.0, 2.0]])
    s = FieldStats.of(v).summary()
    assert s["count"] == 3 and s["mean"] == [3.0, 0.0] and s["min"] == [1.0, -2.0] and s["max"] == [5.0, 2.0]
    np.testing.assert_allclose(s["std"], v.std(axis=0), rtol=1e-15)
    assert FieldStats.of(np.zeros((0, 2))) is None


@given(st.lists(st.integers(1, 3000), min_size=1, max_size=8), st.integers(0, 2**31))
@settings(max_examples=40, deadline=None)
def test_merged_parts_match_the_whole(sizes: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    parts = [rng.normal(loc=rng.uniform(-5, 5), size=(n, 3)) for n in sizes]
    whole = np.concatenate(parts)
    states = [msgpack.unpackb(msgpack.packb(FieldStats.of(p).to_state())) for p in parts]  # as staged
    merged = merge_all([FieldStats.from_state(s) for s in states] + [None]).summary()
    assert merged["count"] == len(whole)
    np.testing.assert_allclose(merged["mean"], whole.mean(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(merged["std"], whole.std(axis=0), rtol=1e-9)
    assert merged["min"] == whole.min(axis=0).tolist() and merged["max"] == whole.max(axis=0).tolist()
    for name, q in (("q01", 0.01), ("q99", 0.99)):
        # rank error bound: within 1/SKETCH_POINTS (+ one sample) of the exact quantile's rank
        ranks = [(whole[:, d] <= merged[name][d]).mean() for d in range(3)]
        assert all(abs(r - q) <= 1.0 / SKETCH_POINTS + 2.0 / len(whole) for r in ranks), (ranks, q)
