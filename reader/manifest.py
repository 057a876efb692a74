"""The manifest schema (`manifest.json`): written by export, read by the reader and by verify.

```
{
  "format": "robowds-manifest", "format_version": 1, "tool_version": "0.1.0",
  "source": {"fingerprint": sha256, "episodes": int},
  "config": {...resolved export config...},
  "schema": {field: {"kind", "dtype", "shape", "member", "mask_member"?, "rate_hz"?, "duration_s"?,
                     "offset_s"?, "pad"?, "interpolation"?, "names"?, "units"?, "encoding"?}},
  "splits": {split: {"episodes": [...], "samples": int, "bytes": int,
                     "shards": [{"path", "samples", "bytes", "sha256", "offsets": [int, ...]}]}},
  "stats": {split: {field: {"count", "mean", "std", "min", "max", "q01", "q99"}}},
  "report": {...}
}
```
`offsets[i]` is the byte offset of sample i's first tar header; sample i ends where sample i+1 starts,
the last one at `bytes - 1024` (the end-of-archive blocks).
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any

import numpy as np

from robowds.reader.format import BLOCK, END_OF_ARCHIVE

FORMAT = "robowds-manifest"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"


class ManifestError(ValueError):
    """A manifest that cannot be used (wrong format, version, a missing or malformed entry, a path
    escaping its root); the message names the split, shard and key."""


@dataclass(frozen=True)
class ShardInfo:
    path: str  # relative to the manifest's folder, POSIX separators
    samples: int
    bytes: int
    sha256: str
    offsets: tuple[int, ...]

    def sample_span(self, index: int) -> tuple[int, int]:
        """[start, stop) byte range of sample `index` in the shard."""
        stop = self.offsets[index + 1] if index + 1 < self.samples else self.bytes - len(END_OF_ARCHIVE)
        return self.offsets[index], stop


def safe_relative(path: str) -> str:
    """Refuse shard paths that could leave the dataset root (absolute, `..`, URLs, backslashes)."""
    norm = posixpath.normpath(path)
    if (not path or path.startswith("/") or "\\" in path or ":" in path
            or norm.startswith("..") or norm != path):
        raise ManifestError(f"shard path {path!r} must be a plain relative path inside the dataset folder")
    return norm


def shards_of(manifest: dict[str, Any], split: str) -> list[ShardInfo]:
    """The shards of `split` of a manifest that `validate_manifest` accepted (`parse_manifest` does)."""
    try:
        entries = manifest["splits"][split]["shards"]
    except KeyError as exc:
        have = ", ".join(sorted(manifest.get("splits", {})))
        raise ManifestError(f"manifest has no split {split!r} (it has: {have})") from exc
    # offsets are ints already (validated): tuple() copies the list in C, ~5 ns per sample
    return [ShardInfo(safe_relative(e["path"]), e["samples"], e["bytes"], e["sha256"], tuple(e["offsets"]))
            for e in entries]


def parse_manifest(text: str | bytes, where: str = MANIFEST_NAME) -> dict[str, Any]:
    """The manifest in `text`, validated (`validate_manifest`): every reader of a manifest goes through
    here, so a damaged one is one `ManifestError` naming what is wrong, never a KeyError later."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{where} is not valid JSON: {exc}") from exc
    validate_manifest(doc, where)
    return doc


_SHA256_HEX = frozenset("0123456789abcdef")
_SHARD_KEYS = {"path": str, "samples": int, "bytes": int, "sha256": str, "offsets": list}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _expect(container: Any, key: str, kind: type, where: str) -> Any:
    """container[key], which must exist and be of `kind` (a JSON bool is not an int)."""
    if not isinstance(container, dict):
        raise ManifestError(f"{where}: must be a JSON object, got {type(container).__name__}")
    if key not in container:
        raise ManifestError(f"{where}: {key!r} is missing")
    value = container[key]
    if not (_is_int(value) if kind is int else isinstance(value, kind)):
        wanted = "an integer" if kind is int else f"a JSON {_JSON_NAMES[kind]}"
        raise ManifestError(f"{where}: {key!r} must be {wanted}, got {json.dumps(value)[:60]}")
    return value


_JSON_NAMES = {str: "string", list: "list", dict: "object", int: "integer"}


