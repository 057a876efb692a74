"""The batch path (reader/batching.py): fixed-shape arrays copied straight from the mapped shard into
the batch tensors give exactly the batches the per-sample path (decode, then `reader.collate`) gives:
same names, order, dtypes, shapes, values, keys, meta and text; in-process and from 2 DataLoader
workers, from a resume cursor mid-epoch, with pin_memory; custom collate_fn keeps the per-sample path."""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from robowds.reader import ShardDataset, ShardLoader
from robowds.reader.collation import Collate, collate
from robowds.reader.layout import RawArray, SampleDecoder
from robowds.reader.manifest import read_local_index

from exports import export_synthetic

BATCH = 8


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # two short episodes; the image excluded, so every array member is a fixed-shape .npy
    return export_synthetic(tmp_path_factory.mktemp("batching"), 3, 4, "--stride", "3",
                            "--set", "shard.max_samples=16", "--set", "exclude=[overview]")


def test_array_views_are_the_decoded_arrays_bytes_in_place(out: Path) -> None:
    ds = ShardDataset(out, "train", shuffle=False)
    shard = ds.shards[0]
    offsets = read_local_index(out, shard).tolist()
    with open(out / shard.path, "rb") as fh:
        buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    decoder = SampleDecoder(ds.members)
    assert decoder.array_views(buf, offsets[0], offsets[1]) is None  # nothing learned yet
    first = decoder.decode(buf, offsets[0], offsets[1], "s", offsets[0])
    views = decoder.array_views(buf, offsets[1], offsets[2])
    second = decoder.decode(buf, offsets[1], offsets[2], "s", offsets[1])
    arrays = {k for k, v in second.items() if isinstance(v, np.ndarray) and v.ndim >= 1}
    assert views is not None and set(views) == arrays and len(arrays) >= 4
    for name, (data, dtype, shape) in views.items():
        assert isinstance(data, memoryview) and data.obj is buf  # in place, not copied
        assert (dtype, shape) == (second[name].dtype, second[name].shape)
        assert bytes(data) == second[name].tobytes()
    raw = decoder.decode(buf, offsets[1], offsets[2], "s", offsets[1], raw=True)
    assert list(raw) == list(second)  # same names, same order
    assert all(isinstance(raw[k], RawArray) for k in arrays)
    assert {k: v for k, v in raw.items() if k not in arrays} == {k: v for k, v in second.items() if k not in arrays}
    del views, raw, first, second, data
    buf.close()
