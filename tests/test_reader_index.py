"""ShardIndex: random access by position and by key, local and remote (file:// through fsspec, s3 on
moto), equal sample for sample to ShardDataset(shuffle=False) iteration, and under a plain DataLoader
with RandomSampler / DistributedSampler and 2 worker processes."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from robowds.reader.collation import collate
from robowds.reader.dataset import ShardDataset
from robowds.reader.index import ShardIndex
from robowds.reader.remote_options import Remote

from exports import export_synthetic


def canonical(item: Any) -> Any:
    """Exact content of a sample or batch, key order included (arrays as dtype, shape, bytes)."""
    if isinstance(item, torch.Tensor):
        item = item.numpy()
    if isinstance(item, np.ndarray):
        return ("array", item.dtype.str, item.shape, item.tobytes())
    if isinstance(item, dict):
        return tuple((k, canonical(v)) for k, v in item.items())
    if isinstance(item, (list, tuple)):
        return tuple(canonical(v) for v in item)
    return item


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 3 episodes at stride 4: ~70 samples in shards of at most 8 (several shards, one short)
    return export_synthetic(tmp_path_factory.mktemp("index"), 3, 5, "--stride", "4",
                            "--set", "shard.max_samples=8", "--set", "shard.min_shards=1")


@pytest.fixture(scope="module")
def iterated(exported: Path) -> list[dict[str, Any]]:
    return list(ShardDataset(exported, "train", shuffle=False))


def test_every_position_and_key_equals_iteration(exported: Path, iterated: list[dict[str, Any]]) -> None:
    ds = ShardIndex(exported, "train")
    assert len(ds) == len(iterated) and len(ds.dataset.shards) >= 5
    assert [canonical(ds[i]) for i in range(len(ds))] == [canonical(s) for s in iterated]
    for i in (len(ds) - 1, 17, 0, 40, 3):  # any order
        assert canonical(ds[i]) == canonical(iterated[i])
    assert canonical(ds[-1]) == canonical(iterated[-1])
    keys = [s["__key__"] for s in iterated]
    fresh = ShardIndex(exported, "train")
    assert canonical(fresh.by_key(keys[-1])) == canonical(iterated[-1])  # scans every shard once
    assert [fresh.position(k) for k in reversed(keys)] == list(reversed(range(len(keys))))
    assert list(fresh.positions()) == [(k, i) for i, k in enumerate(keys)]
    with pytest.raises(IndexError, match=rf"sample {len(ds)} is outside split 'train' \({len(ds)} samples\)"):
        ds[len(ds)]
    with pytest.raises(KeyError, match="no sample 'ep_9999_000000' in split 'train'"):
        ds.by_key("ep_9999_000000")


def test_key_lookups_read_no_shard_headers(exported: Path, iterated: list[dict[str, Any]]) -> None:
    """The split's key index finds keys (reader/keys.py; the header scan of exports without one:
    tests/test_key_index.py)."""
    ds = ShardIndex(exported, "train")
    first_shard = ds.dataset.shards[0].samples
    assert ds.position(iterated[1]["__key__"]) == 1
    assert ds.position(iterated[first_shard]["__key__"]) == first_shard
    assert list(ds._keys) == [] and ds._open is not None and ds._open[1].indexes_read == 2  # those two shards'


def test_remote_file_url_and_fields(exported: Path, iterated: list[dict[str, Any]]) -> None:
    remote = ShardIndex(exported.as_uri(), "train")
    order = [5, 0, len(remote) - 1, 9]
    assert [canonical(remote[i]) for i in order] == [canonical(iterated[i]) for i in order]
    assert canonical(remote.by_key(iterated[30]["__key__"])) == canonical(iterated[30])
    selected = ShardIndex(exported.as_uri(), "train", fields=["joints"])
    sample = selected[12]
    assert list(sample) == ["__key__", "joints", "joints_mask", "meta"]
    assert canonical(sample) == canonical({k: iterated[12][k] for k in sample})
    assert canonical(pickle.loads(pickle.dumps(selected))[12]) == canonical(sample)


def _batches(loader: DataLoader) -> list[Any]:
    return [canonical(b) for b in loader]


def _expected(iterated: list[dict[str, Any]], order: list[int], batch: int) -> list[Any]:
    return [canonical(collate([iterated[i] for i in order[k:k + batch]])) for k in range(0, len(order), batch)]


def test_dataloader_random_and_distributed_samplers_with_two_workers(exported: Path,
                                                                     iterated: list[dict[str, Any]]) -> None:
    ds = ShardIndex(exported, "train")
    sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(3))
    order = list(RandomSampler(ds, generator=torch.Generator().manual_seed(3)))
    assert sorted(order) == list(range(len(ds)))
    loader = DataLoader(ds, batch_size=5, sampler=sampler, collate_fn=collate, num_workers=2)
    assert _batches(loader) == _expected(iterated, order, 5)
    seen: list[int] = []
    for rank in (0, 1):
        dist = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=7)
        dist.set_epoch(1)
        mine = list(dist)
        seen += mine
        loader = DataLoader(ds, batch_size=4, sampler=dist, collate_fn=collate, num_workers=2)
        assert _batches(loader) == _expected(iterated, mine, 4)
    assert set(seen) == set(range(len(ds)))


def test_s3_through_moto(exported: Path, iterated: list[dict[str, Any]]) -> None:
    pytest.importorskip("moto")
    from fault_proxy import s3_behind_proxy

    with s3_behind_proxy({"ds": exported}) as (proxy, options):
        ds = ShardIndex("s3://robots/ds/manifest.json", "train", remote=Remote(storage_options=options))
        order = [len(ds) - 1, 2, 33]
        assert [canonical(ds[i]) for i in order] == [canonical(iterated[i]) for i in order]
        assert canonical(ds.by_key(iterated[20]["__key__"])) == canonical(iterated[20])
