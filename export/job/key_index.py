"""Each split's key index (`<split>.keys`, format in `reader/keys.py`), built from the shards' keys.

`write_shard` hands each shard's sample keys to `save_shard_hashes` (8 bytes a sample, into the work
folder's `keys/`, next to the shard records), and once every shard is written `key_index_files` sorts
each split's hashes into its index: a side file the manifest lists under `files` as `keys.<split>`,
published (or uploaded) with the others. A split missing a shard's hashes (its shard was written by
an earlier robowds into the same work folder) gets no index; `ShardIndex` then finds keys by scanning
the shards' headers, as for exports made before key indexes. Memory: 24 bytes a sample of the split
being indexed (`encode_key_index`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from robowds.export.output.fsio import fsync_write
from robowds.reader.keys import FILES_PREFIX, KEY_INDEX_DTYPE, encode_key_index, key_hashes, key_index_path

KEYS_DIR = "keys"  # in the work folder: `<split>__shard-NNNNNN.tar.keys`, [samples] uint64 key hashes


def _hashes_path(work: Path, shard_path: str) -> Path:
    return Path(work) / KEYS_DIR / (shard_path.replace("/", "__") + ".keys")


def save_shard_hashes(work: Path, shard_path: str, keys: Iterable[str]) -> None:
    """Keep the key hashes of one shard's samples, in sample order, for `key_index_files`."""
    target = _hashes_path(work, shard_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fsync_write(target, key_hashes(keys).astype(KEY_INDEX_DTYPE).tobytes())


def key_index_files(work: Path, manifest: dict[str, Any]) -> tuple[dict[str, bytes], dict[str, dict[str, Any]]]:
    """(path -> bytes, `files` entries) of the key index of every split whose shards' hashes are all
    in `work`; each covers all the split's shards."""
    data: dict[str, bytes] = {}
    listed: dict[str, dict[str, Any]] = {}
    for split, entry in sorted(manifest["splits"].items()):
        parts = []
        for shard in entry["shards"]:
            path = _hashes_path(work, shard["path"])
            part = np.fromfile(path, dtype=KEY_INDEX_DTYPE) if path.is_file() else None  # [samples]
            if part is None or len(part) != shard["samples"]:
                break
            parts.append(part)
        else:
            blob = encode_key_index(np.concatenate([np.zeros(0, KEY_INDEX_DTYPE), *parts]))
            rel = key_index_path(split)
            data[rel] = blob
            listed[FILES_PREFIX + split] = {"path": rel, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest(),
                                            "samples": sum(len(p) for p in parts), "shards": len(parts)}
    return data, listed
