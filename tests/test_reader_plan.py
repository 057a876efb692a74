"""Planner properties (hypothesis): a permutation per epoch, bounded displacement, exact balance,
exactly-once under elastic re-plans, worker dealing, equality with the materialised reference the
plan replaced; the keyed Feistel permutation; memory at 100M samples; and shuffle quality on a real
export."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from robowds.reader.feistel import derive_keys, permute, schedule
from robowds.reader.plan import (PlanSpec, RankPlan, Topology, epoch_order, rank_sequence, split_ranks, worker_chunks,
                                 worker_count, worker_positions)

counts_st = st.lists(st.integers(0, 60), min_size=1, max_size=12)


@given(counts_st, st.integers(0, 2**32 - 1), st.integers(0, 5), st.integers(1, 50))
@settings(max_examples=60, deadline=None)
def test_epoch_order_is_a_permutation_with_shard_blocks(counts: list[int], seed: int, epoch: int, block: int) -> None:
    order = epoch_order(counts, seed, epoch, True, block)
    assert sorted(order.tolist()) == list(range(sum(counts)))
    np.testing.assert_array_equal(order, epoch_order(counts, seed, epoch, True, block))  # pure
    # each block of `block` positions holds exactly the ids of that block of the shard-permuted sequence
    unshuffled = epoch_order(counts, seed, epoch, True, 1)
    for lo in range(0, len(order), block):
        assert sorted(order[lo:lo + block]) == sorted(unshuffled[lo:lo + block])


def test_epochs_and_seeds_differ() -> None:
    counts = [100] * 10
    a, b, c = epoch_order(counts, 0, 0), epoch_order(counts, 0, 1), epoch_order(counts, 1, 0)
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    np.testing.assert_array_equal(epoch_order(counts, 0, 0, shuffle=False), np.arange(1000))


@given(counts_st, st.integers(1, 7), st.sampled_from(["pad", "drop"]), st.integers(0, 9))
@settings(max_examples=200, deadline=None)
def test_balance_and_coverage(counts: list[int], world: int, policy: str, seed: int) -> None:
    n = sum(counts)
    spec = PlanSpec(tuple(counts), seed, True, 8, policy)
    seqs = [rank_sequence(spec, 0, world, r) for r in range(world)]
    assert len({len(s) for s in seqs}) == 1  # every rank the same count
    flat = np.concatenate(seqs)
    if policy == "drop":
        assert len(flat) == n // world * world and len(set(flat.tolist())) == len(flat)
    else:
        assert len(flat) == (-(-n // world) * world if n else 0) and set(flat.tolist()) == set(range(n))
        if n >= world:
            values, repeats = np.unique(flat, return_counts=True)
            assert repeats.max(initial=1) <= 2 and (repeats == 2).sum() == len(flat) - n


@given(counts_st, st.integers(1, 5), st.integers(1, 5), st.integers(0, 30), st.integers(1, 5), st.integers(0, 30),
       st.integers(1, 5), st.integers(0, 9))
@settings(max_examples=200, deadline=None)
def test_elastic_replans_are_exactly_once(counts: list[int], w1: int, w2: int, c1: int, w3: int, c2: int,
                                          w_final: int, seed: int) -> None:
    """Consume under w1 (c1 per rank), then w2 (c2 per rank), then finish under w3: with `drop`, nothing
    twice and fewer than w3 samples never read; the consumed prefixes are exactly what was read."""
    base = PlanSpec(tuple(counts), seed, True, 8, "drop")
    seen: list[int] = []
    history: tuple[Topology, ...] = ()
    for world, consumed in ((w1, c1), (w2, c2)):
        spec = PlanSpec(base.counts, seed, True, 8, "drop", history)
        seqs = [rank_sequence(spec, 0, world, r) for r in range(world)]
        consumed = min(consumed, len(seqs[0]))
        seen += [int(i) for s in seqs for i in s[:consumed]]
        history += (Topology(world, consumed),)
    spec = PlanSpec(base.counts, seed, True, 8, "drop", history)
    seen += [int(i) for r in range(w3) for i in rank_sequence(spec, 0, w3, r)]
    assert len(seen) == len(set(seen))
    # earlier topologies leave their `drop` tail in the remaining order, so only the final split skips
    # anything: fewer than w3 samples (an off-by-one in `remaining_order` loses up to w1 + w2 more)
    assert sum(counts) - len(seen) < w3


@given(st.integers(0, 200), st.integers(0, 50), st.integers(1, 9), st.integers(1, 4))
@settings(max_examples=200, deadline=None)
def test_worker_dealing_partitions_the_rest(length: int, start: int, batch: int, workers: int) -> None:
    start = min(start, length)
    parts = [worker_positions(length, start, batch, workers, w) for w in range(workers)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(start, length))
    # round-robin collection of batches (what the DataLoader does) gives back the plan order
    queues = [[p[i:i + batch].tolist() for i in range(0, len(p), batch)] for p in parts]
    merged: list[int] = []
    for j in range(max((len(q) for q in queues), default=0)):
        for q in queues:
            if j < len(q):
                merged += q[j]
    assert merged == list(range(start, length))


def test_plan_of_10m_samples() -> None:
    """Size check only (tests are not timed): one rank's whole sequence of a 10M-sample epoch."""
    counts = tuple([10_000] * 1000)
    seq = rank_sequence(PlanSpec(counts, 0, True, 4096, "pad"), 3, 8, 5)
    assert len(seq) == 1_250_000 and len(np.unique(seq)) == 1_250_000


