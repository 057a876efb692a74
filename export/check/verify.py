"""`robowds verify OUT [--store STORE]`: prove the shards are what the manifest says they are.

Checks every shard's size and sha256, its offset index (`<shard>.idx`: present, sha256 as the
manifest lists it, well-formed; inline offsets in a version 1 manifest), parses every tar member,
compares sample keys, counts and byte offsets with the index, decodes every member against the field
schema (an `npz` split's packed member checked and unpacked first, CRC-32s included), and the side
files the manifest lists (size, sha256, readable: `job/side_files.py`), the files derived from the
manifest (`<split>.wids.json`, `.nv-meta/.info.json`, the report's counts, `generations`:
`derived.py`); with `--store`, recomputes a seeded random subset of windows from the source with the
export's own code and compares bytes.

`--since G` reads only the shards the appends after generation G added (`since.shards_to_check`, the
one place that picks them); everything else above is checked as without it, since every append
rewrites it. Sample keys are then unique among the shards read only (an append's keys come from its
new episodes' ids).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robowds.export.check.derived import check_derived
from robowds.export.check.result import VerifyResult
from robowds.export.check.shard_check import ShardCheck, ShardTask, check_shard
from robowds.export.check.shared_map import map_shared
from robowds.export.check.since import shards_to_check
from robowds.export.errors import UserError
from robowds.export.output.publish import load_finished_manifest
from robowds.export.progress import progress_bar
from robowds.export.store.location import RemoteStoreError, StoreLocation, store_location
from robowds.reader.manifest import ShardInfo, split_layout

# shards below this many bytes in all are checked in-process whatever `workers` says: a pool's start
# (a forkserver's interpreter, then ~0.3 s of a worker's imports before its first shard on the 2-core
# VM) is about what checking them takes (~0.4-0.6 s per 100 MB)
PARALLEL_MIN_BYTES = 64 << 20


@dataclass
class ShardReplay:
    """Folds the shards' checks, in shard order, into the result; the set of keys seen so far is
    O(samples read) strings, as the serial check held."""

    result: VerifyResult
    keys: set[str] = field(default_factory=set)

    def add(self, path: str, check: ShardCheck) -> None:
        for event in check.events:
            if isinstance(event, str):
                self.result.failures.append(event)
                continue
            key, offset = event
            if key in self.keys:
                self.result.failures.append(f"shard {path}: key {key} at byte {offset} is not unique in the dataset")
            self.keys.add(key)
        self.result.samples += check.samples
        self.result.shards += check.read


def check_shards(tasks: list[ShardTask], result: VerifyResult, workers: int, progress: bool) -> None:
    """Check `tasks` with `workers` processes, this one included (`map_shared`: this process and a pool
    of `workers - 1`, largest shards first), in-process alone for 1 or for less than
    `PARALLEL_MIN_BYTES` of shards, where starting a pool costs more than it saves; results folded in
    task order whatever finished first."""
    replay = ShardReplay(result)
    parallel = workers > 1 and len(tasks) > 1 and sum(t.shard.bytes for t in tasks) >= PARALLEL_MIN_BYTES
    checks = (map_shared(check_shard, tasks, min(workers, len(tasks)), cost=_shard_bytes) if parallel
              else map(check_shard, tasks))
    bar = progress_bar(checks, total=len(tasks), desc="verify", unit="shard", disable=not progress)
    try:
        for task, check in zip(tasks, bar):
            replay.add(task.shard.path, check)
    finally:
        close = getattr(checks, "close", None)
        if close is not None:  # a pool's: stops it now, also when a check raised
            close()


def _shard_bytes(task: ShardTask) -> int:
    """What checking a shard costs, for `map_shared`'s largest-first order: its size."""
    return task.shard.bytes


