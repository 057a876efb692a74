"""Samples whose member set differs from the manifest schema are one ShardReadError naming shard, key
and byte offset (and `on_error="skip"` skips them); verify=True hashes a corrupt shard once.

Real exports, real tars rewritten with the shard format's own encoder, real ShardLoader."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import robowds.reader.dataset
from robowds.reader import ShardDataset, ShardLoader
from robowds.reader.format import (END_OF_ARCHIVE, ShardFormatError, encode_npy, encode_sample, group_samples,
                                   iter_members)
from robowds.reader.layout import SampleDecoder
from robowds.reader.members import MemberSet
from robowds.reader.source import ShardReadError, ShardSource

from exports import export_synthetic
from offsets import rewrite_index, shard_offsets

Members = dict[str, bytes]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the image field stays in: its member is `overview.<png|jpg|webp|bmp>` in the schema
    return export_synthetic(tmp_path_factory.mktemp("integrity"), 3, 2, "--stride", "3",
                            "--set", "shard.max_samples=20")


@pytest.fixture()
def copy(exported: Path, tmp_path: Path) -> Path:
    shutil.copytree(exported, tmp_path / "out")
    return tmp_path / "out"


def rewrite_sample(out: Path, shard_index: int, sample_index: int,
                   change: Callable[[Members], Members]) -> tuple[str, str, int]:
    """Re-encode one sample of a shard with `change` applied to its members and rewrite the shard and
    its index and manifest entry (offsets, bytes, sha256s, the split's bytes) to match: the manifest is consistent, the sample is not.
    Returns (shard path, key, byte offset of the sample)."""
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["splits"]["train"]["shards"][shard_index]
    data = (out / entry["path"]).read_bytes()
    samples = [(key, {s: bytes(d) for s, d in members.items()}) for key, _, members in group_samples(iter_members(data))]
    key, members = samples[sample_index]
    samples[sample_index] = (key, change(members))
    blobs = [encode_sample(k, m) for k, m in samples]
    offsets = [sum(len(b) for b in blobs[:i]) for i in range(len(blobs))]
    shard = b"".join(blobs) + END_OF_ARCHIVE
    (out / entry["path"]).write_bytes(shard)
    manifest["splits"]["train"]["bytes"] += len(shard) - entry["bytes"]
    entry.update(bytes=len(shard), sha256=hashlib.sha256(shard).hexdigest())
    rewrite_index(out, entry, offsets)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return entry["path"], key, offsets[sample_index]


def keys_of(out: Path, **kwargs: object) -> list[str]:
    return [s["__key__"] for s in ShardDataset(out, "train", shuffle=False, **kwargs)]


@pytest.mark.parametrize("change, problem", [
    (lambda m: {**m, "x.pickle": b"\x80\x04K\x01."}, r"unexpected \['x.pickle'\]"),
    (lambda m: {s: d for s, d in m.items() if s != "task.txt"}, r"missing \['task.txt'\]"),
    (lambda m: {("overview.gif" if s.startswith("overview.") else s): d for s, d in m.items()},
     r"missing \['overview.<png\|jpg\|webp\|bmp>'\], unexpected \['overview.gif'\]"),
])
def test_foreign_or_missing_member_is_a_shard_read_error(copy: Path, exported: Path, change: Callable[[Members], Members],
                                                         problem: str) -> None:
    path, key, offset = rewrite_sample(copy, 1, 4, change)  # sample 4: its neighbours teach the layout
    with pytest.raises(ShardReadError, match=rf"^shard {path}: byte {offset}: sample '{key}': "
                                             rf"members do not match the manifest schema: {problem}$"):
        keys_of(copy)
    good = keys_of(exported)
    assert keys_of(copy, on_error="skip") == [k for k in good if k != key]
    for workers in (0, 2):  # skipped before collate, which used to raise a bare ValueError
        loader = ShardLoader(ShardDataset(copy, "train", seed=3, on_error="skip"), batch_size=4, num_workers=workers)
        batches = [b["__key__"] for b in loader]
        reference = [b["__key__"] for b in ShardLoader(ShardDataset(exported, "train", seed=3), batch_size=4)]
        assert loader.skipped == 1 and len(batches) == len(reference)
        assert [k for b in batches for k in b] == [k for b in reference for k in b if k != key]


def test_manifest_bytes_smaller_than_the_shard_is_caught(copy: Path) -> None:
    """The last sample ends at `bytes - 1024`: 1024 bytes too few cut its last member (task.txt, one
    header and one data block) off, and nothing else notices (the tar walk ends cleanly)."""
    manifest = json.loads((copy / "manifest.json").read_text())
    entry = manifest["splits"]["train"]["shards"][0]
    entry["bytes"] -= 1024
    manifest["splits"]["train"]["bytes"] -= 1024  # the manifest agrees with itself, not with the file
    offsets = shard_offsets(copy, entry)
    rewrite_index(copy, entry, offsets)  # ... and with its index, whose end moves with `bytes`
    (copy / "manifest.json").write_text(json.dumps(manifest))
    key = list(group_samples(iter_members((copy / entry["path"]).read_bytes())))[-1][0]
    with pytest.raises(ShardReadError, match=rf"^shard {entry['path']}: byte {offsets[-1]}: sample '{key}': "
                                             r"members do not match the manifest schema: missing \['task.txt'\]$"):
        keys_of(copy)


def test_member_set_from_schema(exported: Path) -> None:
    schema = json.loads((exported / "manifest.json").read_text())["schema"]
    members = MemberSet.from_schema(schema)
    assert members.choices == (frozenset({"overview.png", "overview.jpg", "overview.webp", "overview.bmp"}),)
    assert "task.txt" in members.fixed and "joints_mask.npy" in members.fixed and "meta.json" in members.fixed
    every = set(members.fixed)
    assert members.problem(every | {"overview.jpg"}) is None
    assert members.problem(every | {"overview.jpg", "overview.png"}) == (
        "members do not match the manifest schema: unexpected ['overview.jpg', 'overview.png']")


def test_verify_hashes_a_corrupt_shard_once(copy: Path, exported: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verify=True, on_error="skip": every sample of a corrupt shard is skipped and the shard is hashed
    once (it was hashed again for every one of its samples: 6 samples/s on a 241 MB shard)."""
    manifest = json.loads((copy / "manifest.json").read_text())
    shards = manifest["splits"]["train"]["shards"]
    path = copy / shards[1]["path"]
    data = bytearray(path.read_bytes())
    data[shard_offsets(copy, shards[1])[2] + 512 + 200] ^= 0x01  # inside a payload: still a valid tar
    path.write_bytes(bytes(data))
    bad_keys = {k for k, _, _ in group_samples(iter_members(bytes(data)))}
    reference = [k for b in ShardLoader(ShardDataset(exported, "train", seed=1), batch_size=4) for k in b["__key__"]]
    sources: list[ShardSource] = []

    class CountingSource(ShardSource):  # the real source; only remembers that it was made
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            sources.append(self)

    monkeypatch.setattr(robowds.reader.dataset, "ShardSource", CountingSource)
    loader = ShardLoader(ShardDataset(copy, "train", seed=1, verify=True, on_error="skip"), batch_size=4)
    keys = [k for b in loader for k in b["__key__"]]
    assert loader.skipped == len(bad_keys) == shards[1]["samples"]
    assert keys == [k for k in reference if k not in bad_keys]
    assert len(sources) == 1 and sources[0].hashed == len(shards)  # every shard hashed once, the corrupt one too


def test_a_learned_layout_does_not_let_a_renamed_member_through() -> None:
    """A sample of the same length as a learned layout but with another member name misses the layout
    (its header bytes differ) and the checked walk refuses its member set."""
    members = MemberSet(frozenset({"joints.npy", "task.txt"}), ())
    decoder = SampleDecoder(members)
    good = [encode_sample(f"k{i}", {"joints.npy": encode_npy(np.full((10, 7), i, np.float32)), "task.txt": b"pick"})
            for i in range(2)]
    renamed = encode_sample("k2", {"joints.npy": encode_npy(np.zeros((10, 7), np.float32)), "tusk.txt": b"pick"})
    assert len(renamed) == len(good[0])
    for blob in good:
        assert decoder.decode(blob, 0, len(blob), "shard s.tar", 0)["task"] == "pick"
    assert decoder.matched == 1  # the second sample came through the learned layout
    with pytest.raises(ShardFormatError, match=r"^shard s.tar: byte 0: sample 'k2': members do not match the manifest "
                                               r"schema: missing \['task.txt'\], unexpected \['tusk.txt'\]$"):
        decoder.decode(renamed, 0, len(renamed), "shard s.tar", 0)
