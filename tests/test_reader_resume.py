"""The reusable resume harness: for many cut points, the resumed continuation equals the uninterrupted
run sample by sample (keys and tensor bytes), across epochs, worker counts, world sizes (simulated
ranks with explicit rank/world_size) and elastic changes of both."""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

from robowds.reader import ShardDataset, ShardLoader

from exports import export_synthetic

BATCH = 8
Record = tuple[int, str, str]  # (epoch, key, sha256 of the sample's tensors)


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_synthetic(tmp_path_factory.mktemp("reader"), 6, 2, "--stride", "2",
                            "--set", "shard.max_samples=40", "--set", "splits.val=0.34")


def digest_rows(batch: dict[str, Any]) -> list[str]:
    """Per sample: sha256 over every tensor field's bytes (sorted by name)."""
    names = sorted(k for k, v in batch.items() if isinstance(v, torch.Tensor))
    return [hashlib.sha256(b"".join(batch[n][i].numpy().tobytes() for n in names)).hexdigest()
            for i in range(len(batch["__key__"]))]


def make_loader(out: Path, rank: int = 0, world: int = 1, workers: int = 0, policy: str = "pad",
                **kwargs: Any) -> ShardLoader:
    ds = ShardDataset(out, "train", seed=7, block=16, policy=policy, rank=rank, world_size=world, **kwargs)
    return ShardLoader(ds, batch_size=BATCH, num_workers=workers)


def consume(loader: ShardLoader, batches: int | None = None, epochs: int = 2,
            after: Callable[[int], None] | None = None) -> list[Record]:
    """Batches from the loader across epoch boundaries, until `batches` (None: the end of `epochs`)."""
    records: list[Record] = []
    count = 0
    while loader.dataset.epoch < epochs:
        epoch = loader.dataset.epoch
        for batch in loader:
            records += [(epoch, k, d) for k, d in zip(batch["__key__"], digest_rows(batch))]
            count += 1
            if batches is not None and count >= batches:
                return records
    return records


