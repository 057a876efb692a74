"""The epoch plan: which sample each rank and DataLoader worker reads, in which order. Pure numpy.

Sample ids are positions in the split's concatenated shard order (shard 0's samples, then shard 1's...).
For one epoch:

1. `epoch_order`: shards permuted by (seed, epoch); then a bounded sample-level shuffle: the sequence
   is cut into blocks of `block` samples and each block is permuted (a sample moves at most `block - 1`
   places, so reads stay within a few shards). The export already shuffled windows across episodes,
   so this only has to decorrelate epochs.
2. `split_ranks`: rank r takes the r-th contiguous part of the order. Every rank gets the same count:
   `drop` cuts the order to a multiple of the world size (up to world_size - 1 samples are skipped
   this epoch, a different tail each epoch); `pad` repeats the first samples of the order to fill
   up (each repeated at most once). The policy is explicit and never depends on the world size.
3. Elastic resume: `remaining_order` removes what an earlier topology already consumed (the first
   `consumed` samples of each of its ranks) and keeps the rest in order; the new topology splits that.
4. `worker_positions`: a rank's sequence from its cursor is dealt to DataLoader workers batch by batch,
   round-robin (batch j to worker j % workers), which is exactly the order in which a DataLoader
   collects batches from IterableDataset workers, so the loader's output order equals the rank's
   planned order whatever the number of workers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

POLICIES = ("pad", "drop")
_PLAN_SALT = 0x7E5  # keeps plan streams apart from other uses of the same seed


@dataclass(frozen=True)
class Topology:
    """An earlier (world size, samples consumed per rank) of the current epoch, for elastic resume."""

    world_size: int
    consumed: int


@dataclass(frozen=True)
class PlanSpec:
    counts: tuple[int, ...]  # samples per shard, in manifest order
    seed: int = 0
    shuffle: bool = True
    block: int = 4096
    policy: str = "pad"
    history: tuple[Topology, ...] = field(default=())


def epoch_order(counts: Sequence[int], seed: int, epoch: int, shuffle: bool = True, block: int = 4096) -> np.ndarray:
    """All sample ids of the split in this epoch's order: [N] int64, a permutation of range(N)."""
    counts_arr = np.asarray(counts, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts_arr)[:-1]]).astype(np.int64)
    if not shuffle:
        return np.arange(int(counts_arr.sum()), dtype=np.int64)
    rng = np.random.default_rng([seed, epoch, _PLAN_SALT])
    shard_order = rng.permutation(len(counts_arr))
    lengths = counts_arr[shard_order]  # [S]
    ids = np.repeat(starts[shard_order] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    ids += np.arange(int(lengths.sum()), dtype=np.int64)  # [N]: shard-permuted, in-shard order
    if block > 1 and len(ids):
        keys = rng.random(len(ids))  # [N]; sorting random keys within each block permutes it uniformly
        blocks = np.arange(len(ids)) // block
        ids = ids[np.lexsort((keys, blocks))]
    return ids


def split_ranks(order: np.ndarray, world_size: int, policy: str) -> np.ndarray:
    """The order split into equal contiguous parts per rank: [world_size, R] int64."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    n = len(order)
    if policy == "drop":
        per_rank = n // world_size
        return order[: per_rank * world_size].reshape(world_size, per_rank)
    per_rank = -(-n // world_size)
    filled = np.concatenate([order, order[: per_rank * world_size - n]]) if n else order
    if len(filled) < per_rank * world_size:  # fewer samples than ranks: repeat cyclically
        filled = np.resize(order, per_rank * world_size)
    return filled.reshape(world_size, per_rank)


def remaining_order(order: np.ndarray, previous: Topology, policy: str) -> np.ndarray:
    """Samples of `order` that the earlier topology had not consumed, in order, each once. (Under
    `drop`, the tail that topology would have skipped is still unread, so it stays in.)"""
    ranks = split_ranks(order, previous.world_size, policy)
    consumed = ranks[:, : previous.consumed].ravel()
    return order[~np.isin(order, consumed)]


def rank_sequence(spec: PlanSpec, epoch: int, world_size: int, rank: int) -> np.ndarray:
    """The ids rank `rank` reads this epoch, in order: [R] int64 (after replaying elastic history)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    order = epoch_order(spec.counts, spec.seed, epoch, spec.shuffle, spec.block)
    for previous in spec.history:
        order = remaining_order(order, previous, spec.policy)
    return split_ranks(order, world_size, spec.policy)[rank]


def worker_positions(length: int, start: int, batch_size: int, num_workers: int, worker: int) -> np.ndarray:
    """Positions in a rank sequence of `length` that `worker` reads from `start` on: batches dealt
    round-robin to workers. [P] int64."""
    positions = np.arange(start, length, dtype=np.int64)
    batch_index = (positions - start) // batch_size
    return positions[batch_index % max(1, num_workers) == worker]


def batches_per_rank(length: int, batch_size: int, drop_last: bool = False) -> int:
    return length // batch_size if drop_last else -(-length // batch_size)
