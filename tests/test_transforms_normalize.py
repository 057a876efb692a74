"""`ShardDataset.stats` and `Normalize` (issue 24 items 1, 2 and 6): the three formulas against a
hand computation from the manifest's statistics, the per-field mode map, padded steps kept bit for
bit, the inverse, the same bits on a sample (numpy) and on a collated torch batch, the errors, pickling
and a real spawn DataLoader over a tiny synthetic export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exports import export_synthetic
from robowds.reader import Mixture, ShardDataset

FIELDS = ["actions", "gripper_cmd", "imu", "joints", "orientation"]  # the synthetic store's time series


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 episodes, stride 4: 51 windows, some with padded steps (imu has masked steps inside too)."""
    return export_synthetic(tmp_path_factory.mktemp("normalize"), 2, 0, "--stride", "4")


@pytest.fixture(scope="module")
def stats(out: Path) -> dict[str, Any]:
    return ShardDataset(out, "train").stats


# -- item 1: ShardDataset.stats ------------------------------------------------------------------
def test_dataset_stats_are_the_manifests_split_statistics(out: Path, stats: dict[str, Any]) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    assert stats == manifest["stats"]["train"] and sorted(stats) == FIELDS
    assert set(stats["joints"]) == {"count", "mean", "std", "min", "max", "q01", "q99"}
    mix = Mixture([ShardDataset(out, "train")], [1.0], names=["a"], rank=0, world_size=1)
    assert mix.stats("a") == stats
