"""Normalisation statistics over valid window steps, computed per episode and merged in episode order.

Per episode we keep count, mean, M2 (Chan et al. parallel variance), min, max and a quantile sketch:
all values when there are at most `SKETCH_POINTS`, else the values at `SKETCH_POINTS` evenly spaced
quantiles, each standing for count / SKETCH_POINTS values. Merging is done in episode order, so the
result does not depend on how many workers computed the partials. q01/q99 interpolate the merged,
weighted sketch (each point at the middle of its weight): within one order statistic of the exact
quantile when no episode has more than 512 valid steps, within about 1/512 in rank otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SKETCH_POINTS = 512
QUANTILES = {"q01": 0.01, "q99": 0.99}


@dataclass
class FieldStats:
    count: int
    mean: np.ndarray  # [N]
    m2: np.ndarray  # [N]
    min: np.ndarray  # [N]
    max: np.ndarray  # [N]
    sketch: np.ndarray  # [K, N] sorted per column
    weight: np.ndarray  # [K] how many values each sketch row stands for

    @classmethod
    def of(cls, values: np.ndarray) -> "FieldStats | None":
        """Statistics of valid steps `values` [M, N]; None when there are none."""
        if len(values) == 0:
            return None
        v = values.astype(np.float64)
        mean = v.mean(axis=0)
        ordered = np.sort(v, axis=0)  # [M, N]; one sort beats np.quantile's 512-way partition 5x
        if len(v) <= SKETCH_POINTS:
            sketch, weight = ordered, np.ones(len(v))
        else:  # the order statistics at the middle of SKETCH_POINTS equal-weight bins
            picks = ((np.arange(SKETCH_POINTS) + 0.5) * len(v) / SKETCH_POINTS).astype(np.int64)
            sketch = ordered[picks]
            weight = np.full(SKETCH_POINTS, len(v) / SKETCH_POINTS)
        return cls(len(v), mean, ((v - mean) ** 2).sum(axis=0), v.min(axis=0), v.max(axis=0), sketch, weight)

    def to_state(self) -> dict:
        """Compact, msgpack-able state: arrays as little-endian float64 bytes (Python float lists of
        300 episodes' sketches took 130 MB in the parent; bytes take 9 MB)."""
        state: dict = {"count": self.count, "dims": int(self.mean.shape[0])}
        for key in ("mean", "m2", "min", "max", "sketch", "weight"):
            state[key] = np.ascontiguousarray(getattr(self, key), dtype="<f8").tobytes()
        return state

    @classmethod
    def from_state(cls, state: dict) -> "FieldStats":
        dims = int(state["dims"])
        arrays = {k: np.frombuffer(state[k], dtype="<f8") for k in ("mean", "m2", "min", "max", "sketch", "weight")}
        arrays["sketch"] = arrays["sketch"].reshape(-1, dims)
        return cls(int(state["count"]), **arrays)

    def summary(self) -> dict[str, object]:
        """The manifest's entry: count, mean, std (population), min, max, q01, q99 per dimension."""
        out: dict[str, object] = {"count": self.count, "mean": self.mean.tolist(),
                                  "std": np.sqrt(self.m2 / self.count).tolist(),
                                  "min": self.min.tolist(), "max": self.max.tolist()}
        for name, q in QUANTILES.items():
            out[name] = [_weighted_quantile(self.sketch[:, d], self.weight, q) for d in range(self.sketch.shape[1])]
        return out


def _weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """Quantile `q` of a weighted sample; each point sits at the middle of its cumulative weight."""
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cum = np.cumsum(w) - w / 2.0
    total = w.sum()
    target = q * total
    return float(np.interp(target, cum, v))


def merge_all(parts: list[FieldStats | None]) -> FieldStats | None:
    """Chan et al.'s pairwise update in list order; sketches concatenated once at the end."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    first = present[0]
    count, mean, m2 = first.count, first.mean.copy(), first.m2.copy()
    lo, hi = first.min.copy(), first.max.copy()
    for part in present[1:]:
        n = count + part.count
        delta = part.mean - mean
        mean = mean + delta * (part.count / n)
        m2 = m2 + part.m2 + delta ** 2 * (count * part.count / n)
        lo, hi, count = np.minimum(lo, part.min), np.maximum(hi, part.max), n
    return FieldStats(count, mean, m2, lo, hi, np.concatenate([p.sketch for p in present]),
                      np.concatenate([p.weight for p in present]))
