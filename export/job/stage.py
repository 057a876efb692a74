"""The map step: build one batch of episodes' windows and stage them in the work folder.

Per episode: `ep-NNNNNN.bin` (its encoded samples, back to back) then `ep-NNNNNN.rec` (msgpack: sizes,
anchors, report, statistics, the .bin's length and each window's CRC-32, or the episode's error (and its
`duration_s` when the error came after its extent was known); and its fingerprint,
`store/episode_identity.py`, None when it could not be loaded), each appearing
under its name by rename when complete, the .rec last: an episode is staged iff its .rec exists, and a
re-run after a kill skips it.

Why checksums and not fsync: staging files are intermediate (the shards, which are fsynced, are the
output), and a kill of the process leaves the page cache intact, so only a power loss or kernel crash
can leave a renamed file without its bytes. fsync of every staged file made the export I/O-bound
(2 workers vs 1: 1.41-1.50x with it, 1.55-1.62x without it, docs/benchmarks.md "Parallel scaling").
Instead a re-run checks an earlier run's staged episode before using it (the .rec parses, the .bin
has the recorded length and its windows their CRC-32) and builds it again if not; checking costs one
read of the .bin on resume only, and the CRC-32 ~0.5 ms per MB while staging. Windows a written shard
holds are freed in the .bin during the reduce (`staging_release.py`): a re-run checks only the
others, so the CRC is per window rather than of the whole file.
"""

from __future__ import annotations

import os
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from robowds.export.errors import EpisodeError
from robowds.export.job.build import EpisodeWindows, build_episode
from robowds.export.job.report import SplitStats
from robowds.export.job.spec import JobSpec
from robowds.export.store.episodes import EpisodeLoader


def episode_paths(work: Path, index: int) -> tuple[Path, Path]:
    return work / f"ep-{index:06d}.bin", work / f"ep-{index:06d}.rec"


@dataclass(frozen=True)
class StagedBatch:
    """What a map task hands back: its episodes, and their statistics folded per split and field
    (`SplitStats.states`; episodes staged by an earlier run included, from their records)."""

    episode_ids: list[str]
    stats: dict[str, dict[str, dict]]


def stage_episodes(args: tuple[JobSpec, list[str]]) -> StagedBatch:
    """Map task: build and stage the windows of a batch of episodes (skipping staged ones), and fold
    their statistics here, in the worker, rather than one record at a time in the parent."""
    job, episode_ids = args
    work = Path(job.work)
    split_stats = SplitStats()
    todo = []
    for ep in episode_ids:
        record = staged_record(*episode_paths(work, job.index[ep]), job.released.get(job.index[ep]))
        if record is not None:
            split_stats.fold(record)
        else:
            todo.append(ep)
    for ep, data in zip(todo, EpisodeLoader(job.schema, job.load_fields, job.source or None).load(todo)):
        bin_path, rec_path = episode_paths(work, job.index[ep])
        record: dict[str, Any] = {"episode_id": ep, "split": job.splits[ep], "error": None,
                                  "fingerprint": None if isinstance(data, EpisodeError) else data.fingerprint}
        windows = EpisodeWindows()
        try:
            if isinstance(data, EpisodeError):
                raise data
            meta = {"episode_id": ep, "split": job.splits[ep]}
            tmp = bin_path.with_name(f"{bin_path.name}.tmp-{os.getpid()}")
            sizes, crcs = [], []
            free = shutil.disk_usage(work).free  # the planned windows are checked against it first
            with open(tmp, "wb") as fh:
                for blob in build_episode(data, job.build, job.prefixes[ep], meta, windows, free_bytes=free):
                    fh.write(blob)
                    sizes.append(len(blob))
                    crcs.append(zlib.crc32(blob))
            os.replace(tmp, bin_path)
            # a CRC-32 per window: a file whose written windows were freed is checked on what it still needs
            record.update(bin_bytes=sum(sizes), window_crc32=np.asarray(crcs, "<u4").tobytes())
            record.update(anchors=np.asarray(windows.anchors, np.int64).tobytes(),
                          sizes=np.asarray(sizes, np.int64).tobytes(), report=windows.report,
                          stats={n: (s.to_state() if s else None) for n, s in windows.stats.items()})
        except EpisodeError as exc:
            record["error"] = {"field": exc.field, "message": exc.reason, "hint": exc.hint}
            if "duration_s" in windows.report:  # refused after its extent was known: the report page shows it
                record["duration_s"] = windows.report["duration_s"]
        rec_tmp = rec_path.with_name(f"{rec_path.name}.tmp-{os.getpid()}")
        rec_tmp.write_bytes(msgpack.packb(record, use_bin_type=True))
        os.replace(rec_tmp, rec_path)
        split_stats.fold(record)
    return StagedBatch(episode_ids, split_stats.states())


def staged_record(bin_path: Path, rec_path: Path, released: bytes | None = None) -> dict[str, Any] | None:
    """The record of an episode an earlier run staged, or None when it must be built (again): no .rec,
    a .rec that does not parse, or a .bin without the recorded length or with a window whose CRC-32
    differs (a power loss or a crash of the machine after the rename, before the bytes reached the
    disk). `released`: the windows the earlier run's written shards hold (`staging_release.py`),
    whose bytes may be freed: not checked; all of them released, the .bin is not read at all."""
    try:
        record = msgpack.unpackb(rec_path.read_bytes(), raw=False)
    except FileNotFoundError:
        return None
    except (ValueError, msgpack.UnpackException):  # torn or zero-filled: build it again
        return None
    if not isinstance(record, dict) or "episode_id" not in record or "window_crc32" not in record and \
            record.get("error") is None:
        return None
    if record.get("error") is None:
        sizes = np.frombuffer(record["sizes"], np.int64)  # [k]
        crcs = np.frombuffer(record["window_crc32"], "<u4")  # [k]
        check = ~is_released(released, len(sizes))  # [k] the windows a shard still needs
        if not check.any():
            return record
        starts = np.concatenate([[0], np.cumsum(sizes)])  # [k + 1]
        try:
            with open(bin_path, "rb") as fh:
                if os.fstat(fh.fileno()).st_size != record.get("bin_bytes"):
                    return None
                for i in np.flatnonzero(check).tolist():
                    if zlib.crc32(os.pread(fh.fileno(), int(sizes[i]), int(starts[i]))) != int(crcs[i]):
                        return None
        except FileNotFoundError:
            return None
    return record


def is_released(bits: bytes | None, count: int) -> np.ndarray:
    """[count] bool: which of an episode's `count` windows the packed bits `bits` (np.packbits in window
    order, `staging_release.released_windows`) mark as released."""
    out = np.zeros(count, dtype=bool)
    if bits:
        flags = np.unpackbits(np.frombuffer(bits, np.uint8)).astype(bool)[:count]
        out[: len(flags)] = flags
    return out


def load_record(work: Path, index: int) -> dict[str, Any]:
    """An episode's staged record without its statistics (its map task folded them)."""
    record = msgpack.unpackb(episode_paths(work, index)[1].read_bytes(), raw=False)
    record.pop("stats", None)
    return record
