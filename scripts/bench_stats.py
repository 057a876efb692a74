"""Folding per-episode normalisation statistics into one per-split summary: the previous 512-point
sketch (copied below as the baseline) against `robowds.export.core.stats`, on the same synthetic per-episode
partials, the way `export/job/run.py` does it (msgpack record -> from_state -> merge -> summary).

    python scripts/bench_stats.py                      # 1k, 4k and 100k episodes; ~5 minutes on 2 cores
    python scripts/bench_stats.py --episodes 1000 4000

Episodes: 600 steps x 26 dimensions cycling through 8 signal kinds (normal, uniform, Student t(2),
bimodal, 0/1 flag, 1000 +- 0.01, 1e-9-scale noise, values over 7 decades crossing 0). `--pool`
distinct episodes are generated and staged once, then used in turn (the concatenated data is the
pool repeated, so its exact quantile ranks are the pool's, computed with numpy). Per row: the wall
and CPU time of the fold (no tracing), its peak traced memory (a second run under tracemalloc, which
holds what Python and numpy allocate), and the worst q01/q99 rank error over the 26 dimensions:
the distance in rank between the estimate and the exact quantile. The old sketch is not run where
its per-episode sketches would not fit in memory (26 x 512 x 16 bytes per episode).
"""

from __future__ import annotations

import time
import tracemalloc
from dataclasses import dataclass
from typing import Any, Callable

import msgpack
import numpy as np

from robowds.export.core.stats import FieldStats, StatsAccumulator

import benchlib

KINDS = ("normal", "uniform", "heavy", "bimodal", "discrete", "far", "near_zero", "wide")
DIMS, STEPS = 26, 600


def sample(rng: np.random.Generator, kind: str, n: int) -> np.ndarray:
    """[n] values of one signal kind (the same kinds as tests/test_stats.py)."""
    if kind == "normal":
        return rng.normal(rng.uniform(-2, 2), rng.uniform(0.1, 2), n)
    if kind == "uniform":
        return rng.uniform(-3.0, 1.0, n)
    if kind == "heavy":
        return rng.standard_t(2, n)
    if kind == "bimodal":
        return np.where(rng.uniform(size=n) < 0.3, rng.normal(-1.0, 0.05, n), rng.normal(2.0, 0.2, n))
    if kind == "discrete":
        return (rng.uniform(size=n) < 0.4).astype(np.float64)
    if kind == "far":
        return 1e3 + 1e-2 * rng.normal(size=n)
    if kind == "near_zero":
        return 1e-9 * rng.normal(size=n)
    return rng.normal(0, 1, n) * 10.0 ** rng.integers(-3, 4, n)


# ------------------------------------------------------------ baseline: export/core/stats.py before this change

OLD_SKETCH_POINTS = 512


@dataclass
class OldFieldStats:
    count: int
    mean: np.ndarray  # [N]
    m2: np.ndarray  # [N]
    min: np.ndarray  # [N]
    max: np.ndarray  # [N]
    sketch: np.ndarray  # [K, N] sorted per column
    weight: np.ndarray  # [K]

    @classmethod
    def of(cls, values: np.ndarray) -> "OldFieldStats":
        v = values.astype(np.float64)
        mean = v.mean(axis=0)
        ordered = np.sort(v, axis=0)
        if len(v) <= OLD_SKETCH_POINTS:
            sketch, weight = ordered, np.ones(len(v))
        else:
            picks = ((np.arange(OLD_SKETCH_POINTS) + 0.5) * len(v) / OLD_SKETCH_POINTS).astype(np.int64)
            sketch = ordered[picks]
            weight = np.full(OLD_SKETCH_POINTS, len(v) / OLD_SKETCH_POINTS)
        return cls(len(v), mean, ((v - mean) ** 2).sum(axis=0), v.min(axis=0), v.max(axis=0), sketch, weight)

    def to_state(self) -> dict:
        state: dict = {"count": self.count, "dims": int(self.mean.shape[0])}
        for key in ("mean", "m2", "min", "max", "sketch", "weight"):
            state[key] = np.ascontiguousarray(getattr(self, key), dtype="<f8").tobytes()
        return state

    @classmethod
    def from_state(cls, state: dict) -> "OldFieldStats":
        dims = int(state["dims"])
        arrays = {k: np.frombuffer(state[k], dtype="<f8") for k in ("mean", "m2", "min", "max", "sketch", "weight")}
        arrays["sketch"] = arrays["sketch"].reshape(-1, dims)
        return cls(int(state["count"]), **arrays)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"count": self.count, "mean": self.mean.tolist(),
                               "std": np.sqrt(self.m2 / self.count).tolist(),
                               "min": self.min.tolist(), "max": self.max.tolist()}
        for name, q in (("q01", 0.01), ("q99", 0.99)):
            out[name] = [_old_weighted_quantile(self.sketch[:, d], self.weight, q) for d in range(self.sketch.shape[1])]
        return out


def _old_weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cum = np.cumsum(w) - w / 2.0
    return float(np.interp(q * w.sum(), cum, v))


