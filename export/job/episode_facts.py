"""Per-episode facts the report shows (duration, rejection reason, warnings, and per field the
source rate, gaps and masked steps), kept as columns: what `robowds report` reads instead of the
shards.

Written at export as the side file `episode-facts.msgpack` (manifest `files.episode_facts`,
`side_files.py`), gathered from the staged records (`episode_facts_gather.py`); an append rewrites it
from the old file's rows and the new episodes' records (`merged_facts`), byte for byte what a full
export of the grown store writes. An export made before the file lists none: `read_episode_facts`
gives None for it.

Format: msgpack (no pickle), `format` "robowds-episode-facts", `version` 1; `fields`, `splits` and the
text columns (`episode_id`, `reason`, `warnings`) as lists; number columns as little-endian raw bytes
(`split` u2 index into `splits`, `exported` u1, `windows` i8, `duration_s` f8, and per episode x field,
row-major [E, F]: `rate_hz` f8, `gaps` i8, `missing` u1, `masked_steps` i8, `steps` i8).

Scale: O(episodes x fields): 33 bytes per episode and field (rate 8, gaps 8, missing 1, masked 8,
steps 8) plus ~30 per episode (its id, split 2, exported 1, windows 8, duration 8, an empty reason and
warning list 1 each) and the (rare) warning and reason texts. Measured: 8,000 bytes for 40 synthetic
episodes x 5 fields (ids of 7 characters, no warnings), 200 bytes per episode: ~4 MB at 20k episodes
x 5 fields, ~7.3 MB at 20k x 10, ~18 MB at DROID's 92k x 5. Read whole by the report (one file).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

import msgpack
import numpy as np

from robowds.export.errors import UserError
from robowds.export.job.listed_file import EXPORT_AGAIN, read_listed
from robowds.export.job.msgpack_doc import checked_doc

if TYPE_CHECKING:
    from pathlib import Path

    from robowds.export.job.spec import JobSpec
    from robowds.export.store.location import StoreLocation

FACTS = "episode_facts"  # the manifest's `files` key
FACTS_PATH = "episode-facts.msgpack"
FACTS_FORMAT = "robowds-episode-facts"
FACTS_VERSION = 1
# columns [E, F]: (dtype in the file, little-endian; dtype in memory), in the file's order
_MATRICES = {"rate_hz": ("<f8", np.float64), "gaps": ("<i8", np.int64), "missing": ("u1", np.bool_),
             "masked_steps": ("<i8", np.int64), "steps": ("<i8", np.int64)}


@dataclass(frozen=True)
class EpisodeFacts:
    """Columns in episode-id order, one row per episode the export considered (exported or rejected);
    `fields` are the exported time-series and video fields, in schema order."""

    episode_id: list[str]  # [E]
    split: list[str]  # [E]
    exported: np.ndarray  # [E] bool: False = rejected
    windows: np.ndarray  # [E] int64, windows emitted (0 when rejected)
    duration_s: np.ndarray  # [E] float64 extent of the episode; NaN when it could not be loaded
    reason: list[str | None]  # [E] why it was rejected ("field: message"), None when exported
    warnings: list[list[str]]  # [E] e.g. repairs of its timestamps, a stream it lacks, a camera fps mismatch
    fields: list[str]  # [F]
    # [E, F] float64 median source rate (1 / median period; a camera's measured fps); NaN: stream missing or rejected
    rate_hz: np.ndarray
    gaps: np.ndarray  # [E, F] int64 source intervals longer than the field's max gap
    missing: np.ndarray  # [E, F] bool: the episode lacks the stream (its steps are all padding)
    masked_steps: np.ndarray  # [E, F] int64 padded steps over the episode's windows
    steps: np.ndarray  # [E, F] int64 steps over the episode's windows

    def take(self, rows: Iterable[int]) -> "EpisodeFacts":
        """These rows (indexes, in the order given) of every column."""
        index = np.asarray(list(rows), dtype=np.int64)  # [K]
        return EpisodeFacts(
            episode_id=[self.episode_id[i] for i in index], split=[self.split[i] for i in index],
            exported=self.exported[index], windows=self.windows[index], duration_s=self.duration_s[index],
            reason=[self.reason[i] for i in index], warnings=[list(self.warnings[i]) for i in index],
            fields=list(self.fields), **{name: getattr(self, name)[index] for name in _MATRICES})


def fact_fields(job: "JobSpec") -> list[str]:
    """The fields the facts have columns for: the job's time-series and video fields, in the
    manifest schema's order (`job.fields`)."""
    return [f for f in job.fields if f in job.build.windows or f in job.build.videos]


