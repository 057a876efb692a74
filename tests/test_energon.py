"""Megatron-Energon loads an export folder directly, without `energon prepare` (issue 15 item 7).

The export writes `.nv-meta/{dataset.yaml,split.yaml,.info.json}` (export/output/energon.py) next to the
per-shard `<shard>.tar.idx`. Read with the real `megatron-energon` package (`get_train_dataset` +
`get_loader`, 0 and 2 workers, one pass): every sample of the split exactly once, each member's bytes
equal to our own tar walk. Publish treats the `.nv-meta/` files like the rest of the export: an
`--overwrite` replaces them; a file robowds did not write there (an edit, `energon prepare`'s
`index.sqlite`) is kept, with a warning.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import braceexpand
import numpy as np
import pytest
import yaml

from robowds.export.cli.main import main
from robowds.export.output.energon import DATASET_YAML, INFO_JSON, SPLIT_YAML, collapse, energon_files
from robowds.reader import ShardDataset
from robowds.reader.interop import decode_members
from robowds.reader.manifest import parse_manifest

from exports import export_members, export_synthetic

OPTIONS = ("--stride", "8", "--set", "splits.val=0.34", "--set", "shard.max_samples=5", "--set", "shard.min_shards=1")


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 episodes, a train and a val split in shards of at most 5 samples (never modified: tests copy it)."""
    return export_synthetic(tmp_path_factory.mktemp("energon"), 3, 2, *OPTIONS)


def manifest_of(out: Path) -> dict[str, Any]:
    return parse_manifest((out / "manifest.json").read_bytes())


def energon_read(out: Path, split: str, workers: int, cook: Any = None) -> list[dict[str, Any]]:
    """One pass of Energon's own loader over `split`: samples as the cooker returns them (raw members:
    the task encoder's decoder is None), in the order Energon yields them."""
    energon = pytest.importorskip("megatron.energon")

    class Encoder(energon.DefaultTaskEncoder):
        cookers = [energon.Cooker(energon.stateless(cook or (lambda sample: sample)), has_subflavors={"robowds": 2})]
        decoder = None  # members arrive as bytes

        def batch(self, samples: list[Any]) -> list[Any]:
            return samples

    ds = energon.get_train_dataset(out, split_part=split, batch_size=3, shuffle_buffer_size=None,
                                   max_samples_per_sequence=None, repeat=False, task_encoder=Encoder(),
                                   worker_config=energon.WorkerConfig(rank=0, world_size=1, num_workers=workers))
    return [dict(sample) for batch in energon.get_loader(ds) for sample in batch]


@pytest.mark.parametrize(("split", "workers"), [("train", 0), ("train", 2), ("val", 0)])
def test_energon_reads_every_sample_once(out: Path, split: str, workers: int) -> None:
    members = export_members(out)
    keys = {k for s in manifest_of(out)["splits"][split]["shards"] for k in _keys(out / s["path"])}
    got = energon_read(out, split, workers)
    assert Counter(s["__key__"] for s in got) == Counter(keys) and len(keys) >= 6
    for sample in got:
        assert sample["__subflavors__"] == {"robowds": 2}
        assert {k: bytes(v) for k, v in sample.items() if not k.startswith("__")} == members[sample["__key__"]]


def _keys(tar: Path) -> list[str]:
    import tarfile
    with tarfile.open(tar) as t:
        return list(dict.fromkeys(m.name.split(".", 1)[0] for m in t))


def test_energon_cooker_decodes_like_shard_dataset(out: Path) -> None:
    """`Cooker(stateless(decode_members))`: the values our reader gives, for every sample."""
    mine = {s["__key__"]: s for s in ShardDataset(out, "train", shuffle=False)}
    got = energon_read(out, "train", 0, cook=decode_members)
    assert sorted(s["__key__"] for s in got) == sorted(mine)
    for sample in got:
        for name, value in sample.items():
            if not name.startswith("__"):
                expected = mine[sample["__key__"]][name.split(".", 1)[0]]
                if isinstance(expected, np.ndarray):  # Energon's loader hands arrays on as tensors
                    value = value.numpy() if hasattr(value, "numpy") else value
                    np.testing.assert_array_equal(value, expected, err_msg=name)
                    assert value.dtype == expected.dtype
                else:
                    assert value == expected, name


