"""The export's side files: what `export --append` needs of an export besides its shards.

Why not in `manifest.json`: every rank and DataLoader worker parses the manifest; 20k episodes x ~80
bytes of identity would add MBs to each. These files are read only by append, `verify` (which
hashes them like shards) and `robowds report`, never by the reader. All are msgpack (no pickle), written into the work
folder's `ready/` with the wids indexes and published by the same journaled rename (or, to an output
URL, staged under `.robowds-work/ready/` and copied into place before the manifest); the manifest
lists each under `files.<name>` with its `path`, `bytes` and `sha256`.

- `episodes.msgpack` (`files.episodes`): the sha256 of the store's `store.yaml`, and per episode the
  export considered (exported or rejected), columns in episode-id order: id, split, fingerprint
  (`store/episode_identity.py`, 32 bytes; zeros when it could not be loaded), window count, exported.
  ~50-60 bytes per episode (measured: 15.4 KB for 300 synthetic episodes, ids of 7 characters):
  ~1.2 MB at 20k episodes, ~5.5 MB at DROID's 92k.
- `stats-state.msgpack` (`files.stats_state`): per split and statistics key (a field, or any other
  key such as `<field>.relative`) the merged `FieldStats.to_state()` the manifest's `stats` were
  computed from. Its size is bounded by the state's buckets (at most 256 per occupied power-of-two
  range of each dimension), not by the number of episodes: merging it with new episodes' states gives
  the statistics, to the byte, of an export of all of them (`export/core/stats.py`). Under `report`:
  the parts of the report's ratios and sums (`report_state.report_parts`: masked and total steps per
  field, per camera bytes, frames, span steps and the exact PSNR sum, the exact summed duration),
  bounded by the fields and cameras; an export made before them has no `report` key, and an append
  to it keeps that export's `masked_fraction`, `video` and `float32_loss` (`append_manifest.py`).
- `episode-facts.msgpack` (`files.episode_facts`): per episode its duration, split, windows, why it was
  rejected, its warnings, and per exported time-series and video field its source rate, gaps, whether
  it lacks the stream and its masked steps: what `robowds report` shows per episode without reading
  the shards (`episode_facts.py`, format and size there; `read_episode_facts` reads it). An export
  made before it lists none, and an append to such an export writes none (its old episodes' facts
  are not known without reading them again): a full export with `--overwrite` brings it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import msgpack
import numpy as np

from robowds.export.core.stats import FieldStats
from robowds.export.job.episode_facts import FACTS, FACTS_PATH, EpisodeFacts, encode_facts
from robowds.export.job.episode_facts_gather import facts_of
from robowds.export.job.msgpack_doc import checked_doc
from robowds.export.job.report_state import report_parts

EPISODES = "episodes"  # manifest `files` keys
STATS_STATE = "stats_state"
PATHS = {EPISODES: "episodes.msgpack", STATS_STATE: "stats-state.msgpack", FACTS: FACTS_PATH}
EPISODES_FORMAT = "robowds-episodes"
STATS_FORMAT = "robowds-stats-state"
VERSION = 1
_NO_FINGERPRINT = bytes(32)


@dataclass(frozen=True)
class EpisodeEntry:
    """One row of `episodes.msgpack`."""

    episode_id: str
    split: str
    fingerprint: str | None  # hex; None: it could not be loaded (rejected: a bad row, a missing media file)
    windows: int  # windows emitted (0 for a rejected episode)
    exported: bool  # False: rejected (the manifest's report says why)


@dataclass(frozen=True)
class EpisodeChanges:
    """What `compare_episodes` finds, each sorted by episode id."""

    changed: list[str]  # in both, with another fingerprint or split (or one that is unknown)
    removed: list[str]  # in the old export, not in the store
    added: list[str]  # in the store, not in the old export


def episode_entries(records: Iterable[dict[str, Any]]) -> list[EpisodeEntry]:
    """The table's rows from the export's staged records (errors included), in episode-id order."""
    return sorted((EpisodeEntry(r["episode_id"], r["split"], r.get("fingerprint"),
                                0 if r["error"] else int(r["report"]["emitted"]), not r["error"]) for r in records),
                  key=lambda e: e.episode_id)


def encode_episodes(entries: list[EpisodeEntry], declarations: str | None = None) -> bytes:
    """`episodes.msgpack`: `declarations` (the sha256 of the store's `store.yaml`, or None), then
    columns: the split as an index into `splits` (u2), fingerprints as 32 raw bytes each, windows as
    little-endian int64, exported as one byte each."""
    splits = sorted({e.split for e in entries})
    code = {s: i for i, s in enumerate(splits)}
    doc = {"format": EPISODES_FORMAT, "version": VERSION, "declarations": declarations, "splits": splits,
           "episode_id": [e.episode_id for e in entries],
           "split": np.asarray([code[e.split] for e in entries], "<u2").tobytes(),
           "fingerprint": b"".join(bytes.fromhex(e.fingerprint) if e.fingerprint else _NO_FINGERPRINT
                                   for e in entries),
           "windows": np.asarray([e.windows for e in entries], "<i8").tobytes(),
           "exported": np.asarray([e.exported for e in entries], "u1").tobytes()}
    return msgpack.packb(doc, use_bin_type=True)


def _checked(data: bytes, fmt: str, where: str) -> dict[str, Any]:
    return checked_doc(data, fmt, VERSION, where)


def decode_episodes(data: bytes, where: str = PATHS[EPISODES]) -> dict[str, EpisodeEntry]:
    """episode id -> its entry, from `episodes.msgpack`'s bytes (ValueError naming `where` if damaged)."""
    doc = _checked(data, EPISODES_FORMAT, where)
    ids, splits = doc["episode_id"], doc["splits"]
    codes = np.frombuffer(doc["split"], "<u2")
    windows = np.frombuffer(doc["windows"], "<i8")
    exported = np.frombuffer(doc["exported"], "u1")
    prints = doc["fingerprint"]
    if not (len(codes) == len(windows) == len(exported) == len(ids) and len(prints) == 32 * len(ids)):
        raise ValueError(f"{where}: its columns have different lengths")
    out = {}
    for i, ep in enumerate(ids):
        digest = prints[32 * i:32 * i + 32]
        out[ep] = EpisodeEntry(ep, splits[int(codes[i])], None if digest == _NO_FINGERPRINT else digest.hex(),
                               int(windows[i]), bool(exported[i]))
    return out


def read_declarations(data: bytes, where: str = PATHS[EPISODES]) -> str | None:
    """The sha256 of the store's `store.yaml` when the export was made (None: it had none)."""
    return _checked(data, EPISODES_FORMAT, where)["declarations"]


def compare_episodes(old: Mapping[str, tuple[str | None, str]],
                     current: Mapping[str, tuple[str | None, str]]) -> EpisodeChanges:
    """Old export vs current store, each episode id -> (fingerprint, split): which episodes changed
    (another fingerprint or split, or a fingerprint unknown on either side: nothing proves it the
    same), were removed, or were added. Pure; O(episodes). An append passes the old table's exported
    episodes (a rejected one built nothing: it may be tried again) and compares `read_declarations`
    with the store's own (a changed `store.yaml` changes every episode's windows)."""
    changed = sorted(ep for ep, (fp, split) in old.items() if ep in current and (
        fp is None or current[ep][0] is None or current[ep] != (fp, split)))
    removed = sorted(ep for ep in old if ep not in current)
    added = sorted(ep for ep in current if ep not in old)
    return EpisodeChanges(changed, removed, added)


def encode_stats_state(folded: Mapping[str, Mapping[str, FieldStats]], report: dict[str, Any] | None = None) -> bytes:
    """`stats-state.msgpack`: split -> key -> `FieldStats.to_state()`, splits and keys sorted (the
    state is already a function of the multiset of values, so the bytes are too), and the report's
    parts (`report_state.report_parts`, also a function of the multiset of episodes) when given."""
    splits = {split: {key: folded[split][key].to_state() for key in sorted(folded[split])} for split in sorted(folded)}
    doc = {"format": STATS_FORMAT, "version": VERSION, "splits": splits, **({"report": report} if report else {})}
    return msgpack.packb(doc, use_bin_type=True)


def load_stats_state(data: bytes, where: str = PATHS[STATS_STATE]) -> dict[str, dict[str, dict]]:
    """split -> key -> staged state, as `SplitStats.fold_states` takes it (to merge new episodes in)."""
    return _checked(data, STATS_FORMAT, where)["splits"]


def load_report_parts(data: bytes, where: str = PATHS[STATS_STATE]) -> dict[str, Any] | None:
    """The report's parts an export saved (`report_state.report_parts`); None for an export before them."""
    return _checked(data, STATS_FORMAT, where).get("report")


def read_stats_state(data: bytes, where: str = PATHS[STATS_STATE]) -> dict[str, dict[str, FieldStats]]:
    """split -> key -> the merged `FieldStats` the export wrote."""
    return {split: {key: FieldStats.from_state(state) for key, state in keys.items()}
            for split, keys in load_stats_state(data, where).items()}


def side_files(records: Iterable[dict[str, Any]], folded: Mapping[str, Mapping[str, FieldStats]],
               declarations: str | None, fields: list[str]) -> tuple[dict[str, bytes], dict[str, dict[str, Any]]]:
    """(path -> bytes, the manifest's `files` entry) of an export's side files; `fields`: the episode
    facts' columns (`episode_facts.fact_fields`)."""
    records = list(records)
    return side_files_of(episode_entries(records), folded, declarations, report_parts(records),
                         facts_of(records, fields))


def side_files_of(entries: list[EpisodeEntry], folded: Mapping[str, Mapping[str, FieldStats]],
                  declarations: str | None, report: dict[str, Any] | None = None,
                  facts: EpisodeFacts | None = None) -> tuple[dict[str, bytes], dict[str, dict[str, Any]]]:
    """`side_files` from the table's rows (an append: the old export's rows and the new episodes', and
    the merged report parts, None when the old export saved none; the merged facts, None when the old
    export has no facts file: then the appended export has none either)."""
    data = {PATHS[EPISODES]: encode_episodes(sorted(entries, key=lambda e: e.episode_id), declarations),
            PATHS[STATS_STATE]: encode_stats_state(folded, report)}
    if facts is not None:
        data[PATHS[FACTS]] = encode_facts(facts)
    listed = {name: {"path": path, "bytes": len(data[path]), "sha256": hashlib.sha256(data[path]).hexdigest()}
              for name, path in PATHS.items() if path in data}
    return data, listed