def validate_manifest(doc: Any, where: str = MANIFEST_NAME) -> None:
    """Refuse a manifest the reader, verify or export could not use as written, with a message naming
    the split, the shard, the key and what is wrong. Checks: format and version; a `schema` object
    whose fields name their `member` (and `mask_member`); per split a `shards` list whose `samples`
    and `bytes` add up to the split's; per shard `path` (relative, inside the dataset folder, listed once),
    `samples` >= 0, `bytes`, a sha256 hex `sha256`, and `offsets`: `samples` integers, the first 0,
    strictly increasing, multiples of 512 (tar blocks), the last leaving room for one tar header and
    the end-of-archive blocks before `bytes`.

    Cost: O(fields + shards) in Python plus one numpy pass over each shard's offsets (~0.15 s for a
    10M-sample manifest, whose json.loads takes 1.0 s); it allocates one array per shard at a
    time, freed before the next."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ManifestError(f"{where} is not a robowds manifest")
    if doc.get("format_version") != FORMAT_VERSION:
        raise ManifestError(f"{where} has format_version {doc.get('format_version')!r}; "
                            f"this robowds reads version {FORMAT_VERSION}")
    schema = _expect(doc, "schema", dict, where)
    for name, spec in schema.items():
        at = f"{where}: schema field {name!r}"
        _expect(spec, "kind", str, at)
        _expect(spec, "member", str, at)
        if "mask_member" in spec:
            _expect(spec, "mask_member", str, at)
    splits = _expect(doc, "splits", dict, where)
    paths: dict[str, str] = {}  # shard path -> the split listing it: O(shards)
    for split, entry in splits.items():
        at = f"{where}: split {split!r}"
        shards = _expect(entry, "shards", list, at)
        total = size = 0
        for index, shard in enumerate(shards):
            _check_shard(shard, f"{at}, shard {index}" + (f" ({shard['path']})" if isinstance(shard, dict)
                                                           and isinstance(shard.get("path"), str) else ""))
            if shard["path"] in paths:
                raise ManifestError(f"{at}, shard {index}: path {shard['path']!r} is already listed "
                                    f"(split {paths[shard['path']]!r})")
            paths[shard["path"]] = split
            total += shard["samples"]
            size += shard["bytes"]
        for key, value in (("samples", total), ("bytes", size)):
            if key in entry and _expect(entry, key, int, at) != value:
                raise ManifestError(f"{at}: {key!r} is {entry[key]}, its shards hold {value}")


def _check_shard(shard: Any, at: str) -> None:
    for key, kind in _SHARD_KEYS.items():
        _expect(shard, key, kind, at)
    try:
        safe_relative(shard["path"])
    except ManifestError as exc:
        raise ManifestError(f"{at}: {exc}") from None
    samples, size, digest = shard["samples"], shard["bytes"], shard["sha256"]
    if samples < 0:
        raise ManifestError(f"{at}: 'samples' must be >= 0, got {samples}")
    if len(digest) != 64 or not _SHA256_HEX.issuperset(digest):
        raise ManifestError(f"{at}: 'sha256' must be 64 lowercase hex digits, got {digest[:80]!r}")
    offsets = shard["offsets"]
    if len(offsets) != samples:
        raise ManifestError(f"{at}: 'offsets' has {len(offsets)} entries, 'samples' says {samples}")
    if size < len(END_OF_ARCHIVE) or size % BLOCK:
        raise ManifestError(f"{at}: 'bytes' must be a multiple of {BLOCK} and >= {len(END_OF_ARCHIVE)} "
                            f"(the end-of-archive blocks), got {size}")
    if not samples:
        return
    try:
        array = np.asarray(offsets)  # [samples]
    except (OverflowError, ValueError, TypeError):
        array = np.asarray(offsets, dtype=object)
    if array.ndim != 1 or array.dtype.kind != "i" or isinstance(offsets[0], bool):  # "i": fits int64
        bad = [o for o in offsets if not _is_int(o)][:1]  # a Python pass, on the error path only
        raise ManifestError(f"{at}: 'offsets' must be integers, got {json.dumps(bad[0])[:60]}" if bad
                            else f"{at}: 'offsets' must be integers below 2**63")
    if array[0] != 0:
        raise ManifestError(f"{at}: 'offsets' must start at 0 (the first sample), got {int(array[0])}")
    steps = np.diff(array)  # [samples - 1]
    if len(steps) and steps.min() <= 0:
        i = int(np.argmax(steps <= 0)) + 1
        raise ManifestError(f"{at}: 'offsets' must increase, offset {i} is {int(array[i])} after {int(array[i - 1])}")
    unaligned = array % BLOCK != 0
    if unaligned.any():
        i = int(np.argmax(unaligned))
        raise ManifestError(f"{at}: offset {i} ({int(array[i])}) is not a multiple of {BLOCK} (tar blocks)")
    last = int(array[-1])
    if last + BLOCK > size - len(END_OF_ARCHIVE):
        raise ManifestError(f"{at}: 'bytes' is {size}, too small for the last sample at offset {last} "
                            f"(one {BLOCK}-byte header and the {len(END_OF_ARCHIVE)} end-of-archive bytes)")


def dump_manifest(doc: dict[str, Any]) -> bytes:
    """Canonical bytes: sorted keys, compact separators, trailing newline (byte-reproducible)."""
    return (json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
            + "\n").encode()
