"""The export job: plan -> map (stage episodes) -> reduce (write shards) -> publish (into OUT).

Atomicity and resume: every step's output appears under its final name by rename (after fsync, except
staged episodes, which carry a checksum instead: stage.py), and a step is done iff that name exists.
Everything up to publish lives in `OUT/.robowds-work/` (keyed by a job id over the store fingerprint
and the resolved config): staged episodes (`stage.py`), and finished shards in `ready/` (`shards.py`),
so an export already in OUT stays intact and readable while the new one is built. Publish (`output/publish.py`) then moves the new export into place by a journaled sequence of
renames with the manifest last, so nothing half-written is ever listed. A re-run after SIGKILL skips
finished steps and, because every step is deterministic, ends byte-identical.

One export at a time: the job holds OUT's lock (`output/out_lock.py`; an output URL's lock object,
`output/remote_lock.py`) from before it looks at OUT until it returns, and before publishing it takes the
store's fingerprint again (`check_store_unchanged`): a store changed while it was read publishes nothing.

What the work folder holds tells which phase a run reached (the SIGKILL test in
tests/test_export_e2e.py reads it so): `job.json` from the start; map: `ep-N.bin` / `ep-N.rec` per
staged episode; reduce: `shards/*.json` records, `tmp/` temp shards, `ready/<split>/shard-N.tar`;
publish: `ready/<split>.wids.json`, the side files (`ready/episodes.msgpack`, `ready/stats-state.msgpack`,
`ready/episode-facts.msgpack`: `job/side_files.py`), `ready/.nv-meta/*` (Energon's metadata) and `ready/manifest.json`, then the
journal `publish.json`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

from robowds.export import __version__
from robowds.export.core.shard_plan import PLAN_VERSION
from robowds.export.errors import UserError
from robowds.export.executors.executor import LOCAL, ExecutorChoice
from robowds.export.executors.profile import JobProfile
from robowds.export.job.config import snap_notes
from robowds.export.job.key_index import key_index_files
from robowds.export.job.remote_job import (RemoteState, abandon_remote, default_work_root, local_work_dir,
                                           prepare_remote, publish_remote, reduce_shards)
from robowds.export.job.report import SplitStats, build_manifest, other_export, report_warnings
from robowds.export.job.shards import plan_shards
from robowds.export.job.episode_facts import fact_fields
from robowds.export.job.side_files import side_files
from robowds.export.job.spec import JobSpec, resolve
from robowds.export.job.stage import load_record, stage_episodes
from robowds.export.job.staging_release import StagingRelease, released_windows
from robowds.export.output.fsio import fsync_write
from robowds.export.output.oserrors import os_error, work_note
from robowds.export.output.out_lock import LOCK_NAME, OutLock
from robowds.export.output.publish import JOB_FILE, READY, WORK_DIR, finish_publish, publish, read_manifest, remove_work
from robowds.export.output.remote_lock import RemoteLock
from robowds.export.output.remote_out import RemoteOut, is_url
from robowds.export.progress import progress_bar
from robowds.export.store.declarations import STORE_YAML
from robowds.export.store.episode_identity import declarations_digest
from robowds.export.store.fingerprint import fingerprint
from robowds.export.store.location import StoreLocation, store_location
from robowds.export.store.row_stream import drop_row_groups, read_order

EPISODES_PER_TASK = 8


@dataclass(frozen=True)
class Summary:
    out: Path | str  # a folder, or the URL of a remote export
    episodes: int
    rejected: int
    windows: int
    shards: int
    bytes: int
    seconds: float
    dropped: int = 0  # windows below min_valid_fraction
    up_to_date: bool = False
    warnings: tuple[str, ...] = ()  # what the report holds that a user must not miss
    notes: tuple[str, ...] = ()  # what the export took differently from the config's letter (snapped offsets)
    profile: dict[str, Any] | None = None  # CPU and wall seconds per phase (JobProfile.to_json)
    # split -> {"episodes", "windows"}: what each split really got (the manifest's report.splits); fractions
    # hold in expectation only (shard_plan.assign_splits), so the counts are shown, not assumed
    splits: dict[str, dict[str, int]] | None = None
    # `export --append` (job/append.py): the counts above are the appended episodes'; `splits` is the
    # whole export's, as its report has it
    appended: bool = False

    def to_json(self) -> dict[str, Any]:
        """What `export --json` prints."""
        return {"out": str(self.out), "up_to_date": self.up_to_date, "episodes": self.episodes,
                "rejected": self.rejected, "windows": self.windows, "dropped_min_valid": self.dropped,
                "shards": self.shards, "bytes": self.bytes, "seconds": round(self.seconds, 3),
                "splits": self.splits or {}, "warnings": list(self.warnings),
                **({"appended": True} if self.appended else {}),
                **({"notes": list(self.notes)} if self.notes else {})}

    def line(self) -> str:
        if self.up_to_date:
            return f"{self.out}: export is up to date ({self.windows} windows in {self.shards} shards); nothing to do"
        dropped = f" ({self.dropped} below min_valid_fraction, not emitted)" if self.dropped else ""
        warning = ""
        if self.splits and len(self.splits) > 1:  # one split: the line above says it all
            warning = "\nsplits: " + ", ".join(f"{name} {c['episodes']} episode{'s' * (c['episodes'] != 1)} "
                                                 f"({c['windows']} windows)" for name, c in self.splits.items())
        warning += "\nwarning: no window was emitted; check the window config" if not self.windows else ""
        warning += "".join(f"\nwarning: {w}" for w in self.warnings)
        warning += "".join(f"\nnote: {n}" for n in self.notes)
        verb = "appended" if self.appended else "exported"
        return (f"{verb} {self.episodes} episodes ({self.rejected} rejected) -> {self.windows} windows{dropped} in "
                f"{self.shards} shards, {self.bytes / 1e6:.1f} MB, in {self.seconds:.1f} s -> {self.out}{warning}")


def _job_id(fingerprint_hex: str, resolved: dict[str, Any]) -> str:
    """The export's identity: store fingerprint, resolved config, tool version and `PLAN_VERSION` (how
    splits and keys are drawn), so an export planned by an older rule (robowds before plan 2 drew
    splits from a permutation of all ids) is neither found up to date nor resumed: it is rebuilt."""
    doc = json.dumps({"source": fingerprint_hex, "config": resolved, "tool": __version__, "plan": PLAN_VERSION},
                     sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()


def _prepare_out(out: Path, job_id: str, overwrite: bool) -> Path | dict[str, Any]:
    """Decide whether OUT may take this export before anything in it changes.

    Returns the work dir to use, or the manifest of a finished export of this very job. OUT is accepted
    if it is empty or new, or holds a robowds export (its manifest) or robowds work folder, whatever
    else the user keeps in it; files of the old export are replaced only by `publish`, at the end.
    """
    work = out / WORK_DIR
    if out.exists() and not out.is_dir():
        raise UserError(f"output folder {out} is a file", hint="choose an empty or new folder")
    finished = finish_publish(out, work)  # a publish killed midway is completed first: its journal is ours
    doc = read_manifest(out)
    if doc is None and not work.is_dir() and out.exists() and any(p.name != LOCK_NAME for p in out.iterdir()):
        raise UserError(f"output folder {out} is not empty and holds no robowds export",
                        hint="choose an empty or new folder (robowds never replaces files it did not write)")
    if doc is not None and doc.get("job_id") == job_id and (finished or not overwrite):
        remove_work(work)
        return doc
    if doc is not None and doc.get("job_id") != job_id and not overwrite:
        raise other_export(str(out), doc, "pass --overwrite to replace it, or choose another output folder")
    return _prepare_work(work, job_id)


def _prepare_work(work: Path, job_id: str) -> Path:
    """The work folder for `job_id`: kept if it is this job's (resume), else emptied; temp files gone."""
    job_file = work / JOB_FILE
    if work.is_dir() and (not job_file.exists() or json.loads(job_file.read_text()).get("job_id") != job_id):
        remove_work(work)  # a partial export of another store/config, or a half-deleted one: useless
    for sub in ("shards", "tmp", READY):
        (work / sub).mkdir(parents=True, exist_ok=True)
    for stale in work.rglob("*.tmp-*"):
        stale.unlink()  # left by a killed run; every step rewrites its temp file from scratch
    fsync_write(job_file, json.dumps({"job_id": job_id}).encode())
    return work


