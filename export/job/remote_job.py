"""The export job into object storage (OUT = `s3://bucket/prefix`): resume from what is uploaded, upload
finished shards, publish with the manifest last.

Why it differs from the local job (`run.py`, `output/publish.py`): an object store has no rename and a PUT
is atomic per object, so the work folder (staged episodes, shards being written) stays on a local
disk (`--work-dir`), and each finished shard is uploaded to its final key as soon as it is written,
then deleted locally. What lives under the URL:

- `.robowds-work/job.json`: {"job_id"}; the objects recorded below belong to that job;
- `.robowds-work/uploaded/<split>__shard-N.tar.json`: written just before the shard's `.tar.idx` and
  then the shard are uploaded: the shard's manifest record (samples, bytes, sha256, index_sha256), the
  index size and the two keys. It marks those keys as this job's (a killed run's objects are never
  taken for a user's), and since a PUT is atomic, an object under such a key with the recorded size is
  complete. A re-run (even on another machine, with the local work folder lost) skips every shard
  whose two objects are there with the recorded sizes: it stages the episodes again (the statistics
  need them) but neither writes nor uploads those shards again;
- `.robowds-work/ready/<path>`: a shard (or index) whose final key the export being replaced
  still lists: uploading it there keeps the old export intact and readable until publish;
- `.robowds-work/ready/<side file>` (`episodes.msgpack`, `stats-state.msgpack`, `episode-facts.msgpack`:
  `job/side_files.py`):
  always staged, and copied to its key by publish like a staged shard;
- `.robowds-work/ready/manifest.json` and `.robowds-work/publish.json`: publish's plan. The journal
  is the commit point: once it exists, any later `export` into the URL finishes that publish first.

Publish: delete the old manifest (if any), copy the staged objects to their final keys (server-side),
PUT `<split>.wids.json` and `.nv-meta/*`, delete the old export's files the new one lacks, PUT the
manifest last, delete `.robowds-work/` (the journal last). Readers therefore see the old export, then
(only while an old export is replaced) no manifest, then the new one: a manifest only ever lists
objects that exist with the sha256 it lists. Ownership is output/publish.py's rule: only what the old
manifest lists (and `.nv-meta/` files whose bytes robowds wrote), what this job's records name, and
`.robowds-work/` are ever replaced or deleted; an object in the way of the new export stops the job
before the first upload.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robowds.export.errors import UserError
from robowds.export.executors.executor import Executor
from robowds.export.job.report import other_export
from robowds.export.job.shards import ShardTask, check_shard_space, write_shard
from robowds.export.job.side_files import PATHS as SIDE_PATHS
from robowds.export.job.staging_release import StagingRelease
from robowds.export.output.energon import FILES as ENERGON_FILES
from robowds.export.output.energon import NV_META, energon_files
from robowds.export.output.out_lock import LOCK_NAME
from robowds.export.output.publish import READY, WORK_DIR, nv_meta_warnings, owned_files, shard_indexes, wids_index
from robowds.export.output.remote_out import RemoteOut
from robowds.export.progress import progress_bar
from robowds.reader.manifest import (INDEX_SUFFIX, MANIFEST_NAME, ManifestError, dump_manifest, parse_manifest,
                                     safe_relative)

WORK = WORK_DIR
JOB = f"{WORK}/job.json"
UPLOADED = f"{WORK}/uploaded"
STAGED = f"{WORK}/{READY}"
JOURNAL = f"{WORK}/publish.json"
UPLOAD_THREADS = 4  # concurrent uploads from the main process (I/O bound: threads, not processes)
UPLOADS_QUEUED = 2 * UPLOAD_THREADS  # written shards waiting for or in upload, at most: local disk they hold


@dataclass
class RemoteState:
    """What a prepared remote job knows at its start (one listing, one GET per upload record)."""

    out: RemoteOut
    job_id: str
    old: dict[str, Any] | None  # the manifest of the export being replaced
    listing: dict[str, int]  # relative path -> size, at the start (after a discarded job was cleaned)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)  # shard path -> upload record
    replaceable: set[str] = field(default_factory=set)  # paths the old export owns: uploads are staged

    def target(self, rel: str) -> str:
        """Where `rel` is uploaded: its final key, or staged while the old export lists that key."""
        return f"{STAGED}/{rel}" if rel in self.replaceable else rel


def default_work_root() -> Path:
    """Where remote jobs keep their local work folders unless `--work-dir` says otherwise:
    `$XDG_CACHE_HOME/robowds/work` (`~/.cache/robowds/work`)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "robowds" / "work"


