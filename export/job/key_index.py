"""Each split's key index (`<split>.keys`, format in `reader/keys.py`), built from the shards' keys.

`write_shard` hands each shard's sample keys to `save_shard_hashes` (8 bytes a sample, into the work
folder's `keys/`, next to the shard records), and once every shard is written `key_index_files` sorts
each split's hashes into its index: a side file the manifest lists under `files` as `keys.<split>`,
published (or uploaded) with the others. A shard whose hashes the work folder lacks (written by an
earlier robowds, or uploaded by a run whose work folder was lost) has its keys read back from the
staged windows it holds, so the index never depends on how the job was resumed. Memory: 24 bytes a
sample of the split being indexed (`encode_key_index`). `export --append` writes the grown split's
index from the old one's hashes (`old_key_hashes`) and the new shards'; an old export without one
(or with one that does not match) gets none, and its keys are found by scanning headers
(`reader/index.py`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from robowds.export.job.stage import episode_paths
from robowds.export.output.fsio import fsync_write
from robowds.reader.format import MAX_NAME_BYTES
from robowds.reader.keys import FILES_PREFIX, KEY_INDEX_DTYPE, encode_key_index, key_hashes, key_index_path

KEYS_DIR = "keys"  # in the work folder: `<split>__shard-NNNNNN.tar.keys`, [samples] uint64 key hashes


def _hashes_path(work: Path, shard_path: str) -> Path:
    return Path(work) / KEYS_DIR / (shard_path.replace("/", "__") + ".keys")


def save_shard_hashes(work: Path, shard_path: str, keys: Iterable[str]) -> None:
    """Keep the key hashes of one shard's samples, in sample order, for `key_index_files`."""
    target = _hashes_path(work, shard_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fsync_write(target, key_hashes(keys).astype(KEY_INDEX_DTYPE).tobytes())


def _shard_keys_from_staging(work: Path, entries: np.ndarray) -> list[str]:
    """A shard's keys read back from the staged windows it was written from (the first header's name
    of each: one 100-byte read a sample), for a shard written before the work folder had its hashes
    (OUT at a URL resumed with a new work folder: its uploaded shards are not written again)."""
    handles: dict[int, int] = {}
    try:
        keys = []
        for ep_index, offset, _ in entries.tolist():  # [S, 3]: episode index, offset in its staging file, size
            if ep_index not in handles:
                handles[ep_index] = os.open(episode_paths(work, ep_index)[0], os.O_RDONLY)
            header = os.pread(handles[ep_index], MAX_NAME_BYTES, offset)
            keys.append(header.split(b"\0", 1)[0].split(b".", 1)[0].decode("utf-8"))
        return keys
    finally:
        for fd in handles.values():
            os.close(fd)


def old_key_hashes(read: Callable[[str], bytes | None], manifest: dict[str, Any]) -> dict[str, np.ndarray]:
    """Per split of an append's old export (`read(rel)`: a file of it, None if absent; a folder's or a
    URL's, `append_out.AppendOut.read`), its samples' key hashes in position
    order ([samples] uint64), from its key index where that covers all the split's shards and its
    sha256 is the manifest's; a split without such an index is left out (its appended export gets
    none: lookups scan headers). Reads each index whole, once: 16 bytes a sample."""
    found: dict[str, np.ndarray] = {}
    for split, entry in manifest["splits"].items():
        listed = manifest.get("files", {}).get(FILES_PREFIX + split)
        if listed is None or listed.get("shards") != len(entry["shards"]):
            continue
        data = read(listed["path"]) or b""
        samples = int(listed.get("samples", -1))
        if hashlib.sha256(data).hexdigest() != listed["sha256"] or len(data) != 2 * KEY_INDEX_DTYPE.itemsize * samples:
            continue
        table = np.frombuffer(data, dtype=KEY_INDEX_DTYPE)  # [2 * samples]: sorted hashes, their positions
        hashes = np.empty(samples, dtype=KEY_INDEX_DTYPE)
        hashes[table[samples:].astype(np.int64)] = table[:samples]
        found[split] = hashes
    return found


def key_index_files(work: Path, manifest: dict[str, Any], entries: Mapping[str, np.ndarray],
                    before: Mapping[str, np.ndarray] | None = None,
                    ) -> tuple[dict[str, bytes], dict[str, dict[str, Any]]]:
    """(path -> bytes, `files` entries) of every split's key index, covering all its shards: for the
    shards this job wrote (`entries`: shard path -> its `ShardTask.entries`), the hashes `write_shard`
    saved, else their keys read from the staged windows `entries` say they hold; for the shards an
    earlier job wrote (an append's old shards), `before` (split -> their hashes in position order,
    `old_key_hashes`). A split whose old shards' hashes are not there gets no index."""
    data: dict[str, bytes] = {}
    listed: dict[str, dict[str, Any]] = {}
    for split, entry in sorted(manifest["splits"].items()):
        old = (before or {}).get(split, np.zeros(0, KEY_INDEX_DTYPE))
        parts, taken = [], 0
        for shard in entry["shards"]:
            if shard["path"] not in entries:  # written by an earlier job: its hashes from that job's index
                if taken + shard["samples"] > len(old):
                    break
                parts.append(old[taken:taken + shard["samples"]])
                taken += shard["samples"]
                continue
            path = _hashes_path(work, shard["path"])
            part = np.fromfile(path, dtype=KEY_INDEX_DTYPE) if path.is_file() else None  # [samples]
            if part is None or len(part) != shard["samples"]:
                part = key_hashes(_shard_keys_from_staging(work, entries[shard["path"]]))
            parts.append(part)
        else:
            blob = encode_key_index(np.concatenate([np.zeros(0, KEY_INDEX_DTYPE), *parts]))
            rel = key_index_path(split)
            data[rel] = blob
            listed[FILES_PREFIX + split] = {"path": rel, "bytes": len(blob),
                                            "sha256": hashlib.sha256(blob).hexdigest(),
                                            "samples": sum(len(p) for p in parts), "shards": len(parts)}
    return data, listed