def test_plan_order_is_the_loader_order_for_any_worker_count(dataset_dir: Path) -> None:
    reference = consume(make_loader(dataset_dir), epochs=1)
    for workers in (1, 2, 3):
        assert consume(make_loader(dataset_dir, workers=workers), epochs=1) == reference
    ds = ShardDataset(dataset_dir, "train", seed=7, block=16)
    keys = [s["__key__"] for s in ds]
    assert [k for _, k, _ in reference] == keys  # unbatched iteration: same order


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_resume_at_random_cut_points(dataset_dir: Path, world: int, workers: int) -> None:
    rng = random.Random(world * 10 + workers)
    for rank in range(world):
        reference = consume(make_loader(dataset_dir, rank, world, workers))
        total_batches = -(-len(reference) // BATCH)
        # the plan's positions do not depend on workers: random cuts are many without workers (cheap),
        # one with them (each cut starts two loaders' worker processes)
        cuts = sorted({1, total_batches // 2, total_batches - 1,
                       *rng.sample(range(1, total_batches), 3 if workers == 0 else 1)})
        for cut in cuts:
            first = make_loader(dataset_dir, rank, world, workers)
            head = consume(first, batches=cut)
            state = json.loads(json.dumps(first.state_dict()))  # a checkpoint goes through JSON
            assert len(json.dumps(state)) < 1024
            second = make_loader(dataset_dir, rank, world, workers)
            second.load_state_dict(state)
            tail = consume(second)
            assert head + tail == reference, f"rank {rank}/{world}, workers {workers}, cut after batch {cut}"


def test_epoch_boundary_and_epochs_differ(dataset_dir: Path) -> None:
    loader = make_loader(dataset_dir)
    records = consume(loader)
    per_epoch = [[k for e, k, _ in records if e == epoch] for epoch in (0, 1)]
    assert sorted(per_epoch[0]) == sorted(per_epoch[1]) and per_epoch[0] != per_epoch[1]
    state = loader.state_dict()
    assert (state["epoch"], state["consumed"]) == (2, 0)  # a cut exactly at the boundary
    again = consume(make_loader(dataset_dir), epochs=2)
    assert again == records  # same seed, same order


def elastic_epoch(out: Path, old: tuple[int, int], new: tuple[int, int], cut: int, policy: str) -> list[str]:
    """Keys read in epoch 0 when `old` = (world, workers) stops after `cut` batches per rank and `new`
    resumes with the cursor of rank 0 (all ranks consume in lockstep)."""
    keys: list[str] = []
    states = []
    for rank in range(old[0]):
        loader = make_loader(out, rank, old[0], old[1], policy)
        keys += [k for _, k, _ in consume(loader, batches=cut, epochs=1)]
        states.append(loader.state_dict())
    assert all(s == states[0] for s in states)
    for rank in range(new[0]):
        loader = make_loader(out, rank, new[0], new[1], policy)
        loader.load_state_dict(states[0])
        keys += [k for _, k, _ in consume(loader, epochs=1)]
    return keys


@pytest.mark.parametrize("old, new", [((1, 0), (2, 0)), ((2, 1), (1, 2)), ((1, 2), (1, 3)), ((1, 3), (1, 0)),
                                      ((2, 2), (3, 1))])
def test_elastic_resume_delivers_the_rest_exactly_once(dataset_dir: Path, old: tuple[int, int],
                                                       new: tuple[int, int]) -> None:
    manifest = json.loads((dataset_dir / "manifest.json").read_text())
    n = manifest["splits"]["train"]["samples"]
    everything = [k for _, k, _ in consume(make_loader(dataset_dir, policy="drop"), epochs=1)]
    assert len(everything) == n
    for cut in (1, 3):
        keys = elastic_epoch(dataset_dir, old, new, cut, "drop")
        assert len(keys) == len(set(keys)), f"{old}->{new} cut {cut}: a sample was delivered twice"
        missing = set(everything) - set(keys)
        assert len(missing) < new[0], f"{old}->{new}: {len(missing)} samples lost (drop allows < world size)"


def test_later_epochs_follow_the_new_topology(dataset_dir: Path) -> None:
    first = make_loader(dataset_dir, 0, 1, 0)
    consume(first, batches=2, epochs=1)
    state = first.state_dict()
    resumed = [make_loader(dataset_dir, r, 2, 0) for r in range(2)]
    for loader in resumed:
        loader.load_state_dict(state)
        consume(loader, epochs=1)
    fresh = [make_loader(dataset_dir, r, 2, 0) for r in range(2)]
    for loader in fresh:
        loader.set_epoch(1)
    for a, b in zip(resumed, fresh):
        assert consume(a, epochs=2) == consume(b, epochs=2)


def test_stateful_dataloader_resume(dataset_dir: Path) -> None:
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    from robowds.reader.collation import collate

    def run(state: dict | None, stop: int | None) -> tuple[list[str], dict]:
        ds = ShardDataset(dataset_dir, "train", seed=7, block=16).set_batching(BATCH)
        loader = sdl.StatefulDataLoader(ds, batch_size=BATCH, num_workers=2, collate_fn=collate,
                                        snapshot_every_n_steps=1)
        if state is not None:
            loader.load_state_dict(state)
        keys = []
        for i, batch in enumerate(loader):
            keys += batch["__key__"]
            if stop is not None and i + 1 == stop:
                return keys, loader.state_dict()
        return keys, loader.state_dict()

    reference, _ = run(None, None)
    head, state = run(None, 5)
    tail, _ = run(json.loads(json.dumps(state)), None)
    assert head + tail == reference


def test_transform_gets_a_deterministic_rng(dataset_dir: Path) -> None:
    def jitter(sample: dict, rng: np.random.Generator) -> dict:
        sample["joints"] = sample["joints"] + rng.normal(size=sample["joints"].shape).astype(np.float32)
        return sample

    reference = consume(make_loader(dataset_dir, workers=2, transform=jitter), epochs=1)
    first = make_loader(dataset_dir, workers=2, transform=jitter)
    head = consume(first, batches=3, epochs=1)
    second = make_loader(dataset_dir, workers=1, transform=jitter)
    second.load_state_dict(first.state_dict())
    assert head + consume(second, epochs=1) == reference


def test_plain_dataset_moves_to_the_next_epoch_after_a_full_pass(dataset_dir: Path) -> None:
    """Iterated in this process, the dataset is its own cursor: the pass after a full one is the next
    epoch (not an empty pass, not a replay); an explicit set_epoch still picks the epoch."""
    ds = ShardDataset(dataset_dir, "train", seed=7, block=16)
    first = [s["__key__"] for s in ds]
    assert ds.epoch == 1
    second = [s["__key__"] for s in ds]
    assert sorted(second) == sorted(first) and second != first
    ds.set_epoch(0)
    assert [s["__key__"] for s in ds] == first
    ds.set_epoch(1)
    assert [s["__key__"] for s in ds] == second


def test_loader_epoch_ends_without_exhausting_the_iterator(dataset_dir: Path) -> None:
    """Exactly len(loader) batches per iterator, as Lightning takes them: the next iterator is the next
    epoch; a state saved right after the last batch is (next epoch, 0); an explicit set_epoch after
    the end wins, even for the epoch just finished; a cursor saved at consumed = epoch length (as the
    code before this fix did) resumes into the next epoch, not an empty one."""
    def epoch_keys(loader: ShardLoader) -> list[str]:
        return [k for b in itertools.islice(iter(loader), len(loader)) for k in b["__key__"]]

    def plan(epoch: int) -> list[str]:
        ds = ShardDataset(dataset_dir, "train", seed=7, block=16)
        ds.set_epoch(epoch)
        return [s["__key__"] for s in ds]

    for workers in (0, 2):
        loader = make_loader(dataset_dir, workers=workers)
        assert epoch_keys(loader) == plan(0)
        assert (loader.state_dict()["epoch"], loader.state_dict()["consumed"]) == (1, 0)
        assert epoch_keys(loader) == plan(1)
        loader.set_epoch(1)  # the epoch that just ended: read again
        assert epoch_keys(loader) == plan(1)
        loader.set_epoch(5)
        assert epoch_keys(loader) == plan(5)
        resumed = make_loader(dataset_dir, workers=workers)
        resumed.load_state_dict(loader.state_dict())
        assert epoch_keys(resumed) == plan(6)
    old_end = {**make_loader(dataset_dir).state_dict(), "epoch": 3, "consumed": len(plan(0))}
    resumed = make_loader(dataset_dir)
    resumed.load_state_dict(old_end)
    assert epoch_keys(resumed) == plan(4)
