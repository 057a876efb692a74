"""What ShardDataset hands out for a real export equals an independent decoder's reading of the same
shards (webdataset's tar walk with np.load), and the learned-layout path is what decodes them."""

from __future__ import annotations

import io
import mmap
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from robowds.reader import ShardDataset
from robowds.reader.layout import SampleDecoder
from robowds.reader.manifest import parse_manifest, read_local_index, shards_of

from exports import export_synthetic


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_synthetic(tmp_path_factory.mktemp("decode"), 5, 3, "--stride", "3",
                            "--set", "shard.max_samples=25")


def test_every_sample_equals_webdataset_decoding(out: Path) -> None:
    webdataset = pytest.importorskip("webdataset")
    manifest = parse_manifest((out / "manifest.json").read_bytes())
    urls = [str(out / s.path) for s in shards_of(manifest, "train")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = {s["__key__"]: s for s in webdataset.WebDataset(urls, shardshuffle=False, empty_check=False).decode()}
    ours = list(ShardDataset(out, "train", shuffle=False))
    assert sorted(s["__key__"] for s in ours) == sorted(theirs) and len(ours) == manifest["splits"]["train"]["samples"]
    for sample in ours:
        other = theirs[sample["__key__"]]
        assert sorted(sample) == sorted(k.split(".", 1)[0] for k in other if k not in ("__url__", "__local_path__"))
        for member, value in other.items():
            field = member.split(".", 1)[0]
            if member.endswith(".png"):  # webdataset's default decode() leaves images as bytes
                value = np.asarray(Image.open(io.BytesIO(value)).convert("RGB"))
            if isinstance(value, np.ndarray):
                got = sample[field]
                assert (got.dtype, got.shape) == (value.dtype, value.shape)
                assert got.tobytes() == value.tobytes()
            elif not member.startswith("__"):
                assert sample[field] == value, member


def test_real_shards_decode_through_learned_layouts(out: Path) -> None:
    """All but the first sample of each byte length (and the relearns when a text's size moves it to
    other blocks) decode through a layout."""
    manifest = parse_manifest((out / "manifest.json").read_bytes())
    total = matched = 0
    for shard in shards_of(manifest, "train"):
        decoder = SampleDecoder()
        offsets = read_local_index(out, shard).tolist()  # [samples + 1]
        with open(out / shard.path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            for i in range(shard.samples):
                start, stop = offsets[i], offsets[i + 1]
                sample = decoder.decode(mm, start, stop, shard.path, start)
                assert sample["joints"].shape[1] == 7
                del sample  # arrays view the mapping, which closes at the end of the block
        total += shard.samples
        matched += decoder.matched
        lengths = {offsets[i + 1] - offsets[i] for i in range(shard.samples)}
        assert decoder.matched >= shard.samples - 2 * len(lengths)
    assert matched > 0.8 * total