def concat_facts(parts: list[EpisodeFacts], fields: list[str]) -> EpisodeFacts:
    """The rows of `parts` (all with columns `fields`) together, sorted by episode id: the file's
    order, so its bytes do not depend on which rows came from where (an append's old and new)."""
    for part in parts:
        if part.fields != fields:
            raise ValueError(f"episode facts of fields {part.fields} cannot join facts of fields {fields}")
    width = len(fields)
    joined = EpisodeFacts(
        episode_id=[e for p in parts for e in p.episode_id], split=[s for p in parts for s in p.split],
        exported=np.concatenate([np.zeros(0, bool), *(p.exported for p in parts)]),
        windows=np.concatenate([np.zeros(0, np.int64), *(p.windows for p in parts)]),
        duration_s=np.concatenate([np.zeros(0, np.float64), *(p.duration_s for p in parts)]),
        reason=[r for p in parts for r in p.reason], warnings=[w for p in parts for w in p.warnings],
        fields=list(fields),
        **{name: np.concatenate([np.zeros((0, width), memory), *(getattr(p, name) for p in parts)]).astype(memory)
           for name, (_, memory) in _MATRICES.items()})
    order = sorted(range(len(joined.episode_id)), key=joined.episode_id.__getitem__)
    return joined.take(order)


def merged_facts(old: EpisodeFacts, keep: set[str], new: EpisodeFacts) -> EpisodeFacts:
    """An append's facts: the old export's rows of the episodes in `keep` and the new episodes' rows."""
    return concat_facts([old.take(i for i, ep in enumerate(old.episode_id) if ep in keep), new], new.fields)


def encode_facts(facts: EpisodeFacts) -> bytes:
    """`episode-facts.msgpack`'s bytes (module docstring); rows must be in episode-id order."""
    splits = sorted(set(facts.split))
    code = {s: i for i, s in enumerate(splits)}
    doc: dict[str, Any] = {
        "format": FACTS_FORMAT, "version": FACTS_VERSION, "fields": list(facts.fields), "splits": splits,
        "episode_id": list(facts.episode_id),
        "split": np.asarray([code[s] for s in facts.split], "<u2").tobytes(),
        "exported": np.asarray(facts.exported, "u1").tobytes(),
        "windows": np.asarray(facts.windows, "<i8").tobytes(),
        "duration_s": np.asarray(facts.duration_s, "<f8").tobytes(),
        "reason": list(facts.reason), "warnings": [list(w) for w in facts.warnings]}
    for name, (dtype, _) in _MATRICES.items():
        doc[name] = np.ascontiguousarray(getattr(facts, name), dtype).tobytes()  # [E, F] row-major
    return msgpack.packb(doc, use_bin_type=True)


def decode_facts(data: bytes, where: str = FACTS_PATH) -> EpisodeFacts:
    """The facts from `episode-facts.msgpack`'s bytes; ValueError naming `where` when they are not a
    version 1 facts file or its columns disagree in length."""
    doc = checked_doc(data, FACTS_FORMAT, FACTS_VERSION, where)
    try:
        ids, fields, splits = list(doc["episode_id"]), list(doc["fields"]), list(doc["splits"])
        rows, width = len(ids), len(fields)
        codes = np.frombuffer(doc["split"], "<u2")  # [E]
        columns = {"exported": np.frombuffer(doc["exported"], "u1").astype(bool),
                   "windows": np.frombuffer(doc["windows"], "<i8").astype(np.int64),
                   "duration_s": np.frombuffer(doc["duration_s"], "<f8").astype(np.float64)}
        matrices = {name: np.frombuffer(doc[name], dtype) for name, (dtype, _) in _MATRICES.items()}
        reason, warnings = list(doc["reason"]), [list(w) for w in doc["warnings"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: a column is missing or not of its type ({exc})") from exc
    if any(len(c) != rows for c in (codes, reason, warnings, *columns.values())) or \
            any(len(m) != rows * width for m in matrices.values()) or (rows and int(codes.max()) >= len(splits)):
        raise ValueError(f"{where}: its columns have different lengths")
    shaped = {name: matrices[name].reshape(rows, width).astype(memory)  # [E, F] each, native and writable
              for name, (_, memory) in _MATRICES.items()}
    return EpisodeFacts(episode_id=ids, split=[splits[int(c)] for c in codes], reason=reason, warnings=warnings,
                        fields=fields, **columns, **shaped)


def facts_entry(data: bytes) -> dict[str, Any]:
    """The manifest's `files.episode_facts` entry for these bytes (as `side_files.py` lists the others)."""
    return {"path": FACTS_PATH, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def read_episode_facts(out: "StoreLocation | Path | str", manifest: dict[str, Any]) -> EpisodeFacts | None:
    """The facts of the export in `out` (a `StoreLocation`, or a folder or URL as `store_location`
    takes it) whose finished manifest is `manifest` (`output.publish.load_finished_manifest`); None
    when the manifest lists no facts file (an export made before it, or appended to one). A listed file
    that is missing, has another sha256 than the manifest's or does not decode is a UserError naming
    it, with the fix. Cost: one read of the file (~200 bytes per episode) and its sha256."""
    from robowds.export.store.location import store_location

    found = read_listed(store_location(out), manifest, FACTS)
    if found is None:
        return None
    data, where = found
    try:
        return decode_facts(data, where)
    except ValueError as exc:
        raise UserError(str(exc), hint=EXPORT_AGAIN) from exc

