"""One dimension's histogram re-binned from the statistics' buckets (`export/core/stats.py`), so the
report draws every dimension without re-reading a shard. Pure numpy.

Range. The bins span [q01, q99] widened to the exact min / max when the tail beyond a quantile is
short (at most `TAIL` of the q01..q99 span): most signals then show their whole range, and a signal
with a few far outliers (a sensor spike of 1e3 among values in [-1, 1]) is not squeezed into one or
two bins. When a tail is cut, its values are counted in the end bin and the histogram says so
(`clipped_low` / `clipped_high`), so the bins' counts always sum to the dimension's count. A
dimension whose q01..q99 span is empty (a constant, or a 0/1 gripper closed 99% of the time) spans
[min, max]; a single value gets one bin of width 1 around it.

Buckets into bins. A bucket holding one distinct value (lo == hi: every bucket of a discrete
signal) goes to the bin of that value, exactly as `np.histogram` would put the values. A wider
bucket goes whole to the bin of its midpoint (not spread over the bins it overlaps): counts stay
integers and sum exactly, and the error is at most one bucket's width, which is <= 2**-8 of its
binade and usually far below a bin's (1/30 of the range): a bucket straddles bins only when the
data sit far from zero with a tiny spread, where the statistics pick finer buckets anyway.

Cost: O(buckets of the dimension) (a few thousand at most), independent of the number of episodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from robowds.export.core.buckets import DIM_SHIFT
from robowds.export.core.stats import FieldStats

BINS = 30  # enough to show shape (bimodal, skewed, clipped), small enough to draw in ~2 KB of SVG
TAIL = 0.1  # a tail beyond q01 / q99 no longer than this share of the q01..q99 span is shown whole


@dataclass(frozen=True)
class Histogram:
    edges: np.ndarray  # [B+1] float64, strictly increasing
    counts: np.ndarray  # [B] int64, sum = the dimension's count
    clipped_low: bool  # values below edges[0] are counted in the first bin
    clipped_high: bool  # values above edges[-1] are counted in the last bin


def histogram_range(vmin: float, vmax: float, q01: float, q99: float) -> tuple[float, float, bool, bool]:
    """(low, high, clipped_low, clipped_high): the span the bins cover, by the rule in the module doc."""
    span = q99 - q01
    if not span > 0:
        low, high, cut_low, cut_high = vmin, vmax, False, False
    else:
        cut_low = q01 - vmin > TAIL * span
        cut_high = vmax - q99 > TAIL * span
        low, high = (q01 if cut_low else vmin), (q99 if cut_high else vmax)
    if not high > low:  # one value
        return low - 0.5, low + 0.5, False, False
    return low, high, cut_low, cut_high


def rebin(counts: np.ndarray, lo: np.ndarray, hi: np.ndarray, vmin: float, vmax: float, q01: float, q99: float,
          bins: int = BINS) -> Histogram:
    """One dimension's buckets (`counts`, `lo`, `hi`: [K] each, any order) as `bins` equal-width bins."""
    low, high, cut_low, cut_high = histogram_range(vmin, vmax, q01, q99)
    edges = np.linspace(low, high, bins + 1)  # [B+1]
    if not np.all(np.diff(edges) > 0):  # a span of a few ulps (1e6 .. 1e6 + 1e-10): one unit around it
        edges = np.linspace(low - 0.5, low + 0.5, bins + 1)
    where = np.where(lo == hi, lo, lo + (hi - lo) / 2)  # [K] the value, or the bucket's midpoint
    index = np.clip(np.searchsorted(edges, where, side="right") - 1, 0, bins - 1)  # [K]; last bin closed, as numpy
    out = np.zeros(bins, np.int64)  # [B]
    np.add.at(out, index, np.asarray(counts, np.int64))  # integer adds: exact for any count
    return Histogram(edges, out, bool(cut_low), bool(cut_high))


def field_histograms(stats: FieldStats, summary: dict[str, list[float]], bins: int = BINS) -> list[Histogram]:
    """One histogram per dimension of a field's merged statistics; `summary` is the manifest's
    entry for it (its min, max, q01, q99 lists)."""
    dim_of = stats.keys >> DIM_SHIFT  # [K], sorted
    bounds = np.searchsorted(dim_of, np.arange(stats.dims + 1, dtype=np.uint64))  # [N+1]
    return [rebin(stats.counts[a:b], stats.lo[a:b], stats.hi[a:b], float(summary["min"][d]),
                  float(summary["max"][d]), float(summary["q01"][d]), float(summary["q99"][d]), bins)
            for d, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