def _check_side_files(root: StoreLocation, manifest: dict[str, Any], result: VerifyResult) -> None:
    """The side files the manifest lists under `files` (`job/side_files.py`): present, with the listed
    size and sha256 (like shards), and readable; the episodes table lists every episode the manifest's
    splits hold, each in its split; the statistics state gives the manifest's `stats` (what an append
    merges new episodes into); the episode facts agree with the manifest (`check/facts.py`). Cost: one
    read of each and a summary per split and field."""
    from robowds.export.check.facts import check_facts
    from robowds.export.job.episode_facts import FACTS
    from robowds.export.job.side_files import EPISODES, STATS_STATE, decode_episodes, read_stats_state

    for name, entry in sorted(manifest.get("files", {}).items()):
        where = f"file {entry['path']}"
        if not root.is_file(entry["path"]):
            result.failures.append(f"{where}: missing")
            continue
        data = root.read_bytes(entry["path"])
        if len(data) != entry["bytes"]:
            result.failures.append(f"{where}: {len(data)} bytes, manifest says {entry['bytes']}")
            continue
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            result.failures.append(f"{where}: sha256 does not match the manifest")
            continue
        try:
            if name == STATS_STATE:
                state = read_stats_state(data, where)
                differ = sorted(f"{split}/{key}" for split, keys in manifest.get("stats", {}).items()
                                for key, entry in keys.items() if not _stats_agree(state.get(split, {}), key, entry))
                if differ:
                    result.failures.append(f"{where}: the statistics it gives differ from the manifest's stats "
                                           f"for {', '.join(differ[:5])}")
            elif name == EPISODES:
                table = decode_episodes(data, where)
                listed = {ep: split for split, e in manifest["splits"].items() for ep in e.get("episodes", [])}
                wrong = sorted(ep for ep, split in listed.items() if ep not in table or table[ep].split != split)
                if wrong:
                    result.failures.append(f"{where}: does not list {len(wrong)} exported episode(s) in their "
                                           f"split, e.g. {wrong[0]!r}")
            elif name == FACTS:
                check_facts(data, manifest, where, result)
        except (ValueError, KeyError, TypeError) as exc:
            result.failures.append(str(exc) if str(exc).startswith(where) else f"{where}: {exc}")


def verify_export(out: Path | str | StoreLocation, store: Path | str | StoreLocation | None = None,
                  check_windows: int = 32, seed: int = 0, progress: bool = True,
                  since: int | None = None, workers: int = 1) -> VerifyResult:
    """Check every shard of the export in `out` against its manifest (with `since`, only the shards
    the appends after that generation added) and, with `store`, recompute `check_windows` random
    windows of those shards from it. Both may be folders or fsspec URLs (`StoreLocation`s with their
    storage options); each shard read is read whole once (its sha256). `workers` processes check
    shards at once (`check_shards`); the result is the same, message for message, for any number."""
    root = store_location(out)
    manifest = load_finished_manifest(root)
    selection = shards_to_check(manifest, since, out)
    result = VerifyResult(since=selection.since, selected=len(selection.shards), skipped=selection.skipped,
                          current=selection.current)
    try:
        tasks = [ShardTask(root, split, shard, manifest["schema"], split_layout(manifest, split))
                 for split, shard in selection.shards]
        check_shards(tasks, result, workers, progress)
        _check_side_files(root, manifest, result)
        check_derived(root, manifest, result)
        if store is not None and result.ok:
            from robowds.export.check.recompute import recompute_windows

            read: dict[str, list[ShardInfo]] = {}
            for split, shard in selection.shards:
                read.setdefault(split, []).append(shard)
            recompute_windows(root, manifest, store_location(store), check_windows, seed, result, progress=progress,
                              shards=read)
    except RemoteStoreError as exc:  # the export or the store cannot be read (access, network)
        raise UserError(str(exc), hint=exc.hint) from exc
    return result


def _stats_agree(state: dict[str, Any], key: str, entry: Any) -> bool:
    """Whether a manifest statistics entry is what the saved state of its key gives: None (a field with
    no valid step) where the state has none, else the state's summary plus, for a relative-action entry
    (`<action>.relative`), its `relative_to` record, which comes from the config, not from the values."""
    if entry is None:
        return key not in state or state[key] is None
    if key not in state or state[key] is None or not isinstance(entry, dict):
        return False
    return state[key].summary() == {k: v for k, v in entry.items() if k != "relative_to"}
