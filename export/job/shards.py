"""The reduce step: order each split's staged windows, cut them into shards, and write each shard.

A shard's bytes are written here (`write_shard`): the samples copied in order from the staging files
into `work/ready/<split>/shard-NNNNNN.tar`, sha256 taken on the way, and next to it its offset index
`shard-NNNNNN.tar.idx` (`reader/manifest.py`: Energon's layout, uint64 per sample + the end), whose
sha256 the manifest lists. `plan_shards` is pure given the staged sizes; its arrays are O(windows of
one split) int64, never the samples themselves.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robowds.export.core.plausible import human_bytes
from robowds.export.core.shard_plan import pack_shards, window_order
from robowds.export.errors import UserError
from robowds.export.job.key_index import save_shard_hashes
from robowds.export.job.stage import episode_paths
from robowds.export.output.fsio import fsync_write
from robowds.export.output.publish import READY
from robowds.reader.format import END_OF_ARCHIVE, MAX_NAME_BYTES
from robowds.reader.manifest import INDEX_SUFFIX, encode_index


@dataclass(frozen=True)
class ShardTask:
    work: str
    split: str
    path: str  # relative to out
    entries: np.ndarray  # [S, 3] int64: episode index, byte offset in its staging file, size


def write_shard(task: ShardTask) -> dict[str, Any]:
    """Reduce task: copy the shard's samples from staging, in order, into its tar in `work/ready/`.

    Not into OUT: a shard of the same name in the export being replaced stays intact until publish.
    The index is renamed into `ready/` before the shard, so a shard there always has its index.
    """
    work = Path(task.work)
    final = work / READY / task.path
    index = work / READY / (task.path + INDEX_SUFFIX)
    rec_path = work / "shards" / (task.path.replace("/", "__") + ".json")
    if final.exists() and index.exists() and rec_path.exists():
        record = json.loads(rec_path.read_text())
        if final.stat().st_size == record["bytes"] and "index_sha256" in record:
            return record
    digest, offsets, pos, keys = hashlib.sha256(), [], 0, []
    tmp = work / "tmp" / f"{task.path.replace('/', '__')}.tmp-{os.getpid()}"
    handles: dict[int, int] = {}
    try:
        with open(tmp, "wb") as fh:
            for ep_index, offset, size in task.entries.tolist():
                if ep_index not in handles:
                    handles[ep_index] = os.open(episode_paths(work, ep_index)[0], os.O_RDONLY)
                blob = os.pread(handles[ep_index], size, offset)
                if len(blob) != size:
                    raise RuntimeError(f"staging file of episode {ep_index} is truncated; delete {work} and re-run")
                offsets.append(pos)
                keys.append(blob[:MAX_NAME_BYTES].split(b"\0", 1)[0].split(b".", 1)[0].decode("utf-8"))  # 1st name
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
    index_bytes = encode_index(offsets, pos)  # [samples + 1]: the last entry is where the samples end
    record = {"path": task.path, "samples": len(offsets), "bytes": pos + len(END_OF_ARCHIVE),
              "sha256": digest.hexdigest(), "index_sha256": hashlib.sha256(index_bytes).hexdigest()}
    save_shard_hashes(work, task.path, keys)  # for the split's key index (job/key_index.py)
    fsync_write(rec_path, json.dumps(record).encode())
    final.parent.mkdir(parents=True, exist_ok=True)
    fsync_write(index, index_bytes)
    os.replace(tmp, final)
    return record


def plan_shards(work: Path, records: list[dict[str, Any]], config: dict[str, Any],
                episode_of: dict[str, int], first_shard: dict[str, int] | None = None) -> list[ShardTask]:
    """Order every split's windows and cut them into shards (pure given the staged sizes).

    `first_shard` (append, `job/append.py`): split -> the number of shards it has already; the new
    windows (only `records`' episodes, in the order `window_order` gives them among themselves) get
    shards numbered on from there, and `shard.min_shards` counts the old shards too."""
    tasks = []
    first_shard = first_shard or {}
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
        start = first_shard.get(split, 0)
        bounds = pack_shards(entries[:, 2].tolist(), int(shard["max_samples"]), int(shard["max_bytes"]),
                             len(END_OF_ARCHIVE), max(1, int(shard["min_shards"]) - start))
        for n, (lo, hi) in enumerate(bounds, start):
            tasks.append(ShardTask(str(work), split, f"{split}/shard-{n:06d}.tar", entries[lo:hi]))
    return tasks


def check_shard_space(work: Path, tasks: list[ShardTask], at_once: int | None = None) -> None:
    """Refuse before the reduce when the shards (a copy of the staged windows) cannot fit on the output
    disk. The staged windows are freed as their shards are written (`staging_release.py`), so this asks
    for more than the peak needs: it is kept whole because a file system that cannot punch holes frees
    staging files only late in the reduce; shards already in `ready/` need no more room. `at_once`: at most
    that many shards are on the disk together (OUT at a URL: each is deleted once uploaded), so only
    the largest `at_once` need room; None: all of them stay."""
    sizes = sorted((int(t.entries[:, 2].sum()) + len(END_OF_ARCHIVE) for t in tasks
                    if not (work / READY / t.path).exists()), reverse=True)
    needed = sum(sizes if at_once is None else sizes[:at_once])
    free = shutil.disk_usage(work).free
    if needed > free:
        raise UserError(f"writing the shards needs {human_bytes(needed)} on the disk of {work.parent}, "
                        f"but it has {human_bytes(free)} free",
                        hint="free disk space and re-run the same command (staged episodes are kept), or "
                             "choose an output folder (with OUT at a URL: a --work-dir) on a larger disk")
