"""The manifest schema (`manifest.json`) and the per-shard offset index (`<shard>.idx`): written by
export, read by the reader and by verify.

```
{
  "format": "robowds-manifest", "format_version": 2, "tool_version": "0.1.0", "plan_version": 2,
  "job_id": sha256, "generation": int,
  "generations": [{"generation": int, "job_id": sha256, "shards": {split: int}}],
  "source": {"fingerprint": sha256, "episodes": int},
  "config": {...resolved export config...},
  "schema": {field: {"kind", "dtype", "shape", "member", "mask_member"?, "rate_hz"?, "duration_s"?,
                     "offset_s"?, "pad"?, "interpolation"?, "names"?, "units"?, "encoding"?}},
  "splits": {split: {"episodes": [...], "samples": int, "bytes": int, "layout"?: "npz",
                     "shards": [{"path", "samples", "bytes", "sha256", "index_sha256"}]}},
  "stats": {split: {field: {"count", "mean", "std", "min", "max", "q01", "q99"},
                    "<action>.relative"?: {...the same keys..., "relative_to": {"state", "dims", "state_dims",
                                                                               "anchor"}}}},
  "files"?: {"episodes" | "stats_state" | "episode_facts" | "keys.<split>": {"path", "bytes", "sha256", ...}},
  "report": {...}
}
```
`files` lists the export's side files (`export/job/side_files.py`: per-episode identity and the
mergeable statistics state, for `export --append` and `verify`; the per-episode facts for `robowds
report`); readers never read them, so the
key is optional (exports before it lack it) and adding it kept the format version. `keys.<split>` is a
split's key index (`reader/keys.py`, with `samples` and `shards`), which `ShardIndex` reads by range.

`generation` counts the jobs that wrote the export: 1 for a full export, one more for each
`export --append`. `generations` has one entry per generation, oldest first: the job that wrote it
and, per split, how many shards the split has once that job is published. Appends only add shards
(numbered on), so generation g's shards of a split are `shards[before:after]`, `before` the previous
entry's count (0 where the split is absent), `after` g's; a cursor saved at generation g resumes over
the first `after` shards, and `verify --since g` checks only those after them. The list grows by one
entry per append, never per shard or sample. Exports before the key (and readers that ignore it)
are generation 1 with all their shards; adding it kept the format version.

`plan_version` (absent before 2) says how the export drew each episode's split and key prefix
(`export/core/shard_plan.PLAN_VERSION`); the reader does not need it.

Per-sample byte offsets live next to each shard, in `<path>.idx` (for `train/shard-000000.tar`:
`train/shard-000000.tar.idx`), Megatron-Energon's tar index layout: `samples + 1` little-endian
uint64, entry i the byte offset of sample i's first tar header, the last one the end of the last
sample (`bytes - 1024`, where the end-of-archive blocks start); sample i is [idx[i], idx[i + 1]).
`index_sha256` is that file's sha256: the reader reads an index only when it first reads from its
shard, and refuses one that does not match (`decode_index`). So the manifest holds O(shards) bytes
(~230 per shard), never O(samples): at 100M samples the inline offsets of version 1 were ~1 GB of JSON
that every rank and worker parsed at start.

A split's `layout` (version 3, written only when it is not `members`) says how its samples' members
are laid out: `npz` packs every `.npy` member into one `arrays.npz` (`reader/npz.py`). Version 2 and
1 manifests, and version 3 splits without the key, are `members`.

Version 1 manifests (offsets inline: `"offsets": [int, ...]` per shard, `samples` entries, no
`.idx` files) still read: `ShardInfo.offsets` holds them and `shard_index` serves them the same way.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from robowds.reader.format import BLOCK, END_OF_ARCHIVE
from robowds.reader.npz import LAYOUTS

FORMAT = "robowds-manifest"
FORMAT_VERSION = 2  # written for `members` exports; 1 (inline offsets) is still read
LAYOUT_VERSION = 3  # written when a split's `layout` is not `members` (so older readers refuse it cleanly)
READ_VERSIONS = (1, 2, 3)
MANIFEST_NAME = "manifest.json"
INDEX_SUFFIX = ".idx"  # `<shard>.tar.idx`, as Megatron-Energon names its tar indexes
INDEX_DTYPE = np.dtype("<u8")


class ManifestError(ValueError):
    """A manifest that cannot be used (wrong format, version, a missing or malformed entry, a path
    escaping its root); the message names the split, shard and key."""


class ShardIndexError(ManifestError):
    """A shard's offset index (`<shard>.idx`) that is missing or not the one the manifest lists; the
    message is `problem; fix: fix`, both kept apart for the CLI's what/fix messages."""

    def __init__(self, problem: str, fix: str = "") -> None:
        super().__init__(f"{problem}; fix: {fix}" if fix else problem)
        self.problem, self.fix = problem, fix

    def __reduce__(self) -> tuple[Any, ...]:  # pickled with both parts (DataLoader workers, processes)
        return type(self), (self.problem, self.fix)


