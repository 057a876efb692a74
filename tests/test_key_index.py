"""`ShardIndex` by key through the split's key index (reader/keys.py, export/job/key_index.py):
exact positions past the key cache, a first lookup that reads one shard's offset index, not every
shard's, and the header scan kept for exports (or shards) the index does not cover."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import robowds.reader.index as index_module
import robowds.reader.keys as keys_module
from robowds.reader import ShardIndex
from robowds.reader.keys import KeyIndexError, encode_key_index, key_hashes
from tests.exports import export_synthetic


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 episodes cut into shards of at most 16 samples: ~15 shards of one split."""
    return export_synthetic(tmp_path_factory.mktemp("keys"), 3, 0, "--set", "exclude=[overview]",
                            "--set", "shard.max_samples=16")


def scanned_keys(out: Path) -> list[str]:
    """Every key of the split in position order, read from the tar headers (no key index)."""
    return [key for key, _ in ShardIndex(out, "train").positions()]


def test_export_writes_the_sorted_key_index(out: Path) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["files"]["keys.train"]
    keys = scanned_keys(out)
    assert entry["path"] == "train.keys"
    assert (entry["samples"], entry["shards"]) == (len(keys), len(manifest["splits"]["train"]["shards"]))
    data = (out / "train.keys").read_bytes()
    assert data == encode_key_index(key_hashes(keys))  # exact bytes: hashes sorted, then their positions
    hashes = np.frombuffer(data, "<u8")[:len(keys)]  # [N]
    assert (np.diff(hashes.astype(np.float64)) >= 0).all() and len(data) == entry["bytes"] == 16 * len(keys)


def test_lookups_past_the_cache_are_exact_and_read_one_shard_index(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_module, "KEY_CACHE_ENTRIES", 8)  # far fewer keys than the split has
    monkeypatch.setattr(keys_module, "KEY_BLOCK", 4)  # a binary search of several levels on a small split
    keys = scanned_keys(out)
    ds = ShardIndex(out, "train")
    last = len(keys) - 1  # in the last shard: a scan would read every shard's offset index first
    assert ds.position(keys[last]) == last
    source = ds._open[1]
    assert source.indexes_read == 1
    first_reads = ds._key_file[1].reads
    assert first_reads <= int(np.ceil(np.log2(len(keys) / 4))) + 3  # probes, one block, one run of positions
    for position in np.random.default_rng(0).permutation(len(keys)).tolist():
        assert ds.position(keys[position]) == position
    assert ds._cached_keys == 0  # no shard was scanned
    sample = ds.by_key(keys[5])
    assert sample["__key__"] == keys[5] and np.array_equal(sample["joints"], ds[5]["joints"])
    with pytest.raises(KeyError, match="no sample 'ep_9999_000000' in split 'train'"):
        ds.position("ep_9999_000000")


def test_exports_without_a_key_index_are_scanned_as_before(out: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """An export made before key indexes (no `keys.<split>` entry), and the shards past the ones an
    index covers (an append's), are found by their headers, past the key cache too."""
    monkeypatch.setattr(index_module, "KEY_CACHE_ENTRIES", 20)
    keys = scanned_keys(out)
    old = tmp_path / "old"
    shutil.copytree(out, old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["files"]["keys.train"]
    (old / "train.keys").unlink()
    (old / "manifest.json").write_text(json.dumps(manifest))
    ds = ShardIndex(old, "train")
    for position in np.random.default_rng(1).permutation(len(keys)).tolist():
        assert ds.position(keys[position]) == position
    assert ds._cached_keys <= 20 + 16

    partial = tmp_path / "partial"
    shutil.copytree(out, partial)
    manifest = json.loads((partial / "manifest.json").read_text())
    manifest["files"]["keys.train"]["shards"] = 2  # as if the later shards were appended after it
    (partial / "manifest.json").write_text(json.dumps(manifest))
    ds = ShardIndex(partial, "train")
    first = ds.dataset._first
    assert ds.position(keys[first[1]]) == first[1] and ds._cached_keys == 0  # covered: the index
    assert ds.position(keys[first[2]]) == first[2] and ds._cached_keys == ds.dataset.counts[2]  # scanned
    for position in range(len(keys)):
        assert ds.position(keys[position]) == position


def test_a_missing_or_truncated_key_index_is_one_error_naming_it(out: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    key = scanned_keys(out)[0]
    (broken / "train.keys").write_bytes((out / "train.keys").read_bytes()[:100])
    with pytest.raises(KeyIndexError, match=r"key index train.keys: .* \(truncated; .*fix: restore it"):
        ShardIndex(broken, "train").position(key)
    (broken / "train.keys").unlink()
    with pytest.raises(KeyIndexError, match=r"key index train.keys is missing .*fix: restore it"):
        ShardIndex(broken, "train").position(key)


def test_verify_refuses_a_changed_key_index(out: Path, tmp_path: Path) -> None:
    """The reader never hashes the whole index (its first lookup would grow with the export); verify does."""
    from robowds.export.check.verify import verify_export

    changed = tmp_path / "changed"
    shutil.copytree(out, changed)
    data = bytearray((out / "train.keys").read_bytes())
    data[8] ^= 1
    (changed / "train.keys").write_bytes(bytes(data))
    result = verify_export(changed, progress=False)
    assert not result.ok and "file train.keys: sha256 does not match the manifest" in result.failures
