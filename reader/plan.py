"""The epoch plan: which sample each rank and DataLoader worker reads, in which order. Pure numpy.

Sample ids are positions in the split's concatenated shard order (shard 0's samples, then shard 1's...).
Nothing here builds an array of the epoch's N samples: every sample id is computed from its position,
so planning, resuming and re-planning cost O(shards + topologies) memory and time, plus O(P) for the
P positions a worker actually asks for (in chunks, as it reads). For one epoch:

1. `EpochOrder`: the epoch's order as a function, position p -> sample id. Shards are permuted by
   (seed, epoch) (`rng.permutation(S)`, arrays of [S]), giving the shard-permuted sequence; then that
   sequence is cut into blocks of `block` samples and position p of block b reads the sequence at
   b * block + permute(p - b * block), a keyed bijection of the block's positions under a key derived
   from (seed, epoch, b) (`reader/feistel.py`: a Feistel network with cycle walking, as Grain's
   `index_shuffle`). A sample moves less than `block` places, so reads stay within a few shards; the
   export already shuffled windows across episodes, so this only has to decorrelate epochs.
2. Ranks: rank r takes the r-th contiguous part of the order. Every rank gets the same count: `drop`
   cuts the order to a multiple of the world size (up to world_size - 1 samples are skipped this epoch,
   a different tail each epoch); `pad` repeats the first samples of the order to fill up (each repeated
   at most once; cyclically when there are fewer samples than ranks). The policy is explicit and never
   depends on the world size.
3. Elastic resume: an earlier topology (W, c) of this epoch consumed the first c positions of each of
   its W contiguous parts. What it left is the sequence minus those W ranges, in order: so the
   sequence that remains after any history is a sorted list of position ranges of the epoch order
   (`remaining_ranges`, [K]: each topology adds at most 2W + 1 ranges), computed arithmetically, and
   the new topology splits that sequence as in 2. (Under `drop`, the tail an earlier topology would
   have skipped is still unread, so it stays in.) A padded position an earlier rank consumed is the
   sample at that position modulo the sequence's length: read, so removed too.
4. Workers: a rank's sequence from its cursor is dealt to DataLoader workers batch by batch,
   round-robin (batch j to worker j % workers), which is exactly the order in which a DataLoader
   collects batches from IterableDataset workers, so the loader's output order equals the rank's
   planned order whatever the number of workers. `worker_chunks` yields a worker's positions lazily,
   `RankPlan.ids` turns positions into sample ids.

The materialising helpers (`epoch_order`, `rank_sequence`, `split_ranks`, `worker_positions`) build
whole arrays; they exist for tests, tools and small splits, never for the reading path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from robowds.reader.feistel import derive_keys, permute, schedule

POLICIES = ("pad", "drop")
_PLAN_SALT = 0x7E5  # keeps plan streams apart from other uses of the same seed
CHUNK = 1 << 16  # positions per chunk a worker computes at a time (~0.5 MB per int64 array)


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


class EpochOrder:
    """The sample id at each position of one epoch's order: a permutation of range(N), evaluated per
    position. Holds three [S] arrays; calling it on [P] positions costs O(P log S)."""

    def __init__(self, counts: Sequence[int], seed: int, epoch: int, shuffle: bool = True, block: int = 4096) -> None:
        counts_arr = np.asarray(counts, dtype=np.int64).reshape(-1)  # [S]
        self.size = int(counts_arr.sum())
        self.shuffle, self.block = bool(shuffle), max(1, int(block))
        rng = np.random.default_rng([seed, epoch, _PLAN_SALT])
        shard_order = rng.permutation(len(counts_arr)) if shuffle else np.arange(len(counts_arr))  # [S]
        self._key = int(rng.integers(0, 2**63)) if shuffle else 0  # the block permutations' base key
        starts = np.cumsum(counts_arr) - counts_arr  # [S] first id of each shard, manifest order
        lengths = counts_arr[shard_order]  # [S] in permuted order
        self._first = np.cumsum(lengths) - lengths  # [S] first position of each permuted shard
        self._shift = starts[shard_order] - self._first  # [S] id = position + shift of its shard

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Sample ids at `positions` [P] (each in [0, N)): [P] int64."""
        positions = np.asarray(positions, dtype=np.int64)
        if not self.shuffle:
            return positions.copy()
        seq = self._unblock(positions)  # [P] positions in the shard-permuted sequence
        shard = np.searchsorted(self._first, seq, side="right") - 1  # [P] its permuted shard (empty ones skipped)
        return seq + self._shift[shard]

    def _unblock(self, positions: np.ndarray) -> np.ndarray:
        """Where each position's sample sits in the shard-permuted sequence: the block permutation."""
        if self.block <= 1 or not len(positions):
            return positions.copy()
        blocks = positions // self.block  # [P]
        within = positions - blocks * self.block  # [P]
        lo, hi = int(blocks.min()), int(blocks.max())
        if hi - lo < len(blocks):  # a chunk covers few blocks: round keys once per block, then gathered
            round_keys = schedule(derive_keys(self._key, np.arange(lo, hi + 1)))[:, blocks - lo]  # [rounds, P]
        else:
            round_keys = schedule(derive_keys(self._key, blocks))  # [rounds, P]
        last = (self.size - 1) // self.block  # the only block that may be short
        if hi < last or self.size % self.block == 0:  # every block full: one call
            return blocks * self.block + permute(within, self.block, round_keys)
        out = np.empty_like(positions)
        tail = blocks == last
        for mask, size in ((~tail, self.block), (tail, self.size - last * self.block)):
            if mask.any():
                out[mask] = blocks[mask] * self.block + permute(within[mask], size, round_keys[:, mask])
        return out