def _index_fix(shard: "ShardInfo") -> str:
    """The fix for any index problem: the index is derived data, so the export's own copy is right."""
    return f"restore {shard.index_path} from the export it came with (export writes it next to the shard), or export again"


@dataclass(frozen=True)
class ShardInfo:
    path: str  # relative to the manifest's folder, POSIX separators
    samples: int
    bytes: int
    sha256: str
    index_sha256: str | None = None  # version 2: sha256 of the `<path>.idx` file
    offsets: tuple[int, ...] | None = None  # version 1: the offsets, inline in the manifest

    @property
    def index_path(self) -> str:
        """The offset index next to the shard, relative like `path` (only version 2 has one)."""
        return self.path + INDEX_SUFFIX

    @property
    def end(self) -> int:
        """Where the last sample ends: the start of the end-of-archive blocks."""
        return self.bytes - len(END_OF_ARCHIVE)

    def inline_index(self) -> np.ndarray | None:
        """A version 1 shard's index from its inline offsets ([samples + 1] int64), else None."""
        if self.offsets is None:
            return None
        return np.asarray([*self.offsets, self.end], dtype=np.int64)


def encode_index(offsets: Sequence[int], end: int) -> bytes:
    """The `<shard>.idx` bytes for samples starting at `offsets` [samples] and ending at `end`."""
    return np.asarray([*offsets, end], dtype=INDEX_DTYPE).tobytes()


def _index_problem(index: np.ndarray, shard: ShardInfo) -> str | None:
    """What is wrong with an index [samples + 1] of `shard` (None: nothing): entries, first 0, strictly
    increasing by at least one tar header, multiples of 512, the last at the end-of-archive blocks."""
    if len(index) != shard.samples + 1:
        return f"it holds {len(index)} entries, the shard has {shard.samples} samples (+1 for the end)"
    if index[0] != (0 if shard.samples else shard.end):
        return f"its first entry is {int(index[0])}, not 0 (the first sample)"
    steps = np.diff(index)  # [samples]
    if len(steps) and steps.min() < BLOCK:
        i = int(np.argmax(steps < BLOCK))
        return f"entry {i + 1} ({int(index[i + 1])}) leaves no tar header after entry {i} ({int(index[i])})"
    unaligned = index % BLOCK != 0
    if unaligned.any():
        i = int(np.argmax(unaligned))
        return f"entry {i} ({int(index[i])}) is not a multiple of {BLOCK} (tar blocks)"
    if int(index[-1]) != shard.end:
        return f"its last entry is {int(index[-1])}, the shard's samples end at {shard.end} ('bytes' - 1024)"
    return None


def decode_index(shard: ShardInfo, data: bytes) -> np.ndarray:
    """The checked offset index of `shard` from the bytes of its `.idx` file: [samples + 1] int64.

    Refuses (one `ShardIndexError` naming shard, file and fix) bytes whose sha256 is not the manifest's
    `index_sha256`, then anything `_index_problem` finds (an index whose hash matches a damaged manifest)."""
    where = f"shard {shard.path}: index {shard.index_path}"
    if hashlib.sha256(data).hexdigest() != shard.index_sha256:
        raise ShardIndexError(f"{where}: sha256 does not match the manifest's index_sha256 (changed, truncated "
                              "or replaced since the export)", _index_fix(shard))
    if len(data) % INDEX_DTYPE.itemsize:
        raise ShardIndexError(f"{where}: {len(data)} bytes is not a whole number of uint64 entries",
                              _index_fix(shard))
    index = np.frombuffer(data, dtype=INDEX_DTYPE)  # [samples + 1] uint64
    problem = _index_problem(index.astype(np.int64), shard) if (index < 2**63).all() else "an entry is 2**63 or more"
    if problem:
        raise ShardIndexError(f"{where}: {problem}", _index_fix(shard))
    return index.astype(np.int64)


