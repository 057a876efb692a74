"""`ShardDataset` directly under torchdata's `StatefulDataLoader`, consumed the way Lightning does it:
exactly `len(loader)` batches per epoch, then a new iterator; the old one is never exhausted.

Without workers the dataset in this process is the cursor: it moves to the next epoch just before it
hands out an epoch's last batch (it once stayed put with every item counted as handed out, so the
next pass, and a resume from a state saved there, was empty). A worker's copy does the same when it
is the only worker. With workers the parent's copy never sees a batch, so the loop calls
`set_epoch` at each epoch start (as for a DistributedSampler)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from robowds.reader import ShardDataset, collate

from exports import export_synthetic

sdl = pytest.importorskip("torchdata.stateful_dataloader")
BATCH = 8
EPOCHS = 3
Steps = list[tuple[int, list[str]]]  # (epoch, keys of the batch) per step


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # val listed (the two episodes robowds drew from val: 0.34 before plan 2): the counts below are of 4 train episodes
    return export_synthetic(tmp_path_factory.mktemp("stateful"), 6, 2, "--stride", "2",
                            "--set", "shard.max_samples=40", "--set", "splits.val=[ep_0000, ep_0005]")


def plan_steps(path: Path) -> Steps:
    """The uninterrupted run: each epoch's plan (a fresh dataset per epoch) in batches of BATCH."""
    steps: Steps = []
    for epoch in range(EPOCHS):
        ds = ShardDataset(path, "train", seed=7, block=16)
        ds.set_epoch(epoch)
        keys = [s["__key__"] for s in ds]
        steps += [(epoch, keys[i:i + BATCH]) for i in range(0, len(keys), BATCH)]
    return steps


def make(path: Path, workers: int, batched_by: str = "dataset") -> tuple[ShardDataset, Any]:
    """The README's way: the dataset collates whole planned batches (in the workers) and the loader
    passes them on (`batch_size=None`). Or ("loader") the loader batches single samples."""
    if batched_by == "dataset":
        ds = ShardDataset(path, "train", seed=7, block=16).set_batching(BATCH, collate_fn=collate)
        return ds, sdl.StatefulDataLoader(ds, batch_size=None, num_workers=workers, snapshot_every_n_steps=1)
    ds = ShardDataset(path, "train", seed=7, block=16).set_batching(BATCH)
    return ds, sdl.StatefulDataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=collate,
                                      snapshot_every_n_steps=1)


def train(ds: ShardDataset, loader: Any, first_step: int, last_step: int, set_epoch: bool) -> Steps:
    """Global steps [first_step, last_step) as Lightning takes them: a new iterator at each epoch start
    (and once when a resume starts mid-epoch), exactly the epoch's remaining batches from it."""
    per_epoch = len(loader)
    steps: Steps = []
    step = first_step
    while step < last_step:
        epoch, done = divmod(step, per_epoch)
        if set_epoch and done == 0:
            ds.set_epoch(epoch)
        take = min(per_epoch - done, last_step - step)
        steps += [(epoch, list(b["__key__"])) for b in itertools.islice(iter(loader), take)]
        step += take
    return steps


@pytest.mark.parametrize("batched_by", ["dataset", "loader"])
@pytest.mark.parametrize("workers, set_epoch", [(0, False), (0, True), (1, True), (2, True)])
def test_epochs_without_exhausting_the_iterator(dataset_dir: Path, workers: int, set_epoch: bool,
                                                batched_by: str) -> None:
    ds, loader = make(dataset_dir, workers, batched_by)
    assert len(loader) == 24
    assert train(ds, loader, 0, EPOCHS * 24, set_epoch) == plan_steps(dataset_dir)


@pytest.mark.parametrize("workers, set_epoch, cut", [(w, w > 0, cut) for w in (0, 1, 2) for cut in (5, 24, 27)
                                                     if (w, cut) != (2, 24)])  # (2, 24): the next test
def test_resume_equals_the_uninterrupted_run(dataset_dir: Path, workers: int, set_epoch: bool, cut: int) -> None:
    """cut = 24: the state is saved right after the last batch of epoch 0; the resume is epoch 1 from
    its start (it was an empty pass without workers)."""
    ds, loader = make(dataset_dir, workers)
    head = train(ds, loader, 0, cut, set_epoch)
    state = json.loads(json.dumps(loader.state_dict()))
    ds, loader = make(dataset_dir, workers)
    loader.load_state_dict(state)
    tail = train(ds, loader, cut, EPOCHS * 24, set_epoch)
    assert head + tail == plan_steps(dataset_dir)


def test_two_workers_refuse_a_state_saved_after_the_last_batch(dataset_dir: Path) -> None:
    """torchdata hands each worker only its own state: no worker can tell that all finished, so a
    resumed pass would be silently empty. The worker holding the last batch says so instead."""
    ds, loader = make(dataset_dir, 2)
    train(ds, loader, 0, 24, set_epoch=True)
    state = loader.state_dict()
    ds, loader = make(dataset_dir, 2)
    loader.load_state_dict(state)
    with pytest.raises(ValueError, match="saved after the last batch of epoch 0"):
        next(iter(loader))