def test_nv_meta_is_what_energon_expects(out: Path) -> None:
    """Pure functions of the manifest; split.yaml's brace ranges expand to exactly the manifest's shards
    in order; .info.json counts every shard's samples; dataset.yaml names Energon's CrudeWebdataset."""
    manifest = manifest_of(out)
    files = energon_files(manifest)
    assert {rel: (out / rel).read_bytes() for rel in files} == files
    splits = yaml.safe_load(files[SPLIT_YAML])
    for split, entry in manifest["splits"].items():
        expanded = [n for pattern in splits["split_parts"][split] for n in braceexpand.braceexpand(pattern)]
        assert expanded == [s["path"] for s in entry["shards"]] and len(expanded) >= 2
        assert len(splits["split_parts"][split]) == 1  # one brace range per split: O(1), not O(shards)
    counts = json.loads(files[INFO_JSON])["shard_counts"]
    assert counts == {s["path"]: s["samples"] for e in manifest["splits"].values() for s in e["shards"]}
    doc = yaml.safe_load(files[DATASET_YAML])
    assert doc == {"__module__": "megatron.energon", "__class__": "CrudeWebdataset", "subflavors": {"robowds": 2}}
    assert collapse(["a/shard-000001.tar", "a/shard-000002.tar", "a/shard-000004.tar", "b/x.tar"]) == \
        ["a/shard-{000001..000002}.tar", "a/shard-000004.tar", "b/x.tar"]


def test_tar_indexes_equal_energon_prepare(out: Path, tmp_path: Path) -> None:
    """Energon's own preparator (`energon prepare --tar-index-only`) rewrites every `<shard>.tar.idx`
    with the bytes the export wrote, and adds `.nv-meta/index.sqlite`."""
    energon = pytest.importorskip("megatron.energon")
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    shards = [s["path"] for e in manifest_of(out)["splits"].values() for s in e["shards"]]
    for rel in shards:
        (copy / (rel + ".idx")).unlink()
    energon.BaseWebdatasetFactory.prepare_dataset(copy, shards, tar_index_only=True, workers=1,
                                                  split_parts_ratio=[("train", 1.0)])
    assert all((copy / (rel + ".idx")).read_bytes() == (out / (rel + ".idx")).read_bytes() for rel in shards)
    assert (copy / ".nv-meta" / "index.sqlite").is_file()
    files = energon_files(manifest_of(out))  # prepare leaves ours alone: the next export still owns them
    assert {rel: (copy / rel).read_bytes() for rel in files} == files


def test_overwrite_replaces_nv_meta_and_keeps_the_users(out: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`--overwrite` with another config: our three files are the new export's; a user's `index.sqlite`
    and an edited `dataset.yaml` stay byte for byte, each named in a warning; Energon reads the result."""
    store, dest = out.parent / "store", tmp_path / "o"
    shutil.copytree(out, dest)
    sqlite = b"SQLite format 3\0 not really"
    (dest / ".nv-meta" / "index.sqlite").write_bytes(sqlite)
    assert main(["export", str(store), str(dest), "--quiet", "--workers", "1", "--overwrite", *OPTIONS,
                 "--set", "shard.max_samples=7"]) == 0
    printed = capsys.readouterr().out
    manifest = manifest_of(dest)
    assert {rel: (dest / rel).read_bytes() for rel in energon_files(manifest)} == energon_files(manifest)
    assert energon_files(manifest) != energon_files(manifest_of(out))  # the premise: other shards
    assert (dest / ".nv-meta" / "index.sqlite").read_bytes() == sqlite
    assert "warning: .nv-meta/index.sqlite" in printed and "energon prepare" in printed

    edited = b"__module__: megatron.energon\n__class__: CrudeWebdataset\nsubflavors:\n  robowds: 2\n  mine: 1\n"
    (dest / DATASET_YAML).write_bytes(edited)
    assert main(["export", str(store), str(dest), "--quiet", "--workers", "1", "--overwrite", *OPTIONS]) == 0
    printed = capsys.readouterr().out
    assert (dest / DATASET_YAML).read_bytes() == edited and f"{DATASET_YAML} in {dest} was not written" in printed
    files = energon_files(manifest_of(dest))
    assert {rel: (dest / rel).read_bytes() for rel in (SPLIT_YAML, INFO_JSON)} == \
        {rel: files[rel] for rel in (SPLIT_YAML, INFO_JSON)}
    (dest / DATASET_YAML).unlink()  # back to robowds' own: the next export writes it again
    assert main(["export", str(store), str(dest), "--quiet", "--workers", "1", "--overwrite", *OPTIONS]) == 0
    assert (dest / DATASET_YAML).read_bytes() == files[DATASET_YAML] and "was not written" not in capsys.readouterr().out
    pytest.importorskip("megatron.energon")
    assert len(energon_read(dest, "train", 0)) == manifest_of(dest)["splits"]["train"]["samples"]
