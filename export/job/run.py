"""The export job: plan -> map (stage episodes) -> reduce (write shards) -> publish (into OUT).

Atomicity and resume: every step's output appears under its final name by rename after fsync, and a
step is done iff that name exists. Everything up to publish lives in `OUT/.robowds-work/` (keyed by a
job id over the store fingerprint and the resolved config): staged episodes, and finished shards in
`ready/`, so an export already in OUT stays intact and readable while the new one is built. Publish
(`export/job/publish.py`) then moves the new export into place by a journaled sequence of renames with the
manifest last, so nothing half-written is ever listed. A re-run after SIGKILL skips finished steps
and, because every step is deterministic, ends byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

import msgpack
import numpy as np
import pyarrow.parquet as pq
from tqdm import tqdm

from robowds.export import __version__
from robowds.export.job.build import BuildSpec, EpisodeWindows, build_episode
from robowds.export.job.config import check_field_keys, image_options, stream_window, video_options
from robowds.export.store.episodes import EpisodeLoader
from robowds.export.errors import EpisodeError, UserError
from robowds.export.job.executor import make_executor
from robowds.export.job.fsio import fsync_write
from robowds.export.job.oserrors import os_error, work_note
from robowds.export.core.shard_plan import assign_splits, key_prefixes, pack_shards, window_order
from robowds.export.core.plausible import human_bytes
from robowds.export.job.publish import JOB_FILE, READY, finish_publish, publish, read_manifest, remove_work
from robowds.export.job.report import SplitStats, build_manifest, report_warnings
from robowds.export.store.schema import StoreSchema, fingerprint, invalid_utf8_row, open_store
from robowds.reader.format import END_OF_ARCHIVE

WORK_DIR = ".robowds-work"
EPISODES_PER_TASK = 8


@dataclass(frozen=True)
class JobSpec:
    """Everything a map task needs; picklable and identical for every worker."""

    schema: StoreSchema
    build: BuildSpec
    fields: tuple[str, ...]
    work: str
    prefixes: dict[str, str]
    splits: dict[str, str]
    index: dict[str, int]

    @property
    def load_fields(self) -> list[str]:
        """Fields to read per episode: the exported ones plus the clock, which defines the extent."""
        clock = self.build.clock
        return [*self.fields, clock] if clock is not None and clock not in self.fields else list(self.fields)


@dataclass(frozen=True)
class Summary:
    out: Path
    episodes: int
    rejected: int
    windows: int
    shards: int
    bytes: int
    seconds: float
    dropped: int = 0  # windows below min_valid_fraction
    up_to_date: bool = False
    warnings: tuple[str, ...] = ()  # what the report holds that a user must not miss

    def line(self) -> str:
        if self.up_to_date:
            return f"{self.out}: export is up to date ({self.windows} windows in {self.shards} shards); nothing to do"
        dropped = f" ({self.dropped} below min_valid_fraction, not emitted)" if self.dropped else ""
        warning = "\nwarning: no window was emitted; check the window config" if not self.windows else ""
        warning += "".join(f"\nwarning: {w}" for w in self.warnings)
        return (f"exported {self.episodes} episodes ({self.rejected} rejected) -> {self.windows} windows{dropped} in "
                f"{self.shards} shards, {self.bytes / 1e6:.1f} MB, in {self.seconds:.1f} s -> {self.out}{warning}")


def resolve(store: Path, config: dict[str, Any]) -> tuple[JobSpec, dict[str, Any]]:
    """Open the store and resolve the config against it (the plan's pure part)."""
    schema = open_store(store)
    schema.raise_if_errors()
    include = config["include"]
    unknown = set(include or []) | set(config["exclude"]) | set(config["streams"])
    unknown -= set(schema.fields)
    if unknown:
        raise UserError(f"config names field(s) the store does not have: {sorted(unknown)}",
                        hint=f"fields: {', '.join(sorted(schema.fields))}")
    fields = [f for f in sorted(schema.fields) if (include is None or f in include) and f not in config["exclude"]]
    windows, videos, images = {}, {}, {}
    for name in fields:
        spec = schema.fields[name]
        check_field_keys(config, name, spec.kind)
        if spec.kind == "timeseries":
            windows[name] = stream_window(config, name, spec.interpolation or "linear", spec.max_gap_s)
        elif spec.kind == "video":
            videos[name] = (stream_window(config, name, "nearest", None), video_options(config, name))
        elif spec.kind == "image":
            images[name] = image_options(config, name)
    if not windows and not fields:
        raise UserError("nothing to export: no fields selected", hint="check include/exclude")
    resolved = dict(config)
    resolved["streams"] = {n: w.__dict__ for n, w in windows.items()}
    resolved["videos"] = {n: {**w.__dict__, **o.__dict__} for n, (w, o) in videos.items()}
    resolved["images"] = {n: o.__dict__ for n, o in images.items()}
    build = BuildSpec(fps=float(config["fps"]), stride=int(config["stride"]),
                      min_valid_fraction=float(config["min_valid_fraction"]), float_dtype=config["float_dtype"],
                      strict_timestamps=config["timestamps"] == "reject", max_gap_factor=float(config["max_gap_factor"]),
                      windows=windows, value_dtypes={n: schema.fields[n].value_dtype or "float64" for n in windows},
                      static_fields=tuple(f for f in fields if f not in windows and f not in videos),
                      videos=videos, images=images,
                      clock=schema.clock, max_episode_s=float(config["max_episode_s"]),
                      clock_interpolation=schema.fields[schema.clock].interpolation or "linear" if schema.clock else "linear")
    declared = _declared_splits(schema)
    splits = assign_splits(schema.episode_ids, config["splits"], int(config["seed"]), declared)
    job = JobSpec(schema=schema, build=build, fields=tuple(fields), work="", prefixes=key_prefixes(schema.episode_ids),
                  splits=splits, index={ep: i for i, ep in enumerate(schema.episode_ids)})
    return job, resolved


def _declared_splits(schema: StoreSchema) -> dict[str, str]:
    table = schema.reserved.get("split")
    if table is None:
        return {}
    data = pq.read_table(schema.root / table, columns=["episode_id", "split"])
    try:
        cols = data.to_pydict()
    except UnicodeDecodeError as exc:  # open_store checked the ids, so it is the split column
        row = invalid_utf8_row(data.column("split"))
        raise UserError(f"table {table}: split of row {row} is not valid UTF-8 text",
                        hint="write the split column as UTF-8 strings") from exc
    return {str(e): str(s) for e, s in zip(cols["episode_id"], cols["split"]) if s is not None}


# ----------------------------------------------------------------------------------------------- map

def _episode_paths(work: Path, index: int) -> tuple[Path, Path]:
    return work / f"ep-{index:06d}.bin", work / f"ep-{index:06d}.rec"


def stage_episodes(args: tuple[JobSpec, list[str]]) -> list[str]:
    """Map task: build and stage the windows of a batch of episodes (skipping staged ones)."""
    job, episode_ids = args
    work = Path(job.work)
    todo = [ep for ep in episode_ids if not _episode_paths(work, job.index[ep])[1].exists()]
    for ep, data in zip(todo, EpisodeLoader(job.schema, job.load_fields).load(todo)):
        bin_path, rec_path = _episode_paths(work, job.index[ep])
        record: dict[str, Any] = {"episode_id": ep, "split": job.splits[ep], "error": None}
        windows = EpisodeWindows()
        try:
            if isinstance(data, EpisodeError):
                raise data
            meta = {"episode_id": ep, "split": job.splits[ep]}
            tmp = bin_path.with_name(f"{bin_path.name}.tmp-{os.getpid()}")
            sizes = []
            free = shutil.disk_usage(work).free  # the planned windows are checked against it first
            with open(tmp, "wb") as fh:
                for blob in build_episode(data, job.build, job.prefixes[ep], meta, windows, free_bytes=free):
                    fh.write(blob)
                    sizes.append(len(blob))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, bin_path)
            record.update(anchors=np.asarray(windows.anchors, np.int64).tobytes(),
                          sizes=np.asarray(sizes, np.int64).tobytes(), report=windows.report,
                          stats={n: (s.to_state() if s else None) for n, s in windows.stats.items()})
        except EpisodeError as exc:
            record["error"] = {"field": exc.field, "message": exc.reason, "hint": exc.hint}
        fsync_write(rec_path, msgpack.packb(record, use_bin_type=True))
    return episode_ids