def shard_index(shard: ShardInfo, read: Callable[[str], bytes]) -> np.ndarray:
    """The offsets of `shard` ([samples + 1] int64): inline (version 1) or `read(index_path)`'s bytes,
    checked (version 2). `read` raises OSError (or its own error) when the file cannot be read."""
    inline = shard.inline_index()
    if inline is not None:
        return inline
    try:
        data = read(shard.index_path)
    except FileNotFoundError as exc:
        raise ShardIndexError(f"shard {shard.path}: index {shard.index_path} is missing", _index_fix(shard)) from exc
    return decode_index(shard, data)


def read_local_index(root: str | Path, shard: ShardInfo) -> np.ndarray:
    """`shard_index` of a shard under the local folder `root`: [samples + 1] int64."""
    return shard_index(shard, lambda rel: (Path(root) / rel).read_bytes())


def safe_relative(path: str) -> str:
    """Refuse shard paths that could leave the dataset root (absolute, `..`, URLs, backslashes)."""
    norm = posixpath.normpath(path)
    if (not path or path.startswith("/") or "\\" in path or ":" in path
            or norm.startswith("..") or norm != path):
        raise ManifestError(f"shard path {path!r} must be a plain relative path inside the dataset folder")
    return norm


def split_layout(manifest: dict[str, Any], split: str) -> str:
    """How the samples of `split` are laid out in its shards (`reader/npz.py`): the split's `layout`,
    `members` when it has none (every manifest before version 3)."""
    entry = manifest["splits"].get(split, {})
    return entry.get("layout", "members") if isinstance(entry, dict) else "members"


def split_stats(manifest: dict[str, Any], split: str) -> dict[str, Any]:
    """The normalisation statistics of `split`: `{field: {"count", "mean", "std", "min", "max", "q01",
    "q99"} | None}` as the export wrote them (lists, one value per dimension; None where a field had no
    valid step). A key with a dot (e.g. `action.relative`) is a derived entry, not a field. `{}` for a
    split without statistics. `ShardDataset.stats` and `Mixture.stats` both answer with this."""
    return manifest.get("stats", {}).get(split, {})


