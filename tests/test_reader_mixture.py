"""Weighted mixtures over real exports with different schemas: exact proportions per block, binomial
bounds over an epoch, determinism, exact resume at random cut points (workers 0/1/2, world 1/2),
elastic resume, a cursor under 1 KB with 50 sources, fill_missing and transforms; and the selection
math (`reader/mixing.py`) property-tested."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robowds.reader import Mixture, ShardDataset, ShardLoader
from robowds.reader.mixing import MixOrder, block_counts, epoch_until_exhausted

from exports import export_synthetic
from test_reader_resume import consume  # the resume harness's reader, unchanged: works on any cursor loader

BATCH = 4


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two exports of different stores: `a` with every stream, `b` without the IMU (another schema)."""
    root = tmp_path_factory.mktemp("mix")
    a = export_synthetic(root / "a", 4, 2, "--stride", "4", "--set", "shard.max_samples=16", "--set", "splits.val=0")
    b = export_synthetic(root / "b", 3, 5, "--stride", "4", "--set", "shard.max_samples=16", "--set", "splits.val=0",
                         "--set", "exclude=[imu]")
    return a, b


def make_mixture(paths: tuple[Path, Path], rank: int = 0, world: int = 1, **kwargs: Any) -> Mixture:
    a, b = paths
    options = {"seed": 3, "names": ["a", "b"], "fill_missing": True, **kwargs}
    return Mixture([ShardDataset(a, "train", seed=1, block=8), ShardDataset(b, "train", seed=2, block=8)],
                   [0.7, 0.3], block=16, rank=rank, world_size=world, **options)


def make_loader(paths: tuple[Path, Path], rank: int = 0, world: int = 1, workers: int = 0, batch: int = BATCH,
                **kwargs: Any) -> ShardLoader:
    return ShardLoader(make_mixture(paths, rank, world, **kwargs), batch_size=batch, num_workers=workers)


# -- the selection math ----------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=8).filter(lambda w: sum(w) > 1e-3),
       st.integers(1, 300), st.integers(1, 64), st.integers(0, 2**31), st.integers(0, 5))