def _load_record(work: Path, index: int) -> dict[str, Any]:
    return msgpack.unpackb(_episode_paths(work, index)[1].read_bytes(), raw=False)


# -------------------------------------------------------------------------------------------- reduce

@dataclass(frozen=True)
class ShardTask:
    work: str
    split: str
    path: str  # relative to out
    entries: np.ndarray  # [S, 3] int64: episode index, byte offset in its staging file, size


def write_shard(task: ShardTask) -> dict[str, Any]:
    """Reduce task: copy the shard's samples from staging, in order, into its tar in `work/ready/`.

    Not into OUT: a shard of the same name in the export being replaced stays intact until publish.
    """
    work = Path(task.work)
    final = work / READY / task.path
    rec_path = work / "shards" / (task.path.replace("/", "__") + ".json")
    if final.exists() and rec_path.exists():
        record = json.loads(rec_path.read_text())
        if final.stat().st_size == record["bytes"]:
            return record
    digest, offsets, pos = hashlib.sha256(), [], 0
    tmp = work / "tmp" / f"{task.path.replace('/', '__')}.tmp-{os.getpid()}"
    handles: dict[int, int] = {}
    try:
        with open(tmp, "wb") as fh:
            for ep_index, offset, size in task.entries.tolist():
                if ep_index not in handles:
                    handles[ep_index] = os.open(_episode_paths(work, ep_index)[0], os.O_RDONLY)
                blob = os.pread(handles[ep_index], size, offset)
                if len(blob) != size:
                    raise RuntimeError(f"staging file of episode {ep_index} is truncated; delete {work} and re-run")
                offsets.append(pos)
                fh.write(blob)
                digest.update(blob)
                pos += size
            fh.write(END_OF_ARCHIVE)
            digest.update(END_OF_ARCHIVE)
            fh.flush()
            os.fsync(fh.fileno())
    finally:
        for fd in handles.values():
            os.close(fd)
    record = {"path": task.path, "samples": len(offsets), "bytes": pos + len(END_OF_ARCHIVE),
              "sha256": digest.hexdigest(), "offsets": offsets}
    fsync_write(rec_path, json.dumps(record).encode())
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, final)
    return record


