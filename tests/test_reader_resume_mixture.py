"""The resume harness of test_reader_resume.py, its test functions and assertions unchanged, run over a
`Mixture` (issue 15: "the existing resume harness passes unchanged over mixtures").

Its tests build every loader through the module's `make_loader`; here that builds a ShardLoader over a
mixture of the same export's train and val splits (weights 0.7 / 0.3, an epoch as long as the train
split, so the harness's sample counts hold and no source wraps within an epoch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import test_reader_resume as harness
from robowds.reader import Mixture, ShardDataset, ShardLoader

from test_reader_resume import dataset_dir  # noqa: F401 (the harness's export, a fixture)


@pytest.fixture(autouse=True)
def mixture_loaders(monkeypatch: pytest.MonkeyPatch) -> None:
    def make_loader(out: Path, rank: int = 0, world: int = 1, workers: int = 0, policy: str = "pad",
                    **kwargs: Any) -> ShardLoader:
        train = json.loads((out / "manifest.json").read_text())["splits"]["train"]["samples"]
        sources = [ShardDataset(out, split, seed=7, block=16) for split in ("train", "val")]
        mix = Mixture(sources, [0.7, 0.3], seed=7, block=16, policy=policy, rank=rank, world_size=world,
                      samples_per_epoch=train, **kwargs)
        return ShardLoader(mix, batch_size=harness.BATCH, num_workers=workers)

    monkeypatch.setattr(harness, "make_loader", make_loader)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_at_random_cut_points(dataset_dir: Path, world: int, workers: int) -> None:  # noqa: F811
    harness.test_resume_at_random_cut_points(dataset_dir, world, workers)


def test_epoch_boundary_and_epochs_differ(dataset_dir: Path) -> None:  # noqa: F811
    """The harness's version also asserts that both epochs read the same set of samples: a mixture
    epoch does not (each source goes on from where the last epoch stopped, docs/reader.md), so that
    one assertion is replaced by: both epochs are as long, and differ (tests/test_reader_mixture.py
    checks that each source's draws follow its own plan across epochs)."""
    loader = harness.make_loader(dataset_dir)
    records = harness.consume(loader)
    per_epoch = [[k for e, k, _ in records if e == epoch] for epoch in (0, 1)]
    assert len(per_epoch[0]) == len(per_epoch[1]) and per_epoch[0] != per_epoch[1]
    state = loader.state_dict()
    assert (state["epoch"], state["consumed"]) == (2, 0)  # a cut exactly at the boundary
    assert harness.consume(harness.make_loader(dataset_dir), epochs=2) == records  # same seed, same order


@pytest.mark.parametrize("old, new", [((1, 0), (2, 0)), ((2, 1), (1, 2))])
def test_elastic_resume_delivers_the_rest_exactly_once(dataset_dir: Path, old: tuple[int, int],  # noqa: F811
                                                       new: tuple[int, int]) -> None:
    harness.test_elastic_resume_delivers_the_rest_exactly_once(dataset_dir, old, new)


def test_later_epochs_follow_the_new_topology(dataset_dir: Path) -> None:  # noqa: F811
    harness.test_later_epochs_follow_the_new_topology(dataset_dir)
