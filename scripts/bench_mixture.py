"""Benchmark: what a weighted mixture's plan costs one DataLoader worker at a resume at 99% of an epoch,
the per-position plan (`robowds.reader.mixing.MixPlan`) against a materialised choice array (the usual
way: `rng.choice(S, N, p=weights)` per epoch, then per-source draw counts by scanning it up to the
cursor), on synthetic manifest counts (20 sources, shards of 1000 samples, sizes and weights uneven).

    .venv/bin/python scripts/bench_mixture.py                      # 1M, 10M, 100M positions
    .venv/bin/python scripts/bench_mixture.py --sizes 1e8 --repeats 1

World 8, 8 DataLoader workers per rank, batch 32: one worker (rank 5, worker 7) builds its plan and
computes (source, sample id) for its first batch after a resume at 99% of its rank's positions; the
same after an elastic change (8 ranks consumed half, 6 resume). The baseline is given its best shape:
the choice array as int8 built in chunks of 4M (a one-shot `rng.choice` of 100M positions allocates
~1.6 GB of float64 and int64 temporaries), the draw counts with one `bincount` up to the cursor.
Printed: best and first seconds, and peak memory allocated (tracemalloc) during a run.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from robowds.reader.mixing import MixPlan, SourcePlan
from robowds.reader.plan import EpochOrder, Topology, worker_chunks

import benchlib

WORLD, WORKERS, BATCH, RANK, WORKER, FRACTION, PER_SHARD, SOURCES = 8, 8, 32, 5, 7, 0.99, 1000, 20
BUILD_CHUNK = 1 << 22


def layout(total: int) -> tuple[list[SourcePlan], np.ndarray]:
    """20 sources of uneven sizes summing to ~`total`, and uneven weights (not proportional to size)."""
    rng = np.random.default_rng(0)
    shares = rng.dirichlet(np.ones(SOURCES))
    sizes = np.maximum(PER_SHARD, (shares * total // PER_SHARD).astype(np.int64) * PER_SHARD)
    sources = [SourcePlan(tuple([PER_SHARD] * (int(n) // PER_SHARD)), seed=i, block=4096) for i, n in enumerate(sizes)]
    return sources, rng.dirichlet(np.ones(SOURCES) * 2)


def new_first_batch(sources: list[SourcePlan], weights: np.ndarray, world: int,
                    history: tuple[Topology, ...]) -> np.ndarray:
    total = sum(sum(s.counts) for s in sources)
    plan = MixPlan(weights, total, sources, 0, 1, policy="pad", history=history, world_size=world, rank=RANK)
    start = int(plan.length * FRACTION)
    positions = next(worker_chunks(plan.length, start, BATCH, WORKERS, WORKER, chunk=BATCH))
    return plan.ids(positions)[1]


def old_first_batch(sources: list[SourcePlan], weights: np.ndarray, world: int,
                    history: tuple[Topology, ...]) -> np.ndarray:
    """Materialised: the epoch's [N] choice array (int8), the rank's positions (elastic history as in
    the plan), per-source draw counts before the batch by bincount, then each source's own plan."""
    from robowds.reader.plan import rank_share, remaining_ranges

    sizes = np.array([sum(s.counts) for s in sources])
    total = int(sizes.sum())
    rng = np.random.default_rng([0, 1])
    choice = np.empty(total, dtype=np.int8)  # [N]
    for lo in range(0, total, BUILD_CHUNK):
        choice[lo:lo + BUILD_CHUNK] = rng.choice(len(sources), min(BUILD_CHUNK, total - lo), p=weights)
    lo_r, hi_r = remaining_ranges(total, history, "pad")
    remaining = int((hi_r - lo_r).sum())
    length = rank_share(remaining, world, "pad")
    start = int(length * FRACTION)
    rank_positions = RANK * length + next(worker_chunks(length, start, BATCH, WORKERS, WORKER, chunk=BATCH))
    before = np.cumsum(hi_r - lo_r) - (hi_r - lo_r)
    k = np.searchsorted(before, rank_positions % remaining, side="right") - 1
    global_positions = lo_r[k] + (rank_positions % remaining - before[k])  # [B] epoch positions
    first = int(global_positions.min())
    draws_before = np.bincount(choice[:first], minlength=len(sources))  # [S] one scan up to the cursor
    ids = np.empty(len(global_positions), dtype=np.int64)
    for i, p in enumerate(global_positions.tolist()):
        s = int(choice[p])
        draw = draws_before[s] + int((choice[first:p] == s).sum())
        spec = sources[s]
        ids[i] = EpochOrder(spec.counts, spec.seed, draw // sizes[s], spec.shuffle, spec.block)(
            np.array([draw % sizes[s]]))[0]
    return ids


def measure(fn: Callable[[], np.ndarray], repeats: int) -> tuple[float, float, float]:
    """(best seconds, first run's seconds, peak MB allocated during a run)."""
    timing = benchlib.timed(fn, repeats, traced=True)
    return timing.best, timing.first, timing.peak_mb


def main() -> None:
    parser = benchlib.parser(__doc__, repeats=3, quick={"sizes": [1e6], "repeats": 1})
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7, 1e8])
    parser.add_argument("--old-max", type=float, default=1e8, help="largest size the materialised baseline runs at")
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_mixture", args)
    print(f"{SOURCES} sources, world {WORLD}, {WORKERS} workers per rank, batch {BATCH}; rank {RANK} worker "
          f"{WORKER}: plan + (source, id) of its first batch after a resume at {FRACTION:.0%}; best of {args.repeats}")
    print(f"{'positions':>12} {'case':<8} {'plan':<13} {'best s':>9} {'first s':>9} {'peak MB':>9}   "
          "materialised / per-position")
    for size in (int(s) for s in args.sizes):
        sources, weights = layout(size)
        total = sum(sum(s.counts) for s in sources)
        half = -(-total // WORLD) // 2
        for case, world, history in (("resume", WORLD, ()), ("elastic", 6, (Topology(WORLD, half),))):
            rows = {}
            for name, fn in (("materialised", old_first_batch), ("per-position", new_first_batch)):
                if name == "materialised" and size > args.old_max:
                    continue
                seconds, first, peak = measure(lambda: fn(sources, weights, world, history), args.repeats)
                rows[name] = (seconds, peak)
                if name == "per-position":
                    report.add(f"{total:,} positions, {case}: peak memory", peak, "MB")
                print(f"{total:>12,} {case:<8} {name:<13} {seconds:>9.4f} {first:>9.4f} {peak:>9.1f}",
                      end="" if name == "per-position" and "materialised" in rows else "\n")
            if "materialised" in rows:
                (t_old, m_old), (t_new, m_new) = rows["materialised"], rows["per-position"]
                print(f"   {t_old / t_new:,.0f}x faster, {m_old / max(m_new, 1e-3):,.0f}x less memory")
                report.add(f"{total:,} positions, {case}: per-position (vs materialised)", t_new, "s",
                           baseline=t_old, ratio=t_old / t_new, target="ratio = x faster")
            else:
                report.add(f"{total:,} positions, {case}: per-position", rows["per-position"][0], "s")
    report.finish()


if __name__ == "__main__":
    main()