def shards_of(manifest: dict[str, Any], split: str) -> list[ShardInfo]:
    """The shards of `split` of a manifest that `validate_manifest` accepted (`parse_manifest` does)."""
    try:
        entries = manifest["splits"][split]["shards"]
    except KeyError as exc:
        have = ", ".join(sorted(manifest.get("splits", {})))
        raise ManifestError(f"manifest has no split {split!r} (it has: {have})") from exc
    if manifest.get("format_version") == 1:  # offsets inline; ints already (validated): tuple() copies in C
        return [ShardInfo(safe_relative(e["path"]), e["samples"], e["bytes"], e["sha256"], offsets=tuple(e["offsets"]))
                for e in entries]
    return [ShardInfo(safe_relative(e["path"]), e["samples"], e["bytes"], e["sha256"], e["index_sha256"])
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
_SHARD_KEYS = {"path": str, "samples": int, "bytes": int, "sha256": str}
_VERSION_KEYS = {1: {"offsets": list}, 2: {"index_sha256": str}, 3: {"index_sha256": str}}  # besides _SHARD_KEYS


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
    `samples` >= 0, `bytes`, a sha256 hex `sha256`; versions 2, 3: a sha256 hex `index_sha256` (the
    `.idx` file itself is checked when it is read: `decode_index`); version 1: `offsets`, `samples`
    integers, the first 0, strictly increasing, multiples of 512 (tar blocks), the last leaving room
    for one tar header and the end-of-archive blocks before `bytes`.

    Cost: O(fields + shards) in Python; for version 1 plus one numpy pass over each shard's offsets
    (~0.15 s for a 10M-sample manifest, whose json.loads takes 1.0 s), one array per shard at a
    time, freed before the next."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ManifestError(f"{where} is not a robowds manifest")
    version = doc.get("format_version")
    if not _is_int(version) or version not in READ_VERSIONS:
        raise ManifestError(f"{where} has format_version {version!r}; this robowds reads versions "
                            f"{', '.join(map(str, READ_VERSIONS))}")
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
        if "layout" in entry and entry["layout"] not in LAYOUTS:
            raise ManifestError(f"{at}: 'layout' is {json.dumps(entry['layout'])[:60]}; this robowds reads layouts "
                                f"{', '.join(LAYOUTS)}")
        total = size = 0
        for index, shard in enumerate(shards):
            _check_shard(shard, version, f"{at}, shard {index}" + (
                f" ({shard['path']})" if isinstance(shard, dict) and isinstance(shard.get("path"), str) else ""))
            if shard["path"] in paths:
                raise ManifestError(f"{at}, shard {index}: path {shard['path']!r} is already listed "
                                    f"(split {paths[shard['path']]!r})")
            paths[shard["path"]] = split
            total += shard["samples"]
            size += shard["bytes"]
        for key, value in (("samples", total), ("bytes", size)):
            if key in entry and _expect(entry, key, int, at) != value:
                raise ManifestError(f"{at}: {key!r} is {entry[key]}, its shards hold {value}")
    _check_files(doc, where)


def _check_files(doc: dict[str, Any], where: str) -> None:
    """The optional `files` entry: the export's side files (`episodes.msgpack`, `stats-state.msgpack`,
    `episode-facts.msgpack`),
    each `{"path", "bytes", "sha256"}`. Readers open only a split's key index (`keys.<split>`,
    `reader/keys.py`); export and verify open them all, and publish
    deletes them when it replaces the export, so their paths must stay inside the dataset folder."""
    if "files" not in doc:
        return
    for name, entry in _expect(doc, "files", dict, where).items():
        at = f"{where}: file {name!r}"
        for key, kind in (("path", str), ("bytes", int), ("sha256", str)):
            _expect(entry, key, kind, at)
        try:
            safe_relative(entry["path"])
        except ManifestError:
            raise ManifestError(f"{at}: path {entry['path']!r} must be a plain relative path inside the dataset "
                                "folder") from None
        digest = entry["sha256"]
        if len(digest) != 64 or not _SHA256_HEX.issuperset(digest):
            raise ManifestError(f"{at}: 'sha256' must be 64 lowercase hex digits, got {digest[:80]!r}")


def _check_shard(shard: Any, version: int, at: str) -> None:
    for key, kind in {**_SHARD_KEYS, **_VERSION_KEYS[version]}.items():
        _expect(shard, key, kind, at)
    try:
        safe_relative(shard["path"])
    except ManifestError as exc:
        raise ManifestError(f"{at}: {exc}") from None
    samples, size = shard["samples"], shard["bytes"]
    if samples < 0:
        raise ManifestError(f"{at}: 'samples' must be >= 0, got {samples}")
    for key in ("sha256", "index_sha256") if version >= 2 else ("sha256",):
        digest = shard[key]
        if len(digest) != 64 or not _SHA256_HEX.issuperset(digest):
            raise ManifestError(f"{at}: {key!r} must be 64 lowercase hex digits, got {digest[:80]!r}")
    if size < len(END_OF_ARCHIVE) or size % BLOCK:
        raise ManifestError(f"{at}: 'bytes' must be a multiple of {BLOCK} and >= {len(END_OF_ARCHIVE)} "
                            f"(the end-of-archive blocks), got {size}")
    if version == 1:
        _check_inline_offsets(shard["offsets"], samples, size, at)


def _check_inline_offsets(offsets: list[Any], samples: int, size: int, at: str) -> None:
    """A version 1 shard's inline `offsets`: see `validate_manifest`."""
    if len(offsets) != samples:
        raise ManifestError(f"{at}: 'offsets' has {len(offsets)} entries, 'samples' says {samples}")
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
