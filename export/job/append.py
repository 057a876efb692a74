"""`robowds export STORE OUT --append`: export only the episodes the store has and OUT does not.

The old export's shards and their `.idx` are never opened for writing: the new episodes' windows go
into new shards, numbered on after each split's last (`shards.plan_shards(first_shard=...)`), built
by the export's own machinery (a work folder, `stage.stage_episodes` for the map, `shards.write_shard`
for the reduce, on the executor chosen: in-process, a process pool or Ray tasks) and placed by the
export's journaled publish, whose journal lists the old shards too (nothing is staged for them, so
nothing moves or copies them) and removes nothing. OUT is a folder or an output URL (`append_out.py`:
the full export's lock, work folder, uploads and publish for each). A kill before the journal leaves
the old export; after it, the next run into OUT finishes the publish.

Side files: `episodes.msgpack`, `stats-state.msgpack` and (when the old export has it)
`episode-facts.msgpack` are rewritten, each byte for byte what a full export of the grown store
writes; an old export without the facts file appends without one (`_appended_facts`).

What proves the append right (refused otherwise, nothing written): OUT holds a robowds export of
plan version 2 with its side files (`side_files.py`); the store's `store.yaml` digest is the one the
export recorded; every episode it exported is still in the store with the same fingerprint and split
(`compare_episodes`, fingerprints through the export's `EpisodeLoader`).

Window order: the new windows of a split are ordered by `window_order` over the new episodes alone
(in the store's episode order, seeded by seed and split, as a full export orders a split), so an
append is a function of (old export, added episodes) and the samples of OUT afterwards are, as a
multiset per split, those of a full export of the grown store; only their placement in shards
differs. Statistics: the saved state merged with the new episodes' states, byte-identical to a full
export's. Cost: one fingerprint pass over the old episodes' rows and media (the loader), plus the
export of the new ones; old shards are neither read nor copied.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from robowds.export import __version__
from robowds.export.core.shard_plan import PLAN_VERSION
from robowds.export.errors import UserError
from robowds.export.executors.executor import LOCAL, ExecutorChoice
from robowds.export.job.append_config import FULL_EXPORT, check_given, out_config
from robowds.export.job.append_manifest import merged_manifest
from robowds.export.job.append_out import AppendOut, append_out
from robowds.export.job.episode_facts import FACTS, EpisodeFacts, decode_facts, fact_fields, merged_facts
from robowds.export.job.episode_facts_gather import facts_of
from robowds.export.job.key_index import key_index_files, old_key_hashes
from robowds.export.job.remote_job import reduce_shards
from robowds.export.job.report import SplitStats, report_warnings
from robowds.export.job.report_state import merge_parts, report_parts
from robowds.export.job.run import EPISODES_PER_TASK, Summary, _batches, check_store_unchanged
from robowds.export.job.shards import plan_shards
from robowds.export.job.side_files import (EPISODES, STATS_STATE, compare_episodes, decode_episodes,
                                           episode_entries, load_report_parts, load_stats_state, read_declarations,
                                           side_files_of)
from robowds.export.job.spec import resolve
from robowds.export.job.stage import load_record, stage_episodes
from robowds.export.job.staging_release import StagingRelease, released_windows
from robowds.export.progress import progress_bar
from robowds.export.store.episode_identity import declarations_digest
from robowds.export.store.episodes import EpisodeLoader
from robowds.export.store.fingerprint import fingerprint
from robowds.export.store.location import StoreLocation, store_location
from robowds.export.store.row_stream import drop_row_groups, read_order

SHOWN = 20  # episodes named in a refusal


def run_append(store: Path | str | StoreLocation, out: Path | str, given: dict[str, Any] | None = None,
               given_keys: set[str] | None = None, workers: int = 1, progress: bool = True,
               executor: ExecutorChoice = LOCAL, out_storage_options: dict[str, Any] | None = None,
               work_dir: Path | None = None, break_lock: bool = False) -> Summary:
    """Append the store's new episodes to the export in `out`: a folder, or an fsspec URL (with
    `out_storage_options`, `work_dir` and `break_lock` as `run_export` takes them; `job/append_out.py`).
    `given`: the config the user passed (checked against OUT's at `given_keys`,
    `append_config.check_given`), never used to build. `executor`: as for an export (the same bytes)."""
    began = time.perf_counter()
    executor.check_available()  # before anything is written
    target = append_out(out, out_storage_options, work_dir, break_lock)
    store = store_location(store)
    if store.local:
        store = StoreLocation(str(store.path.resolve()))
    lock = target.lock()
    try:
        try:
            lock.acquire()  # inside: a Ctrl-C while a lock object's PUT is in flight still deletes it
        except OSError as exc:
            raise target.os_error(exc) from exc
        summary = _append_locked(store, target, given, given_keys or set(), workers, progress, executor, began)
    except BaseException as exc:
        with contextlib.suppress(Exception):  # the append's own error is the one to report (a URL may be down)
            lock.release()
        if isinstance(exc, OSError):  # OUT read-only, disk full, no permission: one message, the fix
            raise target.os_error(exc) from exc
        raise
    lock.release()
    return summary


def _old_export(target: AppendOut) -> tuple[dict[str, Any], dict[str, bytes]]:
    """OUT's manifest and side files (path -> bytes), each checked against the manifest's sha256."""
    target.finish_publish()  # a publish killed midway is completed first: its journal is ours
    out = target.out
    doc = target.manifest()
    what = None
    if doc is None:
        what = f"{out} holds no robowds export (no manifest.json)"
    elif doc.get("plan_version") != PLAN_VERSION:
        what = (f"{out} holds an export of plan version {doc.get('plan_version') or 1}, whose splits and keys "
                f"depend on the whole episode list (--append needs plan version {PLAN_VERSION})")
    elif not {EPISODES, STATS_STATE} <= set(doc.get("files", {})):
        what = f"{out} holds an export made without episodes.msgpack and stats-state.msgpack (robowds before them)"
    if what is not None:
        raise UserError(f"cannot append: {what}", hint=FULL_EXPORT)
    side = {}
    for name in (EPISODES, STATS_STATE, *([FACTS] if FACTS in doc["files"] else [])):  # facts: none before them
        entry = doc["files"][name]
        data, path = target.read(entry["path"]) or b"", target.where(entry["path"])
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise UserError(f"cannot append: {path} is missing or not the file the manifest lists (its sha256 "
                            f"differs)", hint=FULL_EXPORT)
        side[entry["path"]] = data
    return doc, side


def _appended_facts(doc: dict[str, Any], side: dict[str, bytes], keep: set[str], records: list[dict[str, Any]],
                    fields: list[str]) -> EpisodeFacts | None:
    """The appended export's episode facts: the old file's rows of the episodes it keeps (`keep`: the
    episodes table's) and the new episodes' rows, as a full export of the grown store writes them.
    None when the old export has no facts file (made before it): its old episodes' facts are unknown
    without reading them again, so the appended export has none either (a full export writes it)."""
    if FACTS not in doc["files"]:
        return None
    path = doc["files"][FACTS]["path"]
    try:
        old = decode_facts(side[path], str(doc["files"][FACTS]["path"]))
    except ValueError as exc:
        raise UserError(f"cannot append: {exc}", hint=FULL_EXPORT) from exc
    if old.fields != fields:  # the same config and store.yaml give the same fields: a file edited by hand
        raise UserError(f"cannot append: {path} has facts of the fields {old.fields}, the export's are {fields}",
                        hint=FULL_EXPORT)
    return merged_facts(old, keep - {r["episode_id"] for r in records}, facts_of(records, fields))


def _refuse_changes(store: StoreLocation, job: Any, old: dict[str, Any], declarations: str | None,
                    recorded: str | None) -> list[str]:
    """The added episode ids, in the store's order; a UserError if an old episode changed or went."""
    if declarations != recorded:
        raise UserError("cannot append: the store's store.yaml changed since the export (its declarations apply "
                        "to every episode, so every old window may differ)", hint=FULL_EXPORT)
    exported = {ep: (e.fingerprint, e.split) for ep, e in old.items() if e.exported}
    present = [ep for ep in job.schema.episode_ids if ep in exported]
    loader = EpisodeLoader(job.schema, job.load_fields)
    current = {d.episode_id: (getattr(d, "fingerprint", None), job.splits[d.episode_id])
               for d in loader.load(read_order(job.schema, present))}  # lazily, LOAD_AHEAD at a time
    drop_row_groups()
    changes = compare_episodes(exported, current)
    bad = [*(f"{ep} (changed)" for ep in changes.changed), *(f"{ep} (removed)" for ep in changes.removed)]
    if bad:
        more = f" and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
        raise UserError(f"cannot append: {len(bad)} episode(s) of the export changed or were removed from the "
                        f"store: {', '.join(bad[:SHOWN])}{more}; nothing was written",
                        hint=f"an append only adds episodes: {FULL_EXPORT}")
    # new: not in the table at all, or rejected then (it built nothing, so it may be tried again)
    return [ep for ep in job.schema.episode_ids if ep not in exported]


def _append_id(old_job: str, source: str, added: list[str]) -> str:
    """The work folder's job id: the old export, the grown store and what is added (a re-run after a
    kill resumes it; a full export of the grown store never takes its staging for its own)."""
    doc = json.dumps({"append_to": old_job, "source": source, "added": added, "tool": __version__}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()


def _append_locked(store: StoreLocation, target: AppendOut, given: dict[str, Any] | None, keys: set[str], workers: int,
                   progress: bool, choice: ExecutorChoice, began: float) -> Summary:
    doc, side = _old_export(target)
    out = target.out
    job, resolved = out_config(store, doc["config"], str(out))
    if given is not None and keys:
        check_given(resolve(store, given)[1], keys, resolved, str(out))
    old = decode_episodes(side[doc["files"][EPISODES]["path"]])
    recorded = read_declarations(side[doc["files"][EPISODES]["path"]])
    added = _refuse_changes(store, job, old, declarations_digest(store), recorded)
    if not added:
        return Summary(out, doc["report"]["episodes"]["exported"], len(doc["report"]["episodes"]["rejected"]),
                       sum(s["samples"] for s in doc["splits"].values()),
                       sum(len(s["shards"]) for s in doc["splits"].values()),
                       sum(s["bytes"] for s in doc["splits"].values()), time.perf_counter() - began, up_to_date=True,
                       splits=doc["report"].get("splits"))
    source = fingerprint(store)
    job_id = _append_id(doc["job_id"], source, added)
    work = target.prepare(job_id)
    job = replace(job, work=str(work), source=source, released=released_windows(work))
    split_stats = SplitStats()
    split_stats.fold_states(load_stats_state(side[doc["files"][STATS_STATE]["path"]]))
    executor = choice.make(workers)
    try:
        executor.check_shared(work, job.schema.local_folders())  # tasks read these, write into work
        per_task = max(1, min(EPISODES_PER_TASK, len(added) // max(1, 4 * executor.workers)))
        with progress_bar(total=len(added), desc="episodes", unit="ep", disable=not progress) as bar:
            tasks = ((job.for_episodes(b), b) for b in _batches(read_order(job.schema, added), per_task))
            for batch in executor.map_unordered(stage_episodes, tasks):
                split_stats.fold_states(batch.stats)
                bar.update(len(batch.episode_ids))
        records = [load_record(work, job.index[ep]) for ep in added]
        failed = [r for r in records if r["error"]]
        if failed and resolved["on_bad_episode"] == "fail":
            listed = "\n  ".join(f"episode {r['episode_id']!r}: {r['error']['message']}" for r in failed[:SHOWN])
            raise UserError(f"{len(failed)} new episode(s) cannot be exported:\n  {listed}",
                            hint="fix them in the store, or append to an export made with on_bad_episode=skip")
        good = [r for r in records if not r["error"]]
        first = {split: len(entry["shards"]) for split, entry in doc["splits"].items()}
        shard_tasks = plan_shards(work, good, resolved, job.index, first_shard=first)
        release = StagingRelease(work, good, job.index, job.released)  # frees staged windows as shards land
        shard_records = reduce_shards(executor, work, shard_tasks, target.state, progress, release)  # a URL: uploads
    finally:
        executor.close()
        drop_row_groups()
    declarations = declarations_digest(store)
    check_store_unchanged(store, source, work, target.state)
    new_shards = [shard_records[t.path] for t in shard_tasks]
    saved = load_report_parts(side[doc["files"][STATS_STATE]["path"]])  # None: an export before them
    parts = None if saved is None else merge_parts(saved, report_parts(records))
    manifest = merged_manifest(doc, job=job, resolved=resolved, records=records, shards=new_shards,
                               source=source, job_id=job_id, split_stats=split_stats, parts=parts)
    entries = [e for e in old.values() if e.exported or e.episode_id not in added] + episode_entries(records)
    facts = _appended_facts(doc, side, {e.episode_id for e in entries}, records, fact_fields(job))
    side_data, manifest["files"] = side_files_of(entries, split_stats.result(), declarations, parts, facts)
    # the grown splits' key indexes (job/key_index.py): the old index's hashes, then the new shards'
    keys, listed = key_index_files(work, manifest, {t.path: t.entries for t in shard_tasks},
                                   old_key_hashes(target.read, doc))
    side_data, manifest["files"] = {**side_data, **keys}, {**manifest["files"], **listed}
    kept = target.publish(work, manifest, side_data)
    report = manifest["report"]
    return Summary(out, len(good), len(failed), sum(r["samples"] for r in new_shards), len(new_shards),
                   sum(r["bytes"] for r in new_shards), time.perf_counter() - began,
                   sum(r["report"]["dropped_min_valid"] for r in good),
                   warnings=(*report_warnings(report, resolved["splits"]), *kept), splits=report["splits"],
                   appended=True)
