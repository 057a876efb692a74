"""Which source each position of a weighted mixture reads, and which of its samples. Pure numpy.

Why per position: a mixture of 100M positions over 20 sources must start (and resume at 99%) without
building a [100M] array of source choices in every DataLoader worker. Everything here is a function of
a position, computed for the positions a worker asks for, chunk by chunk.

The choice (`MixOrder`): the epoch's `length` positions are cut into blocks of `block` positions.
Every full block holds exactly `counts[s]` slots of source s (`block_counts`: the weights times
`block`, rounded by largest remainder, ties to the lower source index), so proportions are exact per
block, not only on average; a short last block gets its own counts the same way. Position j of block b
takes slot p = permute(j) (a keyed bijection of the block, `reader/feistel.py`, key from (seed, epoch,
b)); slot p belongs to source s with cum[s] <= p < cum[s + 1]. The draw is counted in position order:
the position is source s's draw b * counts[s] + (how many earlier positions of block b chose s). So
source s's k-th position in the epoch is exactly its k-th draw, each block costs O(block) to evaluate
(one or two blocks for a resume, a few per chunk a worker reads), nothing is counted across blocks,
and the cursor needs only the position.

The draw -> sample (`MixOrder.source_index`): draws continue across mixture epochs (mixture epoch e
starts at draw e * draws_per_epoch[s]), and draw k of source s is position k mod N_s of the source's
own epoch k // N_s order (its `EpochOrder`, under its own seed, shuffle and block). A source that runs
out within a mixture epoch starts its next epoch (a full new permutation), never repeats a sample
within one of its own epochs, and a small source is never restarted by a mixture epoch boundary.

Memory: [S] arrays per source count; temporaries ~12 x [U * block] int64/uint64 for the U blocks the
positions touch (Feistel round keys, the argsort): ~6 MB for a chunk of 8192 positions over 64 blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from robowds.reader.feistel import derive_keys, permute, schedule
from robowds.reader.plan import EpochOrder, Topology, rank_share, remaining_ranges

_MIX_SALT = 0x313D  # keeps the mixture's keys apart from the plan's under the same seed
DEFAULT_BLOCK = 1024


def normalise_weights(weights: Sequence[float]) -> np.ndarray:
    """Weights as float64 [S] summing to 1; refuses negative, non-finite or all-zero weights."""
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if not len(w) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be finite, >= 0 and not all 0, got {list(weights)}")
    return w / w.sum()


def block_counts(weights: Sequence[float], size: int) -> np.ndarray:
    """Slots per source in a block of `size` positions: floor(w * size) plus one for the sources with
    the largest remainders (ties: lower index first) until they sum to `size`. [S] int64.
    Each count is within 1 of w * size, the closest integer split there is."""
    w = normalise_weights(weights)
    quota = w * size  # [S]
    counts = np.floor(quota).astype(np.int64)
    short = int(size - counts.sum())
    if short > 0:
        order = np.lexsort((np.arange(len(w)), -(quota - counts)))  # largest remainder, then index
        counts[order[:short]] += 1
    return counts


class MixOrder:
    """One epoch's choice of (source, draw) per position, for `length` positions. [S] arrays only."""

    def __init__(self, weights: Sequence[float], length: int, seed: int, epoch: int,
                 block: int = DEFAULT_BLOCK) -> None:
        if block < 1:
            raise ValueError("block must be >= 1")
        self.length, self.block = int(length), int(block)
        self.full = self.length // self.block  # full blocks
        self.tail = self.length - self.full * self.block  # positions of the short last block
        self.counts = block_counts(weights, self.block)  # [S] per full block
        self.tail_counts = block_counts(weights, self.tail) if self.tail else np.zeros_like(self.counts)  # [S]
        self._cum = np.concatenate([[0], np.cumsum(self.counts)])  # [S+1]
        self._tail_cum = np.concatenate([[0], np.cumsum(self.tail_counts)])  # [S+1]
        self.draws_per_epoch = self.full * self.counts + self.tail_counts  # [S] draws of each source per epoch
        self._key = int(derive_keys(seed ^ _MIX_SALT, np.array([epoch], dtype=np.int64))[0])

    def __call__(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source [P] int64, draw within this epoch [P] int64) at `positions` [P] (each in [0, length)).
        Evaluates every slot of each block the positions touch ([U, block]): a chunk of a worker's
        positions touches few blocks, a resume one or two."""
        positions = np.asarray(positions, dtype=np.int64)
        source = np.empty_like(positions)
        draw = np.empty_like(positions)
        if not len(positions):
            return source, draw
        blocks = positions // self.block  # [P]
        within = positions - blocks * self.block  # [P]
        tail = blocks == self.full  # [P] in the short last block
        for mask, size, counts, cum in ((~tail, self.block, self.counts, self._cum),
                                        (tail, self.tail, self.tail_counts, self._tail_cum)):
            if not mask.any():
                continue
            touched, row = np.unique(blocks[mask], return_inverse=True)  # [U], [M]
            src, rank = self._blocks(touched, size, cum)  # [U, size], [U, size]
            s = src[row, within[mask]]  # [M]
            source[mask] = s
            draw[mask] = blocks[mask] * self.counts[s] + rank[row, within[mask]]
        return source, draw

    def _blocks(self, blocks: np.ndarray, size: int, cum: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For whole blocks [U] of `size` positions: the source of each position, and how many earlier
        positions of its block chose the same source (its draw within the block, so each source's draws
        follow position order): ([U, size], [U, size]) int64."""
        u = len(blocks)
        within = np.tile(np.arange(size, dtype=np.int64), u)  # [U * size]
        round_keys = schedule(derive_keys(self._key, blocks))[:, np.repeat(np.arange(u), size)]  # [rounds, U*size]
        slot = permute(within, size, round_keys).reshape(u, size)  # [U, size]
        src = np.searchsorted(cum, slot, side="right") - 1  # [U, size]
        order = np.argsort(src, axis=1, kind="stable")  # [U, size] positions grouped by source, in order
        ranked = np.arange(size, dtype=np.int64)[None, :] - cum[np.take_along_axis(src, order, axis=1)]
        rank = np.empty_like(src)
        np.put_along_axis(rank, order, ranked, axis=1)
        return src, rank

    def draws_before(self, position: int) -> np.ndarray:
        """How many draws of each source the positions [0, position) of this epoch made: [S] int64.
        Computed from one block (O(block)), for tools and tests; reading never needs it."""
        position = int(position)
        b = position // self.block
        counts = b * self.counts  # [S] the full blocks before
        if position > b * self.block:
            s, _ = self(np.arange(b * self.block, position, dtype=np.int64))
            counts = counts + np.bincount(s, minlength=len(self.counts))
        return counts

    def source_index(self, source: np.ndarray, draw: np.ndarray, epoch: int,
                     sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(the source's own epoch [P], position in that epoch's order [P]) of each draw: draws continue
        across mixture epochs, and a source's k-th draw overall is position k mod N of its epoch k // N."""
        sizes_arr = np.asarray(sizes, dtype=np.int64)  # [S]
        total = int(epoch) * self.draws_per_epoch[source] + draw  # [P] draws of that source before, all epochs
        n = sizes_arr[source]  # [P]
        return total // n, total % n


def epoch_until_exhausted(weights: Sequence[float], size: int, source: int, block: int = DEFAULT_BLOCK) -> int:
    """The smallest epoch length (in positions) in which `source` (with `size` samples) is drawn at
    least `size` times: an epoch that ends when that source has been read once. The full blocks come
    from the closed form; the short last block is scanned (O(block x sources)), since largest-remainder
    counts need not grow with the block size (the Alabama paradox)."""
    counts = block_counts(weights, block)  # [S]
    if counts[source] <= 0:
        raise ValueError(f"source {source} gets no slot in a block of {block}: raise its weight or the block")
    full = max(0, (int(size) - 1) // int(counts[source]))  # full blocks that leave it short (or 0)
    for tail in range(block + 1):
        if full * counts[source] + (block_counts(weights, tail)[source] if tail else 0) >= size:
            return full * block + tail
    return (full + 1) * block


@dataclass(frozen=True)
class SourcePlan:
    """What decides one source's own order: its shards' sample counts and its plan parameters."""

    counts: tuple[int, ...]  # [shards] samples per shard
    seed: int = 0
    shuffle: bool = True
    block: int = 4096


class MixPlan:
    """One rank's mixture sequence of an epoch: `length` positions, `ids(positions)` -> (source, sample
    id in that source's split). The epoch's positions are split over ranks as `RankPlan` splits a
    split's (contiguous parts, `pad`/`drop`, elastic `history` as remaining ranges). Holds [S] and [K]
    arrays and one `EpochOrder` per (source, source epoch) met (each O(its shards))."""

    def __init__(self, weights: Sequence[float], samples_per_epoch: int, sources: Sequence[SourcePlan], seed: int,
                 epoch: int, block: int = DEFAULT_BLOCK, policy: str = "pad", history: tuple[Topology, ...] = (),
                 world_size: int = 1, rank: int = 0) -> None:
        self.order = MixOrder(weights, samples_per_epoch, seed, epoch, block)
        self.sources, self.epoch = list(sources), int(epoch)
        self.sizes = [sum(s.counts) for s in self.sources]  # [S]
        self._lo, hi = remaining_ranges(int(samples_per_epoch), history, policy)  # [K], [K]
        self._before = np.cumsum(hi - self._lo) - (hi - self._lo)  # [K]
        self.remaining = int((hi - self._lo).sum())
        self.length = rank_share(self.remaining, world_size, policy)
        self._offset = rank * self.length
        self._orders: dict[tuple[int, int], EpochOrder] = {}  # (source, its epoch) -> its order

    def ids(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source [P], sample id [P]) at this rank's `positions` [P] (each in [0, length))."""
        index = self._offset + np.asarray(positions, dtype=np.int64)  # [P] into the remaining sequence
        if self.remaining:
            index %= self.remaining  # `pad`: past the end repeats the start
        k = np.searchsorted(self._before, index, side="right") - 1
        source, draw = self.order(self._lo[k] + (index - self._before[k]))  # [P], [P]
        own_epoch, own_position = self.order.source_index(source, draw, self.epoch, self.sizes)  # [P], [P]
        ids = np.empty_like(source)
        for s, e in set(zip(source.tolist(), own_epoch.tolist())):
            at = (source == s) & (own_epoch == e)
            if (s, e) not in self._orders:
                if len(self._orders) >= 4 * len(self.sources):  # bounded: a chunk meets few source epochs
                    self._orders.clear()
                spec = self.sources[s]
                self._orders[s, e] = EpochOrder(spec.counts, spec.seed, e, spec.shuffle, spec.block)
            ids[at] = self._orders[s, e](own_position[at])
        return source, ids
