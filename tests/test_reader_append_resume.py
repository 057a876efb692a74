"""Training while the data grows (issue 25, item 7): a cursor saved before `robowds export --append`.

A store of 3 episodes is exported (`old`, generation 1); a copy grown to 5 episodes by `--append`
(`grown`, generation 2: old shards first, byte-identical, then the new ones). A cursor saved k batches
into an epoch on `old` and loaded on `grown` finishes that epoch with exactly the keys the
uninterrupted epoch on `old` yields, in order (the plan keeps generation 1's shards); the next epoch
reads every key of `grown`, in the order a fresh dataset's epoch of that number on `grown` has. With
ShardLoader over 0 and 2 DataLoader workers, a Mixture whose one source grew, and 2 torchrun ranks on
gloo. A cursor of another export (the same store exported with another seed: the same size), or one
from a generation the export does not have, is refused naming both exports.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.reader import Mixture, ShardDataset, ShardLoader
from robowds.reader.manifest import ManifestError, shards_of
from robowds.reader.plan import PlanSpec, rank_sequence

from test_ddp import WORKER, split_keys, torchrun

OPTIONS = ["--quiet", "--workers", "1", "--stride", "8", "--set", "shard.max_samples=6", "--set", "shard.min_shards=1"]
BATCH, TAKE = 4, 2  # batch size; batches read before the cursor is saved


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`old` (3 episodes), `grown` (a copy of it, appended to 5), `other` (the 3 with export seed 1)."""
    root = tmp_path_factory.mktemp("append-resume")
    write_synthetic_store(root / "s3", episodes=3)
    write_synthetic_store(root / "s5", episodes=5)
    for name, extra in (("old", []), ("other", ["--seed", "1"])):
        assert main(["export", str(root / "s3"), str(root / name), *OPTIONS, *extra]) == 0
    shutil.copytree(root / "old", root / "grown")
    assert main(["export", str(root / "s5"), str(root / "grown"), "--append", "--quiet", "--workers", "1"]) == 0
    return {name: root / name for name in ("old", "grown", "other")}


def dataset(out: Path, seed: int = 5, **kwargs: Any) -> ShardDataset:
    return ShardDataset(out, "train", seed=seed, block=4, rank=0, world_size=1, **kwargs)


def keys(loader: ShardLoader | Mixture, batches: int | None = None) -> list[str]:
    """The keys of one pass (the rest of the current epoch), or of its first `batches` batches."""
    out: list[str] = []
    for i, batch in enumerate(loader):
        out += batch["__key__"]
        if batches is not None and i + 1 == batches:
            break
    return out


def epoch_keys(make: Any, epoch: int) -> list[str]:
    """A fresh loader's epoch `epoch`, uninterrupted."""
    loader = make()
    loader.set_epoch(epoch)
    return keys(loader)


def test_premise_the_append_added_shards_at_the_end(exports: dict[str, Path]) -> None:
    old, grown = (json.loads((exports[n] / "manifest.json").read_text()) for n in ("old", "grown"))
    assert (old["generation"], grown["generation"]) == (1, 2)
    n_old = len(old["splits"]["train"]["shards"])
    assert grown["splits"]["train"]["shards"][:n_old] == old["splits"]["train"]["shards"]
    assert len(grown["splits"]["train"]["shards"]) > n_old and split_keys(exports["grown"])[:32] == \
        split_keys(exports["old"]) and len(split_keys(exports["old"])) == 32


@pytest.mark.parametrize("workers", [0, 2])
def test_a_cursor_saved_before_an_append_finishes_the_epoch_it_began(exports: dict[str, Path], workers: int) -> None:
    old, grown = exports["old"], exports["grown"]
    before = ShardLoader(dataset(old), BATCH, num_workers=workers)
    head = keys(before, TAKE)
    state = json.loads(json.dumps(before.state_dict()))
    assert (state["generation"], state["consumed"], state["samples"]) == (1, TAKE * BATCH, 32)
    after = ShardLoader(dataset(grown), BATCH, num_workers=workers)
    after.load_state_dict(state)
    assert after.dataset.plan_generation == 1 and len(after) == 32 // BATCH
    rest = keys(after)
    assert head + rest == epoch_keys(lambda: ShardLoader(dataset(old), BATCH), 0)  # exactly, in order
    assert after.dataset.epoch == 1 and after.dataset.plan_generation == 2
    following = keys(after)
    assert following == epoch_keys(lambda: ShardLoader(dataset(grown), BATCH), 1)
    assert sorted(following) == sorted(split_keys(grown)) and len(following) == 60  # old and new, once each