def plan_shards(work: Path, records: list[dict[str, Any]], config: dict[str, Any],
                episode_of: dict[str, int]) -> list[ShardTask]:
    """Order every split's windows and cut them into shards (pure given the staged sizes)."""
    tasks = []
    for split in sorted({r["split"] for r in records}):
        members = [r for r in records if r["split"] == split]
        sizes = [np.frombuffer(r["sizes"], np.int64) for r in members]
        counts = np.asarray([len(s) for s in sizes], np.int64)
        flat_sizes = np.concatenate([np.zeros(0, np.int64), *sizes])  # [W] in canonical order
        first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)  # [E] first window's index
        before = flat_sizes.cumsum() - flat_sizes  # [W] bytes before each window, all episodes
        within_offsets = before - np.repeat(np.append(before, flat_sizes.sum())[first], counts)  # in its file
        order = window_order(counts.tolist(), int(config["seed"]), split, bool(config["shuffle"]))  # [W, 2]
        flat = first[order[:, 0]] + order[:, 1] if len(order) else np.zeros(0, np.int64)
        ep_idx = np.asarray([episode_of[r["episode_id"]] for r in members], np.int64)
        entries = np.stack([ep_idx[order[:, 0]] if len(order) else np.zeros(0, np.int64),
                            within_offsets[flat], flat_sizes[flat]], axis=1)  # [W, 3]
        shard = config["shard"]
        bounds = pack_shards(entries[:, 2].tolist(), int(shard["max_samples"]), int(shard["max_bytes"]),
                             len(END_OF_ARCHIVE))
        for n, (lo, hi) in enumerate(bounds):
            tasks.append(ShardTask(str(work), split, f"{split}/shard-{n:06d}.tar", entries[lo:hi]))
    return tasks


def _check_shard_space(work: Path, tasks: list[ShardTask]) -> None:
    """Refuse before the reduce when the shards (a copy of the staged windows, which stay until publish)
    cannot fit on the output disk; shards already in `ready/` need no more room."""
    needed = sum(int(t.entries[:, 2].sum()) + len(END_OF_ARCHIVE) for t in tasks
                 if not (work / READY / t.path).exists())
    free = shutil.disk_usage(work).free
    if needed > free:
        raise UserError(f"writing the shards needs {human_bytes(needed)} on the disk of {work.parent}, "
                        f"but it has {human_bytes(free)} free",
                        hint="free disk space and re-run the same command (staged episodes are kept), or "
                             "choose an output folder on a larger disk")


# ------------------------------------------------------------------------------------------------ job

def _job_id(fingerprint_hex: str, resolved: dict[str, Any]) -> str:
    doc = json.dumps({"source": fingerprint_hex, "config": resolved, "tool": __version__}, sort_keys=True)
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
    if doc is None and not work.is_dir() and out.exists() and any(out.iterdir()):
        raise UserError(f"output folder {out} is not empty and holds no robowds export",
                        hint="choose an empty or new folder (robowds never replaces files it did not write)")
    if doc is not None and doc.get("job_id") == job_id and (finished or not overwrite):
        remove_work(work)
        return doc
    if doc is not None and doc.get("job_id") != job_id and not overwrite:
        raise UserError(f"{out} holds a finished export of a different store or config",
                        hint="pass --overwrite to replace it, or choose another output folder")
    job_file = work / JOB_FILE
    if work.is_dir() and (not job_file.exists() or json.loads(job_file.read_text()).get("job_id") != job_id):
        remove_work(work)  # a partial export of another store/config, or a half-deleted one: useless
    for sub in ("shards", "tmp", READY):
        (work / sub).mkdir(parents=True, exist_ok=True)
    for stale in work.rglob("*.tmp-*"):
        stale.unlink()  # left by a killed run; every step rewrites its temp file from scratch
    fsync_write(job_file, json.dumps({"job_id": job_id}).encode())
    return work