def local_work_dir(root: Path | None, job_id: str, url: str) -> Path:
    """`<root>/<id>`: one folder per (job, URL), so two exports of the same store to two URLs never
    share staging; removed after a successful publish (never `root` itself, which may be the user's)."""
    key = hashlib.sha256(f"{job_id}|{url}".encode()).hexdigest()[:32]
    return Path(root or default_work_root()).expanduser().resolve() / key


def _record_path(shard: str) -> str:
    return f"{UPLOADED}/{shard.replace('/', '__')}.json"


def read_remote_manifest(out: RemoteOut) -> dict[str, Any] | None:
    data = out.get(MANIFEST_NAME)
    if data is None:
        return None
    try:
        return parse_manifest(data, out.where(MANIFEST_NAME))
    except (ManifestError, ValueError) as exc:
        raise UserError(f"{out.where(MANIFEST_NAME)} is not a robowds manifest robowds can read ({exc}): robowds "
                        f"replaces only an export it wrote", hint="choose another output URL, or delete that "
                        "object if it is not a robowds export") from exc


def _load_records(out: RemoteOut, listing: dict[str, int]) -> dict[str, dict[str, Any]]:
    """This job's upload records (one small GET each, in threads: thousands of shards take seconds)."""
    names = sorted(rel for rel in listing if rel.startswith(UPLOADED + "/") and rel.endswith(".json"))
    with ThreadPoolExecutor(UPLOAD_THREADS * 2) as pool:
        docs = list(pool.map(out.get, names))
    records = {}
    for doc in docs:
        try:
            record = json.loads(doc) if doc else None
            for key in ("shard_key", "index_key"):
                safe_relative(record[key])  # never a key outside the prefix, whatever the record says
            records[safe_relative(record["shard"]["path"])] = record
        except (ValueError, KeyError, TypeError, ManifestError):
            continue  # unreadable: that shard is simply uploaded again, and its keys are not taken as ours
    return records


def _clear_work(out: RemoteOut, listing: dict[str, int]) -> None:
    """Delete `.robowds-work/` under the URL; the job file and the journal last, so a half-deleted
    work prefix is never taken for a live job or a pending publish."""
    rels = sorted(rel for rel in listing if rel.startswith(WORK + "/"))
    last = [rel for rel in (JOB, JOURNAL) if rel in listing]
    out.delete([rel for rel in rels if rel not in last])
    out.delete(last)


def _discard(out: RemoteOut, old: dict[str, Any] | None, listing: dict[str, int]) -> None:
    """Give up a partial upload of another job: its objects no manifest lists (ours: its records name
    them), then its work prefix."""
    listed = set(owned_files(old)) if old is not None else set()
    ours = []
    for record in _load_records(out, listing).values():
        for rel in (record.get("shard_key"), record.get("index_key")):
            if isinstance(rel, str) and not rel.startswith(WORK + "/") and rel not in listed and rel in listing:
                ours.append(rel)
    out.delete(sorted(set(ours)))
    _clear_work(out, listing)


def abandon_remote(state: RemoteState) -> None:
    """Give up this job's uploads (its store changed under it): what it uploaded that no manifest
    lists, and its work prefix; the old export, if any, stays as it is."""
    _discard(state.out, state.old, state.out.listing())


def _job_of(doc: bytes | None) -> str | None:
    """The job id in a `job.json`; None when it is missing or damaged (then its work is discarded)."""
    try:
        found = json.loads(doc) if doc else None
    except ValueError:
        return None
    return found.get("job_id") if isinstance(found, dict) else None


def _listing_without_lock(out: RemoteOut) -> dict[str, int]:
    """What is under the URL but the lock object this job holds (`output/remote_lock.py`)."""
    return {rel: size for rel, size in out.listing().items() if rel != LOCK_NAME}


def prepare_remote(out: RemoteOut, job_id: str, overwrite: bool) -> RemoteState | dict[str, Any]:
    """Decide whether the URL may take this export before changing anything there (the rules of the
    local `_prepare_out`); returns the job's state, or the manifest of a finished export of this job."""
    finished = finish_remote_publish(out)
    listing = _listing_without_lock(out)
    old = read_remote_manifest(out)
    work = {rel for rel in listing if rel.startswith(WORK + "/")}
    if old is None and JOB not in work and len(work) < len(listing):
        raise UserError(f"{out.url} is not empty and holds no robowds export",
                        hint="choose an empty or new prefix (robowds never replaces objects it did not write)")
    if old is not None and old.get("job_id") != job_id and not overwrite:
        raise other_export(out.url, old, "pass --overwrite to replace it, or choose another output URL")
    same_job = JOB in work and _job_of(out.get(JOB)) == job_id
    if work and not same_job:
        _discard(out, old, listing)  # a partial upload of another store/config: useless
        listing, work = _listing_without_lock(out), set()
    if old is not None and old.get("job_id") == job_id and (finished or not overwrite):
        _clear_work(out, listing)
        return old
    out.put(JOB, json.dumps({"job_id": job_id}).encode())  # the first write: no permission fails here
    replaceable = (set(owned_files(old)) | shard_indexes(old)) if old is not None else set()
    return RemoteState(out, job_id, old, listing, _load_records(out, listing) if same_job else {}, replaceable)