def rank_share(n: int, world_size: int, policy: str) -> int:
    """Samples per rank when `n` are split over `world_size` ranks under `policy`."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    return n // world_size if policy == "drop" else -(-n // world_size)


def _keep(lo: np.ndarray, hi: np.ndarray, keep_lo: np.ndarray, keep_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of the sequence that ranges [lo, hi) [K] form, in order, the index ranges [keep_lo, keep_hi)
    [J] (sorted, disjoint), as ranges of the underlying positions: ([K'], [K'])."""
    if not len(keep_lo):
        return keep_lo, keep_hi
    lengths = hi - lo  # [K]
    before = np.concatenate([[0], np.cumsum(lengths)])  # [K+1] sequence index of each range's start
    cuts = np.unique(np.concatenate([before, keep_lo, keep_hi]))  # [E+1] elementary boundaries
    x, y = cuts[:-1], cuts[1:]  # [E] elementary index intervals [x, y)
    j = np.searchsorted(keep_lo, x, side="right") - 1  # [E] the keep range starting at or before x
    inside = (j >= 0) & (x < keep_hi[np.maximum(j, 0)]) & (x < before[-1])
    x, y = x[inside], y[inside]
    k = np.searchsorted(before, x, side="right") - 1  # [E'] which range x falls in (y <= its end)
    new_lo = lo[k] + (x - before[k])
    new_hi = new_lo + (y - x)
    if not len(new_lo):
        return new_lo, new_hi
    joined = np.concatenate([[False], new_lo[1:] == new_hi[:-1]])  # [E'] continues the previous one
    starts = np.flatnonzero(~joined)
    ends = np.concatenate([starts[1:], [len(new_lo)]]) - 1
    return new_lo[starts], new_hi[ends]


def _unconsumed(m: int, world: int, consumed: int, policy: str) -> tuple[np.ndarray, np.ndarray]:
    """Index ranges of a sequence of `m` that `world` ranks with `consumed` positions each did not
    read, as sorted, disjoint [lo, hi) ([J], [J]). Rank r read indexes [r * share, r * share + consumed)
    of the (under `pad`, cyclically extended) sequence, where a padded index q stands for q mod m."""
    share = rank_share(m, world, policy)
    consumed = max(0, min(int(consumed), share))
    a = np.arange(world, dtype=np.int64) * share  # [W] each rank's first index
    b = a + consumed  # [W]
    if policy == "pad" and m and share * world > m:
        if m < world:  # one sample per rank, cyclically: all of them read, or none
            a, b = np.array([0], dtype=np.int64), np.array([m if consumed else 0], dtype=np.int64)
        else:  # share * world < 2m: a range reaches at most once past the end, back to the start
            a, b = np.concatenate([np.minimum(a, m), np.maximum(a, m) - m]), np.concatenate([np.minimum(b, m), np.maximum(b, m) - m])
    order = np.argsort(a, kind="stable")
    a, b = a[order], b[order]  # [J] by start; empty ones cover nothing
    reach = np.maximum.accumulate(np.maximum(b, a))  # [J] everything below is covered or before
    gap_lo = np.concatenate([[0], reach])  # [J+1] the kept gaps: before, between and after the ranges
    gap_hi = np.concatenate([a, [m]])
    kept = gap_hi > gap_lo
    return gap_lo[kept], gap_hi[kept]


