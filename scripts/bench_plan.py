"""Benchmark: what the epoch plan costs one DataLoader worker at start or resume, today's per-position
plan (`robowds.reader.plan.RankPlan`) against the materialising plan it replaced (kept below as the
baseline, `old_*`), on synthetic manifest counts (shards of 1000 samples).

    .venv/bin/python scripts/bench_plan.py                        # 1M, 10M, 100M; the old plan up to 10M
    .venv/bin/python scripts/bench_plan.py --old-max 100000000    # the old plan at 100M too (~5 GB, minutes)

For each size: world size 8, 8 DataLoader workers per rank, batch size 32; one worker (rank 5, worker
7) computes its plan and the sample ids of its first batch after a resume at 99% of the epoch, and
the same after an elastic change (8 ranks consumed half the epoch, 6 ranks resume at 99% of the rest).
Printed: seconds (best of --repeats, each in a fresh plan, and the first of them) and peak memory
allocated while doing it (tracemalloc: numpy's arrays are traced), the old/new ratios of the best
times and the peaks, and read locality: how many distinct shards the worker's first (up to 4096)
samples after the resume come from, and on average one batch of 32.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from robowds.reader.plan import PlanSpec, RankPlan, Topology

import benchlib

WORLD, WORKERS, BATCH, RANK, WORKER, FRACTION, PER_SHARD, BLOCK = 8, 8, 32, 5, 7, 0.99, 1000, 4096
_PLAN_SALT = 0x7E5


# ---- the baseline: the plan as it was (reader/plan.py before per-position ids), materialising [N] ----

def old_epoch_order(counts: Sequence[int], seed: int, epoch: int, block: int = 4096) -> np.ndarray:
    counts_arr = np.asarray(counts, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts_arr)[:-1]]).astype(np.int64)
    rng = np.random.default_rng([seed, epoch, _PLAN_SALT])
    shard_order = rng.permutation(len(counts_arr))
    lengths = counts_arr[shard_order]  # [S]
    ids = np.repeat(starts[shard_order] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    ids += np.arange(int(lengths.sum()), dtype=np.int64)  # [N]
    if block > 1 and len(ids):
        keys = rng.random(len(ids))  # [N]
        blocks = np.arange(len(ids)) // block
        ids = ids[np.lexsort((keys, blocks))]
    return ids


def old_split_ranks(order: np.ndarray, world_size: int) -> np.ndarray:  # policy "pad"
    n = len(order)
    per_rank = -(-n // world_size)
    filled = np.concatenate([order, order[: per_rank * world_size - n]]) if n else order
    if len(filled) < per_rank * world_size:
        filled = np.resize(order, per_rank * world_size)
    return filled.reshape(world_size, per_rank)


def old_rank_sequence(counts: Sequence[int], epoch: int, world: int, rank: int,
                      history: tuple[Topology, ...]) -> np.ndarray:
    order = old_epoch_order(counts, 0, epoch, BLOCK)
    for previous in history:
        ranks = old_split_ranks(order, previous.world_size)
        order = order[~np.isin(order, ranks[:, : previous.consumed].ravel())]
    return old_split_ranks(order, world)[rank]


def old_first_batch(counts: Sequence[int], world: int, history: tuple[Topology, ...]) -> np.ndarray:
    """What a worker did: the rank's whole sequence, its positions from the cursor, the first batch."""
    sequence = old_rank_sequence(counts, 1, world, RANK, history)  # [R]
    start = int(len(sequence) * FRACTION)
    positions = np.arange(start, len(sequence), dtype=np.int64)
    positions = positions[(positions - start) // BATCH % WORKERS == WORKER]
    return sequence[positions][:4096]


def new_first_batch(counts: Sequence[int], world: int, history: tuple[Topology, ...]) -> np.ndarray:
    """What a worker does now: the O(shards) plan, then only its first chunk of positions."""
    plan = RankPlan(PlanSpec(tuple(counts), 0, True, BLOCK, "pad", history), 1, world, RANK)
    start = int(plan.length * FRACTION)
    return next(plan.worker_ids(plan.length, start, BATCH, WORKERS, WORKER))[:4096]


# ---- measuring ------------------------------------------------------------------------------------

def measure(fn: Callable[[], np.ndarray], repeats: int) -> tuple[float, float, float, np.ndarray]:
    """(best seconds, first run's seconds, peak MB allocated during a run, its result)."""
    timing = benchlib.timed(fn, repeats, traced=True)
    return timing.best, timing.first, timing.peak_mb, timing.result


def locality(ids: np.ndarray, counts: Sequence[int]) -> tuple[int, float]:
    """(distinct shards among the ids, mean distinct shards per batch)."""
    first = np.cumsum(counts) - np.asarray(counts)
    shards = np.searchsorted(first, ids, side="right") - 1
    per_batch = [len(np.unique(shards[i:i + BATCH])) for i in range(0, len(shards) - BATCH + 1, BATCH)]
    return len(np.unique(shards)), float(np.mean(per_batch))


def main() -> None:
    parser = benchlib.parser(__doc__, repeats=3, quick={"sizes": [1e6], "repeats": 1})
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7, 1e8])
    parser.add_argument("--old-max", type=float, default=1e7, help="largest size the old plan is run at")
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_plan", args)
    print(f"world {WORLD}, {WORKERS} workers per rank, batch {BATCH}, block {BLOCK}, shards of {PER_SHARD}; "
          f"rank {RANK} worker {WORKER}: plan + first batch after a resume at {FRACTION:.0%}; best of {args.repeats}")
    print(f"{'samples':>12} {'case':<8} {'plan':<4} {'best s':>9} {'first s':>9} {'peak MB':>9} {'shards/4096':>12} "
          f"{'shards/batch':>13}   old/new")
    for size in (int(s) for s in args.sizes):
        counts = [PER_SHARD] * (size // PER_SHARD)
        half = -(-size // WORLD) // 2
        for case, world, history in (("resume", WORLD, ()), ("elastic", 6, (Topology(WORLD, half),))):
            rows = {}
            for name, fn in (("old", old_first_batch), ("new", new_first_batch)):
                if name == "old" and size > args.old_max:
                    continue
                seconds, first, peak, ids = measure(lambda: fn(counts, world, history), args.repeats)
                rows[name] = (seconds, peak, ids)
                if name == "new":
                    report.add(f"{size:,} samples, {case}: new plan, peak memory", peak, "MB")
                shards, per_batch = locality(ids, counts)
                print(f"{size:>12,} {case:<8} {name:<4} {seconds:>9.3f} {first:>9.3f} {peak:>9.1f} {shards:>12} "
                      f"{per_batch:>13.1f}", end="" if name == "new" and "old" in rows else "\n")
            if "old" in rows:
                (t_old, m_old, _), (t_new, m_new, _) = rows["old"], rows["new"]
                print(f"   {t_old / t_new:,.0f}x faster, {m_old / m_new:,.0f}x less memory")
                report.add(f"{size:,} samples, {case}: new plan (vs old)", t_new, "s", baseline=t_old,
                           ratio=t_old / t_new, target="ratio = x faster")
            else:
                report.add(f"{size:,} samples, {case}: new plan", rows["new"][0], "s")
    report.finish()


if __name__ == "__main__":
    main()
