"""Sample byte offsets of exported shards, as the tests need them: since manifest version 2 they live
in `<shard>.idx` next to each shard (version 1 kept them inline in the manifest)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from robowds.reader.manifest import INDEX_SUFFIX, encode_index


def shard_offsets(out: Path, entry: dict[str, Any]) -> list[int]:
    """Where each sample of the shard whose manifest entry is `entry` starts: [samples]."""
    if "offsets" in entry:
        return list(entry["offsets"])
    index = np.frombuffer((Path(out) / (entry["path"] + INDEX_SUFFIX)).read_bytes(), dtype="<u8")
    return [int(v) for v in index[:-1]]


def rewrite_index(out: Path, entry: dict[str, Any], offsets: list[int]) -> None:
    """Write the shard's index for `offsets` (its end from `entry["bytes"]`) and its sha256 into `entry`."""
    data = encode_index(offsets, entry["bytes"] - 1024)
    (Path(out) / (entry["path"] + INDEX_SUFFIX)).write_bytes(data)
    entry["index_sha256"] = hashlib.sha256(data).hexdigest()


def downgrade_to_v1(out: Path) -> dict[str, Any]:
    """Turn the version 2 export in `out` into what a version 1 export looked like: offsets inline in
    manifest.json, no `.idx` files. Returns the new manifest."""
    path = Path(out) / "manifest.json"
    doc = json.loads(path.read_text())
    for split in doc["splits"].values():
        for entry in split["shards"]:
            entry["offsets"] = shard_offsets(out, entry)
            del entry["index_sha256"]
            (Path(out) / (entry["path"] + INDEX_SUFFIX)).unlink()
    doc["format_version"] = 1
    path.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")
    return doc
