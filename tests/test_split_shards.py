"""A small export with the default config: enough shards for DataLoader workers (shard.min_shards), and
what each split got (report.splits, and a warning for a requested split that got no episode)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.reader.format import group_samples, iter_members

from corrupt import rewrite_table


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synth") / "store"
    write_synthetic_store(root, episodes=4, seed=2)
    return root


def _export(store: Path, out: Path, *options: str) -> dict:
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", *options]) == 0
    return json.loads((out / "manifest.json").read_text())


def test_default_small_export_has_min_shards_and_plain_webdataset_reads_with_2_workers(
        store: Path, tmp_path: Path) -> None:
    webdataset = pytest.importorskip("webdataset")
    from torch.utils.data import DataLoader

    out = tmp_path / "out"
    manifest = _export(store, out)
    train = manifest["splits"]["train"]
    keys = [k for s in train["shards"] for k, _, _ in group_samples(iter_members((out / s["path"]).read_bytes()))]
    urls = [str(out / s["path"]) for s in train["shards"]]
    # plain webdataset, its defaults (single_node_only, split_by_worker, empty_check): each worker reads
    # whole shards and refuses to start without one
    dataset = webdataset.WebDataset(urls, shardshuffle=False).to_tuple("__key__")
    read = [key for batch in DataLoader(dataset, batch_size=None, num_workers=2) for key in batch]
    assert Counter(read) == Counter(keys) and len(read) == train["samples"] == len(set(keys))
    assert manifest["config"]["shard"]["min_shards"] == 8
    assert len(train["shards"]) == 8  # the size limits alone: 1 shard
    counts = [s["samples"] for s in train["shards"]]
    assert max(counts) - min(counts) <= 1 and sum(counts) == train["samples"]


def test_report_counts_episodes_and_windows_per_split(store: Path, tmp_path: Path) -> None:
    manifest = _export(store, tmp_path / "out", "--set", "splits.val=0.25")
    splits = manifest["splits"]
    # seed 0 draws 0.886, 0.306, 0.048, 0.029 for ep_0000..ep_0003 (shard_plan.split_draw): two below 0.25
    assert splits["val"]["episodes"] == ["ep_0002", "ep_0003"]
    assert manifest["report"]["splits"] == {
        "train": {"episodes": 2, "windows": splits["train"]["samples"]},
        "val": {"episodes": 2, "windows": splits["val"]["samples"]}}
    assert splits["train"]["samples"] + splits["val"]["samples"] == manifest["report"]["windows"]["emitted"]
    assert splits["val"]["samples"] > 0


def test_requested_split_without_episodes_is_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    write_synthetic_store(store, episodes=5, seed=2)
    capsys.readouterr()
    # seed 0 draws 0.886, 0.306, 0.048, 0.029, 0.851 for the 5 episodes (shard_plan.split_draw): none below 0.02
    manifest = _export(store, tmp_path / "out", "--set", "splits.val=0.02")
    train = manifest["splits"]["train"]["samples"]
    assert manifest["report"]["splits"] == {"train": {"episodes": 5, "windows": train},
                                            "val": {"episodes": 0, "windows": 0}}
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [f"splits: train 5 episodes ({train} windows), val 0 episodes (0 windows)",
                         "warning: split 'val' got no episode (of 5 exported): its shard list is empty; splits.val: "
                         "0.02 is a fraction, which holds on average only (each episode's split is drawn from a hash "
                         "of its id and the seed, so a few episodes can give none); list the split's episode ids "
                         "instead (splits.val: [id, ...]) or set another seed (--set seed=1)"]


def test_default_rest_split_emptied_by_the_store_split_column_is_no_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every episode placed by the store's `split` column: the default `train: rest` gets none, as the
    column says; counted in the report, not warned about. A configured `val: 0.5` of those 0 free
    episodes is warned about."""
    store = tmp_path / "store"
    write_synthetic_store(store, episodes=4, seed=2)
    rewrite_table(store, "text.parquet", lambda t: t.append_column(
        "split", pa.array(["training", "training", "validation", "training"])))
    capsys.readouterr()
    manifest = _export(store, tmp_path / "out")
    assert {name: counts["episodes"] for name, counts in manifest["report"]["splits"].items()} == {
        "train": 0, "training": 3, "validation": 1}
    windows = {name: counts["windows"] for name, counts in manifest["report"]["splits"].items()}
    assert capsys.readouterr().out.splitlines()[1:] == [  # the per-split counts, no warning
        f"splits: train 0 episodes (0 windows), training 3 episodes ({windows['training']} windows), "
        f"validation 1 episode ({windows['validation']} windows)"]
    _export(store, tmp_path / "out2", "--set", "splits.val=0.5")
    assert capsys.readouterr().out.splitlines()[2:] == [
        "warning: split 'val' got no episode (of 4 exported): its shard list is empty; splits.val: 0.5 is a "
        "fraction, which holds on average only (each episode's split is drawn from a hash of its id and the "
        "seed, so a few episodes can give none); list the split's episode ids instead (splits.val: [id, ...]) "
        "or set another seed (--set seed=1)"]