def _prepare_remote_out(remote: RemoteOut, job_id: str, overwrite: bool,
                        work_dir: Path | None) -> tuple[Path | dict[str, Any], RemoteState | None]:
    """`_prepare_out` for OUT at a URL: (local work folder, remote state), or (finished manifest, None)."""
    state = prepare_remote(remote, job_id, overwrite)
    work = local_work_dir(work_dir, job_id, remote.url)
    if isinstance(state, dict):
        remove_work(work)  # a killed run's staging of an export that is complete now
        return state, None
    return _prepare_work(work, job_id), state


def break_lock_error(out: Path | str) -> UserError:
    """`--break-lock` with OUT a folder: there is nothing to break (an export or append into a URL only)."""
    return UserError(f"--break-lock is for an output URL; {out} is a folder, whose lock the system frees when "
                     f"its export dies (a held one belongs to a running export)", hint="drop --break-lock")


def _batches(items: list[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def run_export(store: Path | str | StoreLocation, out: Path | str, config: dict[str, Any], workers: int = 1,
               overwrite: bool = False, progress: bool = True, executor: ExecutorChoice = LOCAL,
               out_storage_options: dict[str, Any] | None = None, work_dir: Path | None = None,
               break_lock: bool = False) -> Summary:
    """`executor` picks where the tasks run (the bytes are the same for every choice); `workers` is the
    process pool's size, or the CPUs of a new local Ray instance. `store`: a folder, or a `StoreLocation`
    (an fsspec URL and its storage options: `store_location("s3://bucket/store", {...})`). `out`: a folder,
    or an fsspec URL string (`"s3://bucket/prefix"`, with `out_storage_options`), whose job works in a local
    folder under `work_dir` (default: the user's cache; `remote_job.local_work_dir`). The job holds OUT's
    lock (`output/out_lock.py`, `output/remote_lock.py`) from before it looks at OUT until it returns; `break_lock`
    (an output URL only) first deletes a lock a crashed export on another machine left there."""
    began, profile = time.perf_counter(), JobProfile()
    executor.check_available()  # before anything is written
    remote = RemoteOut(str(out), out_storage_options) if is_url(out) else None
    if break_lock and remote is None:
        raise break_lock_error(out)
    store, out = store_location(store), (out if remote else Path(out).resolve())
    if store.local and remote is None:
        store = StoreLocation(str(store.path.resolve()))
        if out == store.path or store.path in out.parents:  # the store's fingerprint would change with every run
            raise UserError(f"output folder {out} must not be inside the store", hint="choose a folder elsewhere")
    job, resolved = resolve(store, config)
    notes = tuple(snap_notes(config, resolved))
    source = fingerprint(store)
    job_id = _job_id(source, resolved)
    lock: OutLock | RemoteLock = OutLock(out) if remote is None else RemoteLock(remote, break_lock)
    try:
        try:
            lock.acquire()  # inside: a Ctrl-C while its PUT is in flight still deletes the lock object
        except OSError as exc:  # OUT under a file, read-only, no permission
            raise os_error(exc, "export", out) from exc
        summary = _export_locked(store, out, remote, config, job, resolved, source, job_id, workers, overwrite,
                                 progress, executor, work_dir, began, profile, notes)
    except BaseException:
        with contextlib.suppress(Exception):  # the export's own error is the one to report
            lock.release()
        raise
    lock.release()
    return summary


def _export_locked(store: StoreLocation, out: Path | str, remote: RemoteOut | None, config: dict[str, Any],
                   job: JobSpec, resolved: dict[str, Any], source: str, job_id: str, workers: int,
                   overwrite: bool, progress: bool, executor: ExecutorChoice, work_dir: Path | None,
                   began: float, profile: JobProfile, notes: tuple[str, ...]) -> Summary:
    """`run_export` once it holds OUT's lock: prepare OUT (or find it up to date), then run the job."""
    try:
        work, state = (_prepare_out(out, job_id, overwrite), None) if remote is None else \
            _prepare_remote_out(remote, job_id, overwrite, work_dir)
    except OSError as exc:  # OUT (a remote job's work folder) under a file, read-only, no permission, disk full
        raise os_error(exc, "export", out if remote is None else Path(work_dir or default_work_root())) from exc
    if isinstance(work, dict):  # up to date: the finished manifest
        doc = work
        shards = sum(len(s["shards"]) for s in doc["splits"].values())
        windows = sum(s["samples"] for s in doc["splits"].values())
        return Summary(out, doc["report"]["episodes"]["exported"], len(doc["report"]["episodes"]["rejected"]),
                       windows, shards, sum(s["bytes"] for s in doc["splits"].values()), time.perf_counter() - began, up_to_date=True,
                       notes=notes, splits=doc["report"].get("splits"))
    job = replace(job, work=str(work), source=source, released=released_windows(work))
    try:
        return replace(_run(job, resolved, config, source, job_id, out, work, workers, progress, began, executor,
                            profile, state, store), notes=notes)
    except OSError as exc:
        raise os_error(exc, "export", out if remote is None else work, work) from exc
    except UserError as exc:
        note = work_note(work)
        if not note or str(work) in (exc.hint or ""):
            raise
        raise UserError(exc.message, hint="; ".join(filter(None, [exc.hint, note])), exit_code=exc.exit_code) from exc


def check_store_unchanged(store: StoreLocation, source: str, work: Path, remote: RemoteState | None) -> None:
    """Refuse to publish when the store changed while the job read it: the windows could then hold
    new data under a manifest whose `source` fingerprint names the old store (or a mix of both).

    Called once every task has read what it needs, so equal fingerprints mean every read saw the
    store the manifest names. What the job built is discarded (the local work folder; with an output
    URL, the objects it uploaded that no manifest lists): it is keyed by the old fingerprint, and a
    re-run against a store changed back would otherwise resume from episodes staged from the new
    data. Cost: one more read of the store's tables and one listing of its files (media files count
    by path and size, `store/fingerprint.py`), small next to the export's reads of the media."""
    now = fingerprint(store)
    if now == source:
        return
    if remote is not None:
        abandon_remote(remote)
    remove_work(work)
    raise UserError(f"store {store} changed during the export (its fingerprint went from {source[:12]} to "
                    f"{now[:12]}: a table, {STORE_YAML} or a media file's size differs), so the windows could mix "
                    f"old and new data; nothing was published and the output is as it was before",
                    hint="re-run the export once nothing writes to the store any more (this run's work was "
                         "discarded: it read both versions)")


def _run(job: JobSpec, resolved: dict[str, Any], config: dict[str, Any], source: str, job_id: str, out: Path | str,
         work: Path, workers: int, progress: bool, began: float, choice: ExecutorChoice,
         profile: JobProfile, remote: RemoteState | None, store: StoreLocation) -> Summary:
    """Map, reduce and publish into a prepared work folder (and with `remote`, upload and publish there)."""
    schema = job.schema
    profile.lap("plan")  # resolve, fingerprint, prepare OUT
    executor = choice.make(workers)
    usage = getattr(executor, "usage", None)  # backends that account for their tasks' CPU time
    try:
        executor.check_shared(work, schema.local_folders())  # tasks read these, write into work
        ids = schema.episode_ids
        per_task = max(1, min(EPISODES_PER_TASK, len(ids) // max(1, 4 * executor.workers)))
        split_stats = SplitStats()  # one state per split and field, folded batch by batch as tasks finish
        with progress_bar(total=len(ids), desc="episodes", unit="ep", disable=not progress) as bar:
            # batches in the tables' row order, so each worker reads a table forward, once per job
            # (row_stream.py); which episodes share a batch does not change a byte of the output
            batches = _batches(read_order(schema, ids), per_task)
            tasks = ((job.for_episodes(b), b) for b in batches)  # O(batch) each, made as sent
            for batch in executor.map_unordered(stage_episodes, tasks):
                split_stats.fold_states(batch.stats)  # the batch's statistics, folded by its task
                bar.update(len(batch.episode_ids))
        profile.lap("map", usage)
        records = [load_record(work, job.index[ep]) for ep in ids]
        failed = [r for r in records if r["error"]]
        if failed and config["on_bad_episode"] == "fail":
            listed = "\n  ".join(f"episode {r['episode_id']!r}" + (f", field {r['error']['field']!r}" if
                                 r["error"]["field"] else "") + f": {r['error']['message']}" for r in failed[:20])
            hints = list(dict.fromkeys(r["error"]["hint"] for r in failed if r["error"]["hint"]))[:3]
            raise UserError(f"{len(failed)} episode(s) cannot be exported:\n  {listed}",
                            hint="; ".join([*hints, "fix them in the store, or pass --set on_bad_episode=skip "
                                                    "to leave them out"]))
        good = [r for r in records if not r["error"]]
        profile.lap("records")
        tasks = plan_shards(work, good, config, job.index)
        profile.lap("shard plan")
        release = StagingRelease(work, good, job.index, job.released)  # frees staged windows as shards land
        shard_records = reduce_shards(executor, work, tasks, remote, progress, release)
        profile.lap("reduce", usage)
    finally:
        executor.close()
        drop_row_groups()  # the cursors in-process tasks kept (pool workers are gone with theirs)
    profile.lap("pool close")
    declarations = declarations_digest(store)  # before the check: a store.yaml changed since is caught there
    check_store_unchanged(store, source, work, remote)
    profile.lap("store check")
    manifest = build_manifest(schema=schema, job=job, resolved=resolved, records=records,
                              shards=[shard_records[t.path] for t in tasks], source=source, job_id=job_id,
                              split_stats=split_stats)
    # for append, verify and the report (episode-facts.msgpack)
    side, manifest["files"] = side_files(records, split_stats.result(), declarations, fact_fields(job))
    # each split's key index, for ShardIndex.by_key (job/key_index.py)
    keys, listed = key_index_files(work, manifest, {t.path: t.entries for t in tasks})
    side, manifest["files"] = {**side, **keys}, {**manifest["files"], **listed}
    kept = publish(out, work, manifest, side) if remote is None else publish_remote(remote, manifest, side)
    if remote is not None:
        remove_work(work)
    profile.lap("manifest")
    total_bytes = sum(r["bytes"] for r in shard_records.values())
    return Summary(out, len(good), len(failed), sum(r["samples"] for r in shard_records.values()), len(tasks),
                   total_bytes, time.perf_counter() - began, manifest["report"]["windows"]["dropped_min_valid"],
                   warnings=(*report_warnings(manifest["report"], manifest["config"]["splits"]), *kept),
                   profile=profile.to_json(), splits=manifest["report"]["splits"])