def pending(state: RemoteState, tasks: list[ShardTask]) -> tuple[list[ShardTask], dict[str, dict[str, Any]]]:
    """(the shard tasks still to write and upload, the records of those already uploaded); refuses
    before any upload when an object robowds does not own is where the new export must go."""
    ours = {rel for r in state.records.values() for rel in (r.get("shard_key"), r.get("index_key"))}
    new = [rel for t in tasks for rel in (t.path, t.path + INDEX_SUFFIX)]
    new += [f"{split}.wids.json" for split in sorted({t.split for t in tasks})] + sorted(SIDE_PATHS.values())
    blocked = [rel for rel in new if rel in state.listing and rel not in state.replaceable and rel not in ours]
    if blocked:
        shown = ", ".join(blocked[:5]) + (f" and {len(blocked) - 5} more" if len(blocked) > 5 else "")
        raise UserError(f"{len(blocked)} object(s) under {state.out.url} are in the way of the new export and no "
                        f"robowds manifest lists them: {shown}",
                        hint="robowds never replaces objects it did not write: move them away and re-run the same "
                             "command (what is uploaded is kept)")
    done: dict[str, dict[str, Any]] = {}
    for task in tasks:
        record = state.records.get(task.path)
        if (record is not None and record.get("shard_key") == state.target(task.path)
                and state.listing.get(record["shard_key"]) == record["shard"]["bytes"]
                and state.listing.get(record.get("index_key", "")) == record.get("index_bytes")):
            done[task.path] = record["shard"]
    return [t for t in tasks if t.path not in done], done


class Uploader:
    """Uploads finished shards (record, index, shard) in a few threads of the main
    process while the reduce goes on, and deletes each local copy once uploaded: the local disk then
    holds only the shards in flight, not a second copy of the export."""

    def __init__(self, state: RemoteState, work: Path, total: int, progress: bool) -> None:
        self.state, self.work = state, work
        self._pool = ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="robowds-upload")
        self._futures: list[Future[None]] = []  # not yet known to have succeeded: at most UPLOADS_QUEUED
        self._bar = progress_bar(total=total, desc="uploads", unit="shard", disable=not progress)

    def submit(self, record: dict[str, Any]) -> None:
        """Queue a written shard's upload; waits while UPLOADS_QUEUED are queued, so a reduce faster
        than the uploads never piles shards up on the local disk (the space check counts on it)."""
        self._raise_failed()  # a failed upload stops the job at the next shard, not at the end
        while len(self._futures) >= UPLOADS_QUEUED:
            wait(self._futures, return_when=FIRST_COMPLETED)
            self._raise_failed()
        self._futures.append(self._pool.submit(self._upload, dict(record)))

    def _upload(self, record: dict[str, Any]) -> None:
        out, path = self.state.out, record["path"]
        shard, index = self.work / READY / path, self.work / READY / (path + INDEX_SUFFIX)
        shard_key, index_key = self.state.target(path), self.state.target(path + INDEX_SUFFIX)
        doc = {"shard": record, "shard_key": shard_key, "index_key": index_key, "index_bytes": index.stat().st_size}
        out.put(_record_path(path), json.dumps(doc, sort_keys=True).encode())  # first: the keys are ours
        out.upload(index, index_key)  # the index before the shard: a shard under its key has its index
        out.upload(shard, shard_key)
        shard.unlink()
        index.unlink()
        self._bar.update(1)

    def _raise_failed(self) -> None:
        for future in self._futures:
            if future.done() and future.exception() is not None:
                self.close()
                raise future.exception()  # type: ignore[misc]
        self._futures = [f for f in self._futures if not f.done()]  # the done ones succeeded

    def wait(self) -> None:
        """Every upload finished; the first failure is raised (the others are cancelled)."""
        try:
            for future in self._futures:
                future.result()
        finally:
            self.close()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._bar.close()


