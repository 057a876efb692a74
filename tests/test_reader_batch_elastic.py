"""Elastic across batch size: a ShardLoader cursor saved with batch size B1 loads with B2 and continues at
the next unconsumed sample, each exactly once (the cursor counts samples, and the plan's positions do
not depend on the batch size). torchdata's StatefulDataLoader keeps per-worker progress in batches,
which another batch size cannot convert: such a state is refused with one message naming the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robowds.reader import ShardDataset, ShardLoader

from exports import export_synthetic
from test_reader_resume import consume  # the resume harness's reader, unchanged


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_synthetic(tmp_path_factory.mktemp("batch"), 4, 2, "--stride", "3",
                            "--set", "shard.max_samples=20", "--set", "splits.val=0")


def make_loader(out: Path, batch: int, workers: int, rank: int = 0, world: int = 1) -> ShardLoader:
    ds = ShardDataset(out, "train", seed=7, block=16, rank=rank, world_size=world)
    return ShardLoader(ds, batch_size=batch, num_workers=workers)


@pytest.mark.parametrize("old, new, world", [((8, 0), (5, 0), 1), ((4, 2), (7, 1), 1), ((6, 0), (3, 1), 2)])
def test_cursor_from_one_batch_size_continues_with_another(dataset_dir: Path, old: tuple[int, int],
                                                           new: tuple[int, int], world: int) -> None:
    """(batch size, workers) old -> new; cuts early, just before the epoch's last batch, and in epoch 1."""
    for rank in range(world):
        reference = consume(make_loader(dataset_dir, 1, 0, rank, world))  # two epochs, sample by sample
        per_epoch = len(reference) // 2
        for cut in (1, -(-per_epoch // old[0]) - 1, -(-per_epoch // old[0]) + 2):
            first = make_loader(dataset_dir, old[0], old[1], rank, world)
            head = consume(first, batches=cut)
            state = json.loads(json.dumps(first.state_dict()))
            assert state["batch_size"] == old[0] and state["consumed"] == len(head) % per_epoch
            second = make_loader(dataset_dir, new[0], new[1], rank, world)
            second.load_state_dict(state)
            tail = consume(second)
            assert head + tail == reference, f"{old} -> {new}, rank {rank}/{world}, cut after batch {cut}"
            assert all(len(k) for k in tail)


def test_batch_size_and_world_size_change_together(dataset_dir: Path) -> None:
    """World 2 with batch 4 -> world 1 with batch 6: the rest of the epoch, every sample once."""
    everything = sorted(k for _, k, _ in consume(make_loader(dataset_dir, 1, 0), epochs=1))
    keys, states = [], []
    for rank in range(2):
        loader = make_loader(dataset_dir, 4, 1, rank, 2)
        keys += [k for _, k, _ in consume(loader, batches=3, epochs=1)]
        states.append(loader.state_dict())
    resumed = make_loader(dataset_dir, 6, 2)
    resumed.load_state_dict(states[0])
    keys += [k for _, k, _ in consume(resumed, epochs=1)]
    assert sorted(keys) == everything or (len(everything) % 2 and sorted(set(keys)) == everything
                                          and len(keys) == len(everything) + 1)


def test_stateful_dataloader_state_from_another_batch_size(dataset_dir: Path) -> None:
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    from robowds.reader import collate

    def loader(batch: int) -> object:
        ds = ShardDataset(dataset_dir, "train", seed=7, block=16).set_batching(batch, collate_fn=collate)
        return sdl.StatefulDataLoader(ds, batch_size=None, num_workers=2, snapshot_every_n_steps=1)

    first = loader(4)
    it = iter(first)
    head = [k for _ in range(3) for k in next(it)["__key__"]]
    state = json.loads(json.dumps(first.state_dict()))
    same = loader(4)  # the same batch size resumes exactly
    same.load_state_dict(state)
    reference = [k for b in loader(4) for k in b["__key__"]]
    assert head + [k for b in same for k in b["__key__"]] == reference
    other = loader(6)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match=r"saved with batch_size=4, this dataset has batch_size=6.*ShardLoader"):
        next(iter(other))