def test_every_draw_once_and_exact_counts_per_block(weights: list[float], length: int, block: int, seed: int,
                                                    epoch: int) -> None:
    order = MixOrder(weights, length, seed, epoch, block)
    source, draw = order(np.arange(length))
    counts = block_counts(weights, block)
    assert counts.sum() == block and np.all(np.abs(counts - np.asarray(weights) / sum(weights) * block) < 1 + 1e-9)
    for b in range(length // block):  # exact per full block
        assert np.array_equal(np.bincount(source[b * block:(b + 1) * block], minlength=len(weights)), counts)
    for s in range(len(weights)):  # the k-th position of each source is its draw k, each draw once
        assert np.array_equal(draw[source == s], np.arange(order.draws_per_epoch[s]))
    cut = length // 2
    assert np.array_equal(order.draws_before(cut), np.bincount(source[:cut], minlength=len(weights)))
    part = np.arange(length)[::3]  # any subset of positions gives the same answer as the whole
    assert all(np.array_equal(x, y[::3]) for x, y in zip(order(part), (source, draw)))


@pytest.mark.parametrize("weights, size, counts", [
    ([0.7, 0.3], 16, [11, 5]),  # 11.2, 4.8: the larger remainder (0.8) gets the slot, not the larger weight
    ([0.7, 0.3], 5, [4, 1]),  # 3.5, 1.5: a tie goes to the lower index
    ([1, 1, 1], 16, [6, 5, 5]),  # 5.33 each: rounding alone would give 15 slots
    ([1, 1, 1], 17, [6, 6, 5]),
    ([0.5, 0.3, 0.2], 7, [4, 2, 1]),  # 3.5, 2.1, 1.4: the largest remainder is not the second-largest weight's
    ([0.6, 0.25, 0.15], 10, [6, 3, 1]),  # 6, 2.5, 1.5: whole quotas get nothing more; a tie, lower index
    ([0.1, 0.2, 0.7], 3, [0, 1, 2]),  # 0.3, 0.6, 2.1: floors 0, 0, 2, then the 0.6 remainder
])
def test_block_counts_are_largest_remainder(weights: list[float], size: int, counts: list[int]) -> None:
    """Exact per-block counts (docs/reader.md): floor(w * size), then one more slot for each of the
    largest remainders (ties: lower index). Any other split within 1 of the quotas (leftovers to the
    first or the heaviest sources, rounding then fixing up) passes the property test above; not this.
    Full blocks and the short last block of a real `MixOrder` hold exactly these counts."""
    assert block_counts(weights, size).tolist() == counts
    tail = (size + 1) // 2  # a short last block: its own counts, by the same rule
    source, _ = MixOrder(weights, 3 * size + tail, 11, 2, size)(np.arange(3 * size + tail))
    for b in range(3):
        assert np.bincount(source[b * size:(b + 1) * size], minlength=len(weights)).tolist() == counts
    assert np.bincount(source[3 * size:], minlength=len(weights)).tolist() == block_counts(weights, tail).tolist()


def test_proportions_within_binomial_bounds_and_deterministic() -> None:
    weights = [0.5, 0.3, 0.15, 0.05]
    n = 200_000
    source, _ = MixOrder(weights, n, 7, 0)(np.arange(n))
    for s, w in enumerate(weights):
        assert abs((source == s).sum() - w * n) < 4 * np.sqrt(n * w * (1 - w))
    window = source[12345:12345 + 5000]  # any window, not only the epoch: exact per block of 1024
    for s, w in enumerate(weights):
        assert abs((window == s).sum() - w * 5000) < 4 * np.sqrt(5000 * w * (1 - w))
    again, _ = MixOrder(weights, n, 7, 0)(np.arange(n))
    other, _ = MixOrder(weights, n, 8, 0)(np.arange(n))
    later, _ = MixOrder(weights, n, 7, 1)(np.arange(n))
    assert np.array_equal(source, again) and not np.array_equal(source, other) and not np.array_equal(source, later)


def test_epoch_until_exhausted() -> None:
    for weights, size, s in (([0.5, 0.3, 0.2], 1000, 2), ([1, 1], 7, 0), ([0.9, 0.1], 5000, 1)):
        length = epoch_until_exhausted(weights, size, s, block=64)
        assert MixOrder(weights, length, 0, 0, 64).draws_per_epoch[s] >= size
        assert MixOrder(weights, length - 1, 0, 0, 64).draws_per_epoch[s] < size


# -- the dataset over real exports -----------------------------------------------------------------
def test_samples_follow_each_sources_own_plan(sources: tuple[Path, Path]) -> None:
    """Draw k of a source is position k mod size of its own epoch k // size plan (so a source that
    runs out starts its next epoch); keys are prefixed; an epoch has samples_per_epoch positions."""
    mix = make_mixture(sources)
    keys = [s["__key__"] for s in mix]
    assert len(keys) == sum(mix.sizes) == mix.length_per_epoch and mix.epoch == 1
    source, draw = MixOrder(mix.weights, mix.length_per_epoch, 3, 0, 16)(np.arange(len(keys)))
    for s, (name, path, seed) in enumerate((("a", sources[0], 1), ("b", sources[1], 2))):
        own = []
        for e in range(3):
            ds = ShardDataset(path, "train", seed=seed, block=8)
            ds.set_epoch(e)
            own += [f"{name}/{x['__key__']}" for x in ds]
        assert np.array_equal(draw[source == s], np.arange((source == s).sum()))
        mine = [k for k in keys if k.startswith(f"{name}/")]  # the k-th of source s is its k-th planned
        assert mine == own[:len(mine)]
        assert len(mine) > mix.sizes[s] if s == 0 else len(mine) < mix.sizes[s]  # a wraps into its epoch 1


def test_fill_missing_and_transform(sources: tuple[Path, Path]) -> None:
    def rename(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        sample["state"] = sample.pop("joints")
        sample["state_mask"] = sample.pop("joints_mask")
        sample["noise"] = rng.normal(size=2).astype(np.float32)
        return sample

    mix = make_mixture(sources, transforms={"a": rename, "b": rename})
    samples = list(mix)
    schema_a = mix.datasets[0].manifest["schema"]
    for s in samples:
        assert s["__source__"] == s["__key__"].split("/")[0]
        assert "joints" not in s and s["state"].shape == tuple(schema_a["joints"]["shape"])
        assert s["imu"].shape == tuple(schema_a["imu"]["shape"]) and s["imu"].dtype == np.float32
        assert s["imu_mask"].shape == (schema_a["imu"]["shape"][0],) and s["imu_mask"].dtype == bool
        if s["__source__"] == "b":  # filled: zeros, all masked
            assert not s["imu"].any() and not s["imu_mask"].any()
    assert any(s["__source__"] == "a" and s["imu_mask"].any() for s in samples)
    again = make_mixture(sources, transforms={"a": rename, "b": rename})
    assert all(np.array_equal(x["noise"], y["noise"]) for x, y in zip(samples, again))
    with pytest.raises(KeyError):  # without fill_missing the batch fields differ per source
        [s["imu"] for s in make_mixture(sources, fill_missing=False)]
    assert mix.stats("b")["joints"]["count"] > 0 and "imu" not in mix.stats("b") and "imu" in mix.stats("a")
    a, b = sources  # a source read with fields= gets the other fields filled (not images: no declared shape)
    narrow = Mixture([ShardDataset(a, "train", seed=1, fields=["joints"]), ShardDataset(b, "train", seed=2, exclude=["overview"])],
                     [0.5, 0.5], names=["a", "b"], fill_missing=True, rank=0, world_size=1)
    got = list(narrow)
    assert {frozenset(x) for x in got} == {frozenset(got[0])} and "actions" in got[0]
    assert all(not x["actions_mask"].any() for x in got if x["__source__"] == "a")


def test_loader_order_is_the_plan_for_any_worker_count(sources: tuple[Path, Path]) -> None:
    reference = consume(make_loader(sources), epochs=1)
    plan = [s["__key__"] for s in make_mixture(sources)]
    assert [k for _, k, _ in reference] == plan
    for workers in (1, 2):
        assert consume(make_loader(sources, workers=workers), epochs=1) == reference


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_resume_at_random_cut_points(sources: tuple[Path, Path], world: int, workers: int) -> None:
    rng = random.Random(world * 10 + workers)
    for rank in range(world):
        reference = consume(make_loader(sources, rank, world, 0))  # the plan, read without workers
        total = -(-len(reference) // BATCH)
        for cut in sorted({1, rng.randrange(2, total)}):
            first = make_loader(sources, rank, world, workers)
            head = consume(first, batches=cut)
            state = json.loads(json.dumps(first.state_dict()))
            second = make_loader(sources, rank, world, workers)
            second.load_state_dict(state)
            assert head + consume(second) == reference, f"rank {rank}/{world} workers {workers} cut {cut}"


@pytest.mark.parametrize("policy", ["pad", "drop"])
def test_elastic_world_2_to_1_delivers_the_rest_exactly_once(sources: tuple[Path, Path], policy: str) -> None:
    everything = [k for _, k, _ in consume(make_loader(sources, policy="drop"), epochs=1)]
    for cut in (1, 3):
        keys, states = [], []
        for rank in range(2):
            loader = make_loader(sources, rank, 2, 1, policy=policy)
            keys += [k for _, k, _ in consume(loader, batches=cut, epochs=1)]
            states.append(loader.state_dict())
        assert states[0] == states[1]
        resumed = make_loader(sources, 0, 1, 2, policy=policy)
        resumed.load_state_dict(states[0])
        keys += [k for _, k, _ in consume(resumed, epochs=1)]
        # positions, not keys, are delivered once: a source drawn beyond its size repeats keys by design
        got, want = Counter(keys), Counter(everything)
        if policy == "drop":  # at most world - 1 positions skipped
            assert not got - want and sum((want - got).values()) < 2, f"cut {cut}"
        else:  # pad: at most world - 1 repeated
            assert not want - got and sum((got - want).values()) < 2, f"cut {cut}"


def test_batch_size_change_on_resume(sources: tuple[Path, Path]) -> None:
    reference = [k for _, k, _ in consume(make_loader(sources), epochs=1)]
    first = make_loader(sources, batch=4, workers=2)
    head = [k for _, k, _ in consume(first, batches=5, epochs=1)]
    second = make_loader(sources, batch=3, workers=1)
    second.load_state_dict(first.state_dict())
    assert head + [k for _, k, _ in consume(second, epochs=1)] == reference


def test_cursor_under_1kb_with_50_sources_and_checked(sources: tuple[Path, Path]) -> None:
    a, b = sources
    datasets = [ShardDataset(a if i % 2 else b, "train", seed=i, block=8) for i in range(50)]
    names = [f"dataset-number-{i:03d}" for i in range(50)]
    mix = Mixture(datasets, [1 + i % 7 for i in range(50)], seed=1, names=names, fill_missing=True, rank=0, world_size=1)
    loader = ShardLoader(mix, batch_size=8)
    head = [k for _, k, _ in consume(loader, batches=3, epochs=1)]
    state = loader.state_dict()
    assert len(json.dumps(state)) < 1024 and len(head) == 24
    assert len({k.split("/")[0] for k in head}) > 5
    other = Mixture(datasets, [1] * 50, seed=1, names=names, fill_missing=True, rank=0, world_size=1)
    with pytest.raises(ValueError, match="config"):
        other.load_cursor(state)


def test_stateful_dataloader_resume(sources: tuple[Path, Path]) -> None:
    """torchdata's StatefulDataLoader with 2 workers: each worker's state resumes its share exactly;
    a state from another batch size is refused."""
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    from robowds.reader import collate

    def loader(batch: int = BATCH) -> Any:
        mix = make_mixture(sources).set_batching(batch, collate_fn=collate)
        return sdl.StatefulDataLoader(mix, batch_size=None, num_workers=2, snapshot_every_n_steps=1)

    reference = [k for b in loader() for k in b["__key__"]]
    first = loader()
    it = iter(first)
    head = [k for _ in range(5) for k in next(it)["__key__"]]
    state = json.loads(json.dumps(first.state_dict()))
    second = loader()
    second.load_state_dict(state)
    assert head + [k for b in second for k in b["__key__"]] == reference
    other = loader(3)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="saved with batch_size=4"):
        next(iter(other))
    done = loader()  # exactly len() batches, the iterator not exhausted (as Lightning takes them)
    taken = iter(done)
    for _ in range(len(done)):
        next(taken)
    after = loader()
    after.load_state_dict(done.state_dict())
    with pytest.raises(ValueError, match="saved after the last batch of epoch 0"):
        next(iter(after))