def test_a_resumed_cursor_saved_again_keeps_its_generation(exports: dict[str, Path]) -> None:
    """A cursor saved mid-epoch by a dataset that resumed across the append still names generation 1
    (and its job), so it resumes again on the grown export, or a later one; an epoch-end cursor
    `(epoch + 1, 0)` saved before the append reads every shard (nothing of its epoch was read); a
    cursor saved before robowds recorded the generation (no key) resumes at the generation whose job
    is its `export`."""
    old, grown = exports["old"], exports["grown"]
    first = dataset(old)
    reference = first.sequence()  # [32] the uninterrupted epoch 0 on the old export
    resumed = dataset(grown)
    resumed.load_cursor(first.cursor(consumed=8))
    saved = resumed.cursor(consumed=20)
    assert saved == first.cursor(consumed=20)  # generation 1, its export and sample count
    again = dataset(grown)
    again.load_cursor(saved)
    assert again.sequence().tolist() == reference.tolist() and again.start == 20
    legacy = dataset(grown)
    legacy.load_cursor({k: v for k, v in first.cursor(consumed=8).items() if k != "generation"})
    assert legacy.plan_generation == 1 and legacy.sequence().tolist() == reference.tolist()
    first.set_epoch(1)
    ended = dataset(grown)
    ended.load_cursor(first.cursor())
    fresh = dataset(grown)
    fresh.set_epoch(1)
    assert ended.plan_generation == 2 and ended.sequence().tolist() == fresh.sequence().tolist()
    assert len(set(fresh.sequence().tolist())) == 60


def test_a_cursor_of_another_export_or_generation_is_refused(exports: dict[str, Path]) -> None:
    old, grown, other = (dataset(exports[n]) for n in ("old", "grown", "other"))
    ids = {n: json.loads((exports[n] / "manifest.json").read_text())["job_id"][:16] for n in exports}
    assert sum(other.counts) == sum(old.counts)  # the premise: the same size, other samples
    tail = (": its positions would be another export's samples. Fix: load the cursor with the export(s) it was "
            "saved from, or drop it and start afresh (a new loader without the cursor, or set_epoch(1) for the "
            "next epoch)")
    cases = [
        (old, other, f"cursor key 'export': the cursor was saved on export {ids['old']}, this dataset reads export "
                     f"{ids['other']} (the first 16 hex digits of each manifest's job_id)"),
        (other, grown, f"cursor key 'export': the cursor was saved on export {ids['other']} (generation 1), this "
                       f"dataset reads export {ids['grown']} (generation 2), whose generation 1 is export {ids['old']} "
                       "(another export, or OUT exported again)"),
        (grown, other, f"cursor key 'generation': the cursor was saved at generation 2 of export {ids['grown']}, this "
                       f"dataset reads export {ids['other']}, which has generations 1 to 1 (another export, or OUT "
                       "exported again)"),
    ]
    for saver, loader, message in cases:
        with pytest.raises(ValueError) as info:
            ShardLoader(loader, BATCH).load_state_dict(saver.cursor(consumed=4))
        assert str(info.value) == message + tail
        assert (loader.start, loader.plan_generation) == (0, loader.generation)  # nothing changed
    mix = Mixture([dataset(exports["grown"]), dataset(exports["old"])], [1, 1], seed=2, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"^mixture cursor key 'generations': the cursor was saved at generation 3 of "
                                         r"source 'source1', whose export has generations 1 to 1 \(another export"):
        mix.load_cursor({**mix.cursor(consumed=3), "generations": [2, 3]})
    with pytest.raises(ValueError, match=r"^mixture cursor key 'exports': "):  # source0 at 1 on a mixture saved at 2
        mix.load_cursor({**mix.cursor(consumed=3), "generations": [1, 1]})
    assert (mix.start, mix.plan_generations) == (0, (2, 1))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mixture_whose_source_grew_finishes_its_epoch(exports: dict[str, Path], workers: int) -> None:
    """Source `a` grew (old -> grown), `b` did not. Weights are the grown sizes and one block covers
    the epoch, so each source's draws in a grown epoch are exactly its size: every key once."""
    old, grown = exports["old"], exports["grown"]

    def mixture(first: Path) -> Mixture:
        return Mixture([dataset(first, seed=1), dataset(old, seed=2)], [60, 32], seed=3, names=["a", "b"],
                       block=128, rank=0, world_size=1)

    before = ShardLoader(mixture(old), BATCH, num_workers=workers)
    head = keys(before, TAKE)
    state = json.loads(json.dumps(before.state_dict()))
    assert state["generations"] == [1, 1] and state["samples_per_epoch"] == 64
    after = ShardLoader(mixture(grown), BATCH, num_workers=workers)
    after.load_state_dict(state)
    assert after.dataset.plan_generations == (1, 1)
    assert head + keys(after) == epoch_keys(lambda: ShardLoader(mixture(old), BATCH), 0)
    following = keys(after)
    assert after.dataset.plan_generations == (2, 1) and after.dataset.length_per_epoch == 92
    assert following == epoch_keys(lambda: ShardLoader(mixture(grown), BATCH), 1)
    assert sorted(following) == sorted([f"a/{k}" for k in split_keys(grown)] + [f"b/{k}" for k in split_keys(old)])


