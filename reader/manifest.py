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

from reader.format import END_OF_ARCHIVE

FORMAT = "robowds-manifest"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"


class ManifestError(ValueError):
    """A manifest that cannot be used (wrong format, version, or a path escaping its root)."""


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
    try:
        entries = manifest["splits"][split]["shards"]
    except KeyError as exc:
        have = ", ".join(sorted(manifest.get("splits", {})))
        raise ManifestError(f"manifest has no split {split!r} (it has: {have})") from exc
    return [ShardInfo(safe_relative(e["path"]), int(e["samples"]), int(e["bytes"]), str(e["sha256"]),
                      tuple(int(o) for o in e["offsets"])) for e in entries]


def parse_manifest(text: str | bytes, where: str = MANIFEST_NAME) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{where} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ManifestError(f"{where} is not a robowds manifest")
    if doc.get("format_version") != FORMAT_VERSION:
        raise ManifestError(f"{where} has format_version {doc.get('format_version')!r}; "
                            f"this robowds reads version {FORMAT_VERSION}")
    for split in doc.get("splits", {}):
        shards_of(doc, split)  # path safety and types, up front
    return doc


def dump_manifest(doc: dict[str, Any]) -> bytes:
    """Canonical bytes: sorted keys, compact separators, trailing newline (byte-reproducible)."""
    return (json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
            + "\n").encode()
