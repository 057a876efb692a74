"""Planner properties (hypothesis): a permutation per epoch, bounded displacement, exact balance,
exactly-once under elastic re-plans, worker dealing; and shuffle quality on a real export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from robowds.reader.plan import PlanSpec, Topology, epoch_order, rank_sequence, split_ranks, worker_positions

counts_st = st.lists(st.integers(0, 60), min_size=1, max_size=12)


@given(counts_st, st.integers(0, 2**32 - 1), st.integers(0, 5), st.integers(1, 50))
@settings(max_examples=150, deadline=None)
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
    """Size check only (tests are not timed): 4-6 s here for 10M samples: docs/benchmarks.md, printed by scripts/bench_read.py."""
    counts = tuple([10_000] * 1000)
    seq = rank_sequence(PlanSpec(counts, 0, True, 4096, "pad"), 3, 8, 5)
    assert len(seq) == 1_250_000 and len(np.unique(seq)) == 1_250_000


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