@pytest.mark.slow
def test_two_ranks_resume_across_an_append(exports: dict[str, Path], tmp_path: Path) -> None:
    """torchrun, 2 ranks on gloo, 2 workers each: every rank takes 2 batches of the old export, saves,
    loads on the grown one, finishes epoch 0 (its part of the old plan, exactly) and reads epoch 1 (its
    part of the grown plan); both ranks' batch counts agree (one all_reduce per batch)."""
    old, grown = exports["old"], exports["grown"]
    torchrun(WORKER, str(grown), str(tmp_path), "--resume-from", str(old), "--take", str(TAKE), "--policy", "pad",
             "--batch-size", str(BATCH), "--workers", "2", "--seed", "5")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    old_keys, grown_keys = split_keys(old), split_keys(grown)
    counts = {n: tuple(s.samples for s in shards_of(json.loads((exports[n] / "manifest.json").read_text()), "train"))
              for n in ("old", "grown")}
    specs = {n: PlanSpec(c, seed=5) for n, c in counts.items()}
    for r, rec in enumerate(ranks):
        assert rec["generation_saved"] == 1 and rec["batches"] == rec["max_batches"]
        assert rec["head"] + rec["keys"] == [old_keys[i] for i in rank_sequence(specs["old"], 0, 2, r)]
        assert rec["next"] == [grown_keys[i] for i in rank_sequence(specs["grown"], 1, 2, r)]
    assert set(ranks[0]["next"] + ranks[1]["next"]) == set(grown_keys)


def test_a_damaged_generations_list_is_one_manifest_error(exports: dict[str, Path], tmp_path: Path) -> None:
    """`generations` is read when a dataset is made: an entry that could not have been written (a shard
    count past the split's, generations not numbered 1, 2, ..., a last one that leaves shards out) is
    one ManifestError naming it."""
    manifest = json.loads((exports["grown"] / "manifest.json").read_text())
    first, second = manifest["generations"]
    cases = [
        ([first, {**second, "shards": {"train": 99}}],
         "manifest.json: generations entry 1: split 'train' shard count 99 must be an integer from 6 (the "
         "generation before) to 11 (the split's shards)"),
        ([second, first], "manifest.json: generations entry 0: must be an object with 'generation' 1 (generations are "
                          "numbered on from 1)"),
        ([first], "manifest.json: generations entry 0 (the last) counts 6 shards of split 'train', the split lists 11"),
    ]
    for generations, message in cases:
        (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "generations": generations}))
        with pytest.raises(ManifestError) as info:
            ShardDataset(tmp_path, "train")
        assert str(info.value) == message