def old_merge_all(parts: list[OldFieldStats]) -> OldFieldStats:
    first = parts[0]
    count, mean, m2 = first.count, first.mean.copy(), first.m2.copy()
    lo, hi = first.min.copy(), first.max.copy()
    for part in parts[1:]:
        n = count + part.count
        delta = part.mean - mean
        mean = mean + delta * (part.count / n)
        m2 = m2 + part.m2 + delta ** 2 * (count * part.count / n)
        lo, hi, count = np.minimum(lo, part.min), np.maximum(hi, part.max), n
    return OldFieldStats(count, mean, m2, lo, hi, np.concatenate([p.sketch for p in parts]),
                         np.concatenate([p.weight for p in parts]))


def fold_old(records: list[bytes], episodes: int) -> dict[str, Any]:
    """As report.build_manifest did: every episode's state loaded, then merged at once."""
    parts = [OldFieldStats.from_state(msgpack.unpackb(records[i % len(records)], raw=False)) for i in range(episodes)]
    return old_merge_all(parts).summary()


def fold_new(records: list[bytes], episodes: int) -> dict[str, Any]:
    """As job.py + report.SplitStats do: each record folded as it is loaded."""
    acc = StatsAccumulator()
    for i in range(episodes):
        acc.add_state(msgpack.unpackb(records[i % len(records)], raw=False))
    merged = acc.result()
    assert merged is not None
    return merged.summary()


def worst_rank_error(summary: dict[str, Any], ordered: np.ndarray) -> float:
    """Largest distance in rank between an estimate and q, over q01/q99 and all dimensions."""
    n, worst = len(ordered), 0.0
    for name, q in (("q01", 0.01), ("q99", 0.99)):
        for d, value in enumerate(summary[name]):
            below = np.searchsorted(ordered[:, d], value, "left") / n
            upto = np.searchsorted(ordered[:, d], value, "right") / n
            worst = max(worst, below - q, q - upto)
    return worst


def measure(fold: Callable[[list[bytes], int], dict[str, Any]], records: list[bytes], episodes: int,
            ordered: np.ndarray) -> str:
    wall, cpu = time.perf_counter(), time.process_time()
    summary = fold(records, episodes)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    tracemalloc.start()
    fold(records, episodes)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return (f"{wall:7.2f} s wall {cpu:7.2f} s cpu  peak {peak / 1e6:8.1f} MB  "
            f"worst q01/q99 rank error {worst_rank_error(summary, ordered):.4%}"), wall, peak  # type: ignore[return-value]


def main() -> None:
    # --repeats: unused (one fold per size, then one under tracemalloc); kept for one option set
    parser = benchlib.parser(__doc__, repeats=1, quick={"episodes": [100], "pool": 20})
    parser.add_argument("--episodes", type=int, nargs="+", default=[1000, 4000, 100_000])
    parser.add_argument("--pool", type=int, default=250, help="distinct synthetic episodes, used in turn")
    parser.add_argument("--old-limit", type=int, default=4000, help="largest episode count the old sketch runs")
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_stats", args)
    rng = np.random.default_rng(0)
    kinds = [KINDS[d % len(KINDS)] for d in range(DIMS)]
    data = [np.stack([sample(rng, k, STEPS) for k in kinds], axis=1) for _ in range(args.pool)]  # [STEPS, DIMS]
    ordered = np.sort(np.concatenate(data), axis=0)
    new_records = [msgpack.packb(FieldStats.of(v).to_state(), use_bin_type=True) for v in data]
    old_records = [msgpack.packb(OldFieldStats.of(v).to_state(), use_bin_type=True) for v in data]
    print(f"{DIMS} dims x {STEPS} steps per episode; {args.pool} distinct episodes used in turn; "
          f"staged state per episode: old {np.mean([len(r) for r in old_records]) / 1e3:.0f} KB, "
          f"new {np.mean([len(r) for r in new_records]) / 1e3:.0f} KB")
    for episodes in args.episodes:
        new_line, new_wall, new_peak = measure(fold_new, new_records, episodes, ordered)  # type: ignore[misc]
        print(f"{episodes:>7} episodes  new: {new_line}")
        report.add(f"{episodes:,} episodes: new sketch, peak memory", new_peak / 1e6, "MB")
        if episodes <= args.old_limit:
            old_line, old_wall, old_peak = measure(fold_old, old_records, episodes, ordered)  # type: ignore[misc]
            print(f"{episodes:>7} episodes  old: {old_line}")
            print(f"{episodes:>7} episodes  old/new: {old_wall / new_wall:.1f}x time, {old_peak / new_peak:.1f}x memory")
            report.add(f"{episodes:,} episodes: new sketch (vs old), wall", new_wall, "s", baseline=old_wall,
                       ratio=old_wall / new_wall, target="ratio = x faster")
        else:
            print(f"{episodes:>7} episodes  old: not run (its sketches alone take "
                  f"{episodes * DIMS * OLD_SKETCH_POINTS * 16 / 1e9:.1f} GB before the final sort)")
            report.add(f"{episodes:,} episodes: new sketch, wall", new_wall, "s")
    report.finish()


if __name__ == "__main__":
    main()
