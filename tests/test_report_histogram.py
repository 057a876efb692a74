"""The report's histograms re-binned from the statistics' buckets (export/report/histogram.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from robowds.export.core.stats import FieldStats
from robowds.export.report.histogram import BINS, field_histograms, histogram_range, rebin

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32)


def _quantiles(values: np.ndarray) -> tuple[float, float, float, float]:
    return float(values.min()), float(values.max()), float(np.quantile(values, 0.01)), float(np.quantile(values, 0.99))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(finite, finite, st.integers(1, 10 ** 12)), min_size=1, max_size=40),
       st.integers(1, 40))
def test_bins_sum_to_the_count_and_edges_increase(buckets, bins):
    lo = np.array([min(a, b) for a, b, _ in buckets])
    hi = np.array([max(a, b) for a, b, _ in buckets])
    counts = np.array([c for _, _, c in buckets], np.int64)
    vmin, vmax = float(lo.min()), float(hi.max())
    q01, q99 = np.quantile(np.concatenate([lo, hi]), [0.01, 0.99])
    h = rebin(counts, lo, hi, vmin, vmax, float(q01), float(q99), bins)
    assert len(h.counts) == bins and len(h.edges) == bins + 1
    assert int(h.counts.sum()) == int(counts.sum())  # exact, even at 1e12 per bucket
    assert np.all(np.diff(h.edges) > 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(finite, st.integers(1, 1000)), min_size=1, max_size=40, unique_by=lambda t: t[0]))
def test_one_value_buckets_give_numpys_histogram(buckets):
    values = np.array([v for v, _ in buckets], np.float64)
    counts = np.array([c for _, c in buckets], np.int64)
    everything = np.repeat(values, counts)
    vmin, vmax, q01, q99 = _quantiles(everything)
    h = rebin(counts, values, values, vmin, vmax, q01, q99)
    clipped = np.clip(everything, h.edges[0], h.edges[-1])  # clipped tails are counted in the end bins
    expected, _ = np.histogram(clipped, bins=h.edges)
    assert h.counts.tolist() == expected.tolist()


def test_range_rule():
    assert histogram_range(-1.0, 1.0, -0.9, 0.9) == (-1.0, 1.0, False, False)  # short tails: whole range
    assert histogram_range(-1.0, 1000.0, -0.9, 0.9) == (-1.0, 0.9, False, True)  # a far spike is cut
    assert histogram_range(0.0, 1.0, 1.0, 1.0) == (0.0, 1.0, False, False)  # empty q01..q99: min..max
    assert histogram_range(3.0, 3.0, 3.0, 3.0) == (2.5, 3.5, False, False)  # a constant: one unit around it


def test_field_histograms_from_real_statistics():
    """A 0/1 gripper and an integer ramp: every bucket holds one value, so the histograms are exact."""
    rng = np.random.default_rng(0)
    values = np.column_stack([rng.integers(0, 2, 5000), rng.integers(-20, 21, 5000)]).astype(np.float64)  # [M, 2]
    stats = FieldStats.of(values)
    summary = stats.summary()
    grip, ramp = field_histograms(stats, summary)
    assert int(grip.counts.sum()) == int(ramp.counts.sum()) == 5000
    assert [grip.counts[0], grip.counts[-1]] == [int((values[:, 0] == 0).sum()), int((values[:, 0] == 1).sum())]
    assert ramp.counts.tolist() == np.histogram(values[:, 1], bins=ramp.edges)[0].tolist()
    assert len(ramp.counts) == BINS