def reduce_shards(executor: Executor, work: Path, tasks: list[ShardTask], state: RemoteState | None,
                  progress: bool, release: StagingRelease) -> dict[str, dict[str, Any]]:
    """The reduce of an export or an append: write the shards of `tasks` (`shards.write_shard`) into
    `work/ready/`; returns each shard's record by its path. With `state` (OUT at a URL) a shard a killed
    run uploaded is neither written nor uploaded again (`pending`), and each shard is uploaded as soon
    as it is written, then deleted here: the disk holds the shards in flight and those queued for
    upload, never the whole export twice (the space check asks for that much only). `release` frees
    each written shard's windows in the staging files (`staging_release.py`)."""
    todo, records = pending(state, tasks) if state else (tasks, {})
    check_shard_space(work, todo, executor.in_flight + UPLOADS_QUEUED if state else None)
    uploads = Uploader(state, work, len(todo), progress) if state else None
    try:
        with progress_bar(total=len(todo), desc="shards", unit="shard", disable=not progress) as bar:
            entries = {t.path: t.entries for t in todo}
            for rec in executor.map_unordered(write_shard, todo):
                records[rec["path"]] = rec
                release.shard_done(entries[rec["path"]], work / READY / rec["path"])  # before its upload deletes it
                bar.update(1)
                if uploads:
                    uploads.submit(rec)  # uploaded while the next shards are written
        if uploads:
            uploads.wait()
    finally:
        if uploads:
            uploads.close()
    return records


def publish_remote(state: RemoteState, manifest: dict[str, Any], side: dict[str, bytes] | None = None) -> list[str]:
    """Write publish's plan under the URL, then carry it out (module docstring); returns warnings
    (`.nv-meta/` objects of the user's, kept). `side`: the side files the manifest lists under `files`
    (path -> bytes, `job/side_files.py`): staged under `.robowds-work/ready/` before the journal and
    copied into place with the shards, so a re-run finishes the publish without them in memory."""
    out, old, listing = state.out, state.old, state.listing
    side = side or {}
    blocked = [rel for rel in side if rel in listing and rel not in state.replaceable]
    if blocked:
        raise UserError(f"{len(blocked)} object(s) under {out.url} are in the way of the new export and no robowds "
                        f"manifest lists them: {', '.join(blocked)}",
                        hint="robowds never replaces objects it did not write: move them away and re-run the same "
                             "command (what is uploaded is kept)")
    for rel, data in side.items():
        out.put(f"{STAGED}/{rel}", data)
    meta = energon_files(manifest)
    ours_meta = ({rel for rel, data in energon_files(old).items() if rel in listing and out.get(rel) == data}
                 if old is not None else set())
    kept = [rel for rel in meta if rel in listing and rel not in ours_meta]
    others = sorted(rel for rel in listing if rel.startswith(NV_META + "/") and rel not in ENERGON_FILES)
    warnings = nv_meta_warnings(out.url, kept, others if old is not None else [])
    new = owned_files(manifest)
    wids = [f"{split}.wids.json" for split in sorted(manifest["splits"])]
    staged = [rel for rel in new if rel != MANIFEST_NAME and rel not in wids and rel in state.replaceable]
    owned = set(owned_files(old)) if old is not None else set()
    journal = {"copy": staged + [rel for rel in side if rel not in staged], "put": wids + [rel for rel in meta if rel not in kept],
               "remove": sorted(owned - set(new))}
    out.put(f"{STAGED}/{MANIFEST_NAME}", dump_manifest(manifest))
    out.put(JOURNAL, json.dumps(journal).encode())  # the commit point
    finish_remote_publish(out)
    return warnings


def finish_remote_publish(out: RemoteOut) -> bool:
    """Carry out the journaled publish under the URL, if there is one; returns whether there was.
    Idempotent: every step is a copy, PUT or delete of bytes fixed by the journal and the staged
    manifest, so a run killed at any point is finished by the next one, to the same bytes."""
    data = out.get(JOURNAL)
    if data is None:
        return False
    doc = json.loads(data)
    listing = out.listing()
    staged_manifest = f"{STAGED}/{MANIFEST_NAME}"
    if staged_manifest in listing:
        manifest_bytes = out.get(staged_manifest)
        out.delete([MANIFEST_NAME])  # nothing stale stays listed while the old files are replaced
    else:  # the new manifest is already in place
        manifest_bytes = out.get(MANIFEST_NAME)
    if manifest_bytes is None:
        raise UserError(f"the publish journal under {out.url} has no manifest to publish (objects of "
                        f"{out.where(WORK)} were deleted by hand?)",
                        hint=f"delete {out.where(WORK)} and re-run the export with --overwrite")
    manifest = parse_manifest(manifest_bytes, out.where(MANIFEST_NAME))
    for rel in doc["copy"]:
        if f"{STAGED}/{rel}" in listing:
            out.copy(f"{STAGED}/{rel}", rel)
    small = {**{f"{s}.wids.json": wids_index(s, e) for s, e in manifest["splits"].items()}, **energon_files(manifest)}
    for rel in doc["put"]:
        out.put(rel, small[rel])
    out.delete(list(doc["remove"]))
    if staged_manifest in listing:
        out.put(MANIFEST_NAME, manifest_bytes)
    _clear_work(out, out.listing(WORK) | {JOURNAL: 0})
    return True