def test_plan_of_100m_samples_stays_small() -> None:
    """100k shards x 1000 samples, world 8, 8 workers: planning, an elastic re-plan and the first
    batch after a resume at 99% allocate O(shards + chunk), never O(samples) (800 MB for one [N]
    int64 array). Memory only: scripts/bench_plan.py times it (docs/benchmarks.md)."""
    counts = tuple([1000] * 100_000)
    tracemalloc.start()
    try:
        plan = RankPlan(PlanSpec(counts, 0, True, 4096, "pad", (Topology(8, 6_000_000),)), 2, 6, 5)
        first = next(plan.worker_ids(plan.length, int(plan.length * 0.99), 32, 8, 7))[:32]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan.length == -(-(100_000_000 - 8 * 6_000_000) // 6)
    assert len(first) == 32 and len(set(first.tolist())) == 32
    assert peak < 50e6, f"{peak / 1e6:.1f} MB"


def test_split_ranks_pads_with_the_first_samples() -> None:
    order = np.array([5, 3, 1, 4, 2])
    np.testing.assert_array_equal(split_ranks(order, 2, "pad"), [[5, 3, 1], [4, 2, 5]])
    np.testing.assert_array_equal(split_ranks(order, 2, "drop"), [[5, 3], [1, 4]])


def test_shuffle_quality_same_episode_pairs(tmp_path: Path) -> None:
    """In a batch of 32 from a 20-episode store, the fraction of same-episode pairs stays near i.i.d."""
    from robowds.reader import ShardDataset, ShardLoader

    from exports import export_synthetic

    out = export_synthetic(tmp_path, 20, 4, "--set", "shard.max_samples=64")
    loader = ShardLoader(ShardDataset(out, "train", seed=3, block=256), batch_size=32)
    episodes = [[m["episode_id"] for m in batch["meta"]] for batch in loader]
    manifest = json.loads((out / "manifest.json").read_text())
    sizes = np.unique([e for batch in episodes for e in batch], return_counts=True)[1]
    p = sizes / sizes.sum()
    iid = float((p ** 2).sum())  # chance that two random samples share an episode
    same = [np.mean([a == b for i, a in enumerate(batch) for b in batch[i + 1:]]) for batch in episodes if len(batch) > 1]
    assert manifest["splits"]["train"]["samples"] == sum(sizes)
    assert abs(float(np.mean(same)) - iid) < 0.5 * iid, (np.mean(same), iid)


# --- the plan against the materialised reference it replaced (the set-based elastic re-plan) ---

def reference_remaining(order: np.ndarray, previous: Topology, policy: str) -> np.ndarray:
    """The previous implementation: the ids an earlier topology read, removed from the order by value."""
    ranks = split_ranks(order, previous.world_size, policy)
    consumed = ranks[:, : previous.consumed].ravel()
    return order[~np.isin(order, consumed)]


history_st = st.lists(st.tuples(st.integers(1, 9), st.integers(0, 40)), max_size=3)


@given(counts_st, st.integers(0, 2**32 - 1), st.integers(0, 3), st.integers(1, 40), st.sampled_from(["pad", "drop"]),
       history_st, st.integers(1, 9))
@settings(max_examples=150, deadline=None)
def test_rank_sequences_equal_the_materialised_reference(counts: list[int], seed: int, epoch: int, block: int,
                                                         policy: str, history: list[tuple[int, int]],
                                                         world: int) -> None:
    """Per-position ids = the old algorithm applied to the same epoch order: history removed by value,
    then split into contiguous equal parts. So every guarantee the old plan had holds: a permutation,
    equal counts, pad/drop, elastic exactly-once (the consumed positions are computed as ranges)."""
    topologies = tuple(Topology(w, c) for w, c in history)
    order = epoch_order(counts, seed, epoch, True, block)
    assert sorted(order.tolist()) == list(range(sum(counts)))
    remaining = order
    for previous in topologies:
        remaining = reference_remaining(remaining, previous, policy)
    expected = split_ranks(remaining, world, policy)
    spec = PlanSpec(tuple(counts), seed, True, block, policy, topologies)
    for rank in range(world):
        assert rank_sequence(spec, epoch, world, rank).tolist() == expected[rank].tolist()


@given(counts_st, st.integers(0, 2**32 - 1), st.sampled_from(["pad", "drop"]), history_st, st.integers(1, 9),
       st.data())
@settings(max_examples=200, deadline=None)
def test_elastic_resume_delivers_every_sample_once(counts: list[int], seed: int, policy: str,
                                                   history: list[tuple[int, int]], world: int, data: st.DataObject) -> None:
    """Ranks read their heads under each topology of a random history, then the last topology reads
    to the end: no sample twice beyond `pad`'s repeats, none lost beyond `drop`'s tail, ranks disjoint."""
    n = sum(counts)
    read: list[int] = []
    topologies: tuple[Topology, ...] = ()
    for w, c in [*history, (world, None)]:
        spec = PlanSpec(tuple(counts), seed, True, 8, policy, topologies)
        seqs = [rank_sequence(spec, 0, w, r) for r in range(w)]
        assert len({len(s) for s in seqs}) == 1  # every rank the same count
        remaining = n - len(set(read))
        assert len(seqs[0]) == (remaining // w if policy == "drop" else -(-remaining // w))
        taken = len(seqs[0]) if c is None else min(c, len(seqs[0]))
        heads = [s[:taken].tolist() for s in seqs]
        if policy == "drop" or remaining >= w * len(seqs[0]):  # no padding: ranks are disjoint
            flat = [i for h in heads for i in h]
            assert len(flat) == len(set(flat))
        assert not set(i for h in heads for i in h) - set(range(n))
        assert not set(i for h in heads for i in h) & set(read)  # nothing an earlier topology read
        read += [i for h in heads for i in h if i not in read]
        topologies += ((Topology(w, taken),) if c is not None else ())
    if policy == "pad":
        assert sorted(set(read)) == list(range(n))  # everything read, each new sample once
    else:
        assert len(read) == len(set(read)) and n - len(read) < world  # only the final split drops (< world)


@given(st.integers(0, 300), st.integers(0, 60), st.integers(1, 9), st.integers(1, 4), st.integers(0, 80),
       st.integers(1, 50))
@settings(max_examples=300, deadline=None)
def test_worker_chunks_resume_anywhere(length: int, start: int, batch: int, workers: int, skip: int, chunk: int) -> None:
    """Chunks after `skip` positions are the rest of the materialised share; `worker_count` its size."""
    start = min(start, length)
    for worker in range(workers):
        share = worker_positions(length, start, batch, workers, worker)
        assert worker_count(length, start, batch, workers, worker) == len(share)
        got = list(worker_chunks(length, start, batch, workers, worker, min(skip, len(share)), chunk))
        assert all(len(c) for c in got)
        flat = np.concatenate(got) if got else np.zeros(0, np.int64)
        assert flat.tolist() == share[min(skip, len(share)):].tolist()


# --- the keyed permutation ---

@given(st.integers(1, 5000), st.integers(0, 2**63 - 1), st.integers(0, 2**40))
@settings(max_examples=100, deadline=None)
def test_feistel_is_a_permutation_for_any_size(size: int, base: int, label: int) -> None:
    keys = schedule(derive_keys(base, np.full(size, label)))  # [rounds, size]
    out = permute(np.arange(size), size, keys)
    assert out.dtype == np.int64 and sorted(out.tolist()) == list(range(size))


def test_feistel_positions_are_uniform_and_keys_matter() -> None:
    """Over 20k keys, where index j lands is uniform (chi-square over the 100 x 100 table of j -> pi(j),
    z-score of the statistic < 4; a uniform shuffle gives |z| ~ 1), and no two keys out of 200 give
    the same permutation of 100 (a uniform shuffle: 100! possibilities)."""
    size, trials = 100, 20_000
    index = np.tile(np.arange(size), trials)  # [T * size]
    out = permute(index, size, schedule(derive_keys(9, np.repeat(np.arange(trials), size)))).reshape(trials, size)
    table = np.stack([np.bincount(out[:, j], minlength=size) for j in range(size)])  # [size, size]
    expected = trials / size
    chi2 = float(((table - expected) ** 2 / expected).sum())
    dof = (size - 1) ** 2
    assert abs(chi2 - dof) / np.sqrt(2 * dof) < 4, chi2
    assert len({tuple(row) for row in out[:200].tolist()}) == 200


def test_cursor_of_the_materialising_plan(tmp_path: Path) -> None:
    """A version 1 cursor (the plan before this one, another shuffled order) loads at an epoch start
    or unshuffled, where both orders agree; saved mid-epoch with shuffling it is refused, saying why."""
    import pytest

    from robowds.reader import ShardDataset

    from exports import export_synthetic

    out = export_synthetic(tmp_path, 3, 1)
    ds = ShardDataset(out, "train", seed=2)
    state = {**ds.cursor(), "version": 1, "epoch": 3}
    ds.load_cursor(state)
    assert (ds.epoch, ds.start) == (3, 0)
    unshuffled = ShardDataset(out, "train", shuffle=False)
    unshuffled.load_cursor({**unshuffled.cursor(), "version": 1, "consumed": 5})
    assert unshuffled.start == 5
    with pytest.raises(ValueError, match=r"^this cursor \(version 1\) was saved in the middle of epoch 3 .* "
                                         r"set_epoch\(4\)$"):
        ds.load_cursor({**state, "consumed": 5})
    with pytest.raises(ValueError, match="cursor version 7 is not 2"):
        ds.load_cursor({**state, "version": 7})