def remaining_ranges(n: int, history: Sequence[Topology], policy: str) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the epoch order (of `n` samples) that no topology of `history` consumed, in order,
    as half-open ranges ([K] lo, [K] hi). Each topology splits what the ones before it left."""
    lo, hi = np.array([0], dtype=np.int64), np.array([n], dtype=np.int64)  # [K]
    for previous in history:
        m = int((hi - lo).sum())
        keep_lo, keep_hi = _unconsumed(m, previous.world_size, previous.consumed, policy)
        lo, hi = _keep(lo, hi, keep_lo, keep_hi)
    return lo, hi


class RankPlan:
    """One rank's sequence of an epoch: `length` positions, `ids(positions)` their sample ids.

    Holds the epoch order's [S] arrays and the remaining ranges [K]; nothing of size N or `length`."""

    def __init__(self, spec: PlanSpec, epoch: int, world_size: int, rank: int) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.order = EpochOrder(spec.counts, spec.seed, epoch, spec.shuffle, spec.block)
        self._lo, self._hi = remaining_ranges(self.order.size, spec.history, spec.policy)  # [K], [K]
        self._before = np.cumsum(self._hi - self._lo) - (self._hi - self._lo)  # [K] index of each range's start
        self.remaining = int((self._hi - self._lo).sum())
        self.length = rank_share(self.remaining, world_size, spec.policy)
        self._offset = rank * self.length  # this rank's first index into the remaining sequence

    def ids(self, positions: np.ndarray) -> np.ndarray:
        """Sample ids at `positions` [P] of this rank's sequence (each in [0, length)): [P] int64.
        Temporaries are ~10 x [P] uint64 (the Feistel round keys): call it on chunks (`CHUNK`)."""
        index = self._offset + np.asarray(positions, dtype=np.int64)  # [P] into the remaining sequence
        if self.remaining:
            index %= self.remaining  # `pad`: indexes past the end repeat the sequence's start
        k = np.searchsorted(self._before, index, side="right") - 1  # [P] its range
        return self.order(self._lo[k] + (index - self._before[k]))

    def worker_ids(self, length: int, start: int, batch_size: int, num_workers: int, worker: int,
                   skip: int = 0, chunk: int = CHUNK) -> Iterator[np.ndarray]:
        """Sample ids for `worker_chunks(...)`, chunk by chunk: [<= chunk] int64 each."""
        for positions in worker_chunks(length, start, batch_size, num_workers, worker, skip, chunk):
            yield self.ids(positions)


def worker_count(length: int, start: int, batch_size: int, num_workers: int, worker: int) -> int:
    """How many positions of [start, length) `worker` reads when batches are dealt round-robin."""
    rest = max(0, length - start)
    batches = -(-rest // batch_size)
    workers = max(1, num_workers)
    mine = max(0, -(-(batches - worker) // workers))  # batches worker, worker + workers, ... below `batches`
    if not mine:
        return 0
    last = worker + (mine - 1) * workers
    return (mine - 1) * batch_size + min(batch_size, rest - last * batch_size)


def worker_chunks(length: int, start: int, batch_size: int, num_workers: int, worker: int, skip: int = 0,
                  chunk: int = CHUNK) -> Iterator[np.ndarray]:
    """Positions in a rank sequence of `length` that `worker` reads from `start` on (batches dealt
    round-robin to workers), after its first `skip`, in order, at most ~`chunk` at a time: [C] int64."""
    workers = max(1, num_workers)
    per_chunk = max(1, chunk // batch_size)  # whole batches per chunk
    mine = skip // batch_size  # the worker's first batch still to read (its m-th)
    lead = skip - mine * batch_size  # positions of that batch already read
    within = np.arange(batch_size, dtype=np.int64)  # [B]
    while True:
        m = np.arange(mine, mine + per_chunk, dtype=np.int64)  # [M] this worker's batches m
        first = start + (worker + m * workers) * batch_size  # [M] their first positions
        first = first[first < length]
        if not len(first):
            return
        positions = (first[:, None] + within).ravel()  # [M * B]
        positions = positions[lead:][positions[lead:] < length]
        lead = 0
        if len(positions):
            yield positions
        mine += per_chunk


def worker_positions(length: int, start: int, batch_size: int, num_workers: int, worker: int) -> np.ndarray:
    """All of `worker_chunks` at once: [P] int64 (materialised; for tests and small sequences)."""
    parts = list(worker_chunks(length, start, batch_size, num_workers, worker))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def materialise(ids: Callable[[np.ndarray], np.ndarray], length: int, chunk: int = CHUNK) -> np.ndarray:
    """ids(positions) for all positions of [0, length), computed chunk by chunk (so the temporaries
    stay O(chunk)): [length] int64."""
    out = np.empty(length, dtype=np.int64)
    for lo in range(0, length, chunk):
        out[lo:lo + chunk] = ids(np.arange(lo, min(lo + chunk, length), dtype=np.int64))
    return out


def rank_sequence(spec: PlanSpec, epoch: int, world_size: int, rank: int) -> np.ndarray:
    """The ids rank `rank` reads this epoch, in order: [R] int64 (materialised: for tests and tools)."""
    plan = RankPlan(spec, epoch, world_size, rank)
    return materialise(plan.ids, plan.length)


def epoch_order(counts: Sequence[int], seed: int, epoch: int, shuffle: bool = True, block: int = 4096) -> np.ndarray:
    """All sample ids of the split in this epoch's order: [N] int64, a permutation of range(N)
    (materialised: for tests and tools)."""
    order = EpochOrder(counts, seed, epoch, shuffle, block)
    return materialise(order, order.size)


def split_ranks(order: np.ndarray, world_size: int, policy: str) -> np.ndarray:
    """A materialised order split into equal contiguous parts per rank: [world_size, R] int64 (the
    reference for what `RankPlan` computes per position)."""
    n = len(order)
    per_rank = rank_share(n, world_size, policy)
    if policy == "drop":
        return order[: per_rank * world_size].reshape(world_size, per_rank)
    return np.resize(order, per_rank * world_size).reshape(world_size, per_rank) if n else order.reshape(world_size, 0)


def batches_per_rank(length: int, batch_size: int, drop_last: bool = False) -> int:
    return length // batch_size if drop_last else -(-length // batch_size)