def _batches(items: list[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def run_export(store: Path, out: Path, config: dict[str, Any], workers: int = 1, overwrite: bool = False,
               progress: bool = True) -> Summary:
    began = time.perf_counter()
    store, out = Path(store).resolve(), Path(out).resolve()
    if out == store or store in out.parents:  # the store's fingerprint would change with every run
        raise UserError(f"output folder {out} must not be inside the store", hint="choose a folder elsewhere")
    job, resolved = resolve(store, config)
    source = fingerprint(store)
    job_id = _job_id(source, resolved)
    try:
        work = _prepare_out(out, job_id, overwrite)
    except OSError as exc:  # OUT under a file, read-only, no permission, disk full
        raise os_error(exc, "export", out) from exc
    if isinstance(work, dict):  # up to date: the finished manifest
        doc = work
        shards = sum(len(s["shards"]) for s in doc["splits"].values())
        windows = sum(s["samples"] for s in doc["splits"].values())
        return Summary(out, doc["report"]["episodes"]["exported"], len(doc["report"]["episodes"]["rejected"]),
                       windows, shards, sum(s["bytes"] for s in doc["splits"].values()), 0.0, up_to_date=True)
    job = replace(job, work=str(work))
    try:
        return _run(job, resolved, config, source, job_id, out, work, workers, progress, began)
    except OSError as exc:
        raise os_error(exc, "export", out, work) from exc
    except UserError as exc:
        note = work_note(work)
        if not note or str(work) in (exc.hint or ""):
            raise
        raise UserError(exc.message, hint="; ".join(filter(None, [exc.hint, note])), exit_code=exc.exit_code) from exc


def _run(job: JobSpec, resolved: dict[str, Any], config: dict[str, Any], source: str, job_id: str, out: Path,
         work: Path, workers: int, progress: bool, began: float) -> Summary:
    """Map, reduce and publish into a prepared work folder."""
    schema = job.schema
    executor = make_executor(workers)
    try:
        ids = schema.episode_ids
        per_task = max(1, min(EPISODES_PER_TASK, len(ids) // max(1, 4 * workers)))
        with tqdm(total=len(ids), desc="episodes", unit="ep", disable=not progress) as bar:
            for done in executor.map_unordered(stage_episodes, [(job, b) for b in _batches(ids, per_task)]):
                bar.update(len(done))
        split_stats = SplitStats()  # statistics folded record by record: not all episodes' at once
        records = [split_stats.fold(_load_record(work, job.index[ep])) for ep in ids]
        failed = [r for r in records if r["error"]]
        if failed and config["on_bad_episode"] == "fail":
            listed = "\n  ".join(f"episode {r['episode_id']!r}" + (f", field {r['error']['field']!r}" if
                                 r["error"]["field"] else "") + f": {r['error']['message']}" for r in failed[:20])
            hints = list(dict.fromkeys(r["error"]["hint"] for r in failed if r["error"]["hint"]))[:3]
            raise UserError(f"{len(failed)} episode(s) cannot be exported:\n  {listed}",
                            hint="; ".join([*hints, "fix them in the store, or pass --set on_bad_episode=skip "
                                                    "to leave them out"]))
        good = [r for r in records if not r["error"]]
        tasks = plan_shards(work, good, config, job.index)
        _check_shard_space(work, tasks)
        shard_records: dict[str, dict[str, Any]] = {}
        with tqdm(total=len(tasks), desc="shards", unit="shard", disable=not progress) as bar:
            for rec in executor.map_unordered(write_shard, tasks):
                shard_records[rec["path"]] = rec
                bar.update(1)
    finally:
        executor.close()
    manifest = build_manifest(schema=schema, job=job, resolved=resolved, records=records,
                              shards=[shard_records[t.path] for t in tasks], source=source, job_id=job_id,
                              split_stats=split_stats)
    publish(out, work, manifest)
    total_bytes = sum(r["bytes"] for r in shard_records.values())
    return Summary(out, len(good), len(failed), sum(r["samples"] for r in shard_records.values()), len(tasks),
                   total_bytes, time.perf_counter() - began, manifest["report"]["windows"]["dropped_min_valid"],
                   warnings=tuple(report_warnings(manifest["report"])))
