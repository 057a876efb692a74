"""The map step: build one batch of episodes' windows and stage them in the work folder.

Per episode: `ep-NNNNNN.bin` (its encoded samples, back to back) then `ep-NNNNNN.rec` (msgpack: sizes,
anchors, report, statistics, or the episode's error). The .rec is written last, by rename after fsync,
so an episode is staged iff its .rec exists, and a re-run after a kill skips it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from robowds.export.errors import EpisodeError
from robowds.export.job.build import EpisodeWindows, build_episode
from robowds.export.job.fsio import fsync_write
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
        rec_path = episode_paths(work, job.index[ep])[1]
        if rec_path.exists():
            split_stats.fold(msgpack.unpackb(rec_path.read_bytes(), raw=False))
        else:
            todo.append(ep)
    for ep, data in zip(todo, EpisodeLoader(job.schema, job.load_fields).load(todo)):
        bin_path, rec_path = episode_paths(work, job.index[ep])
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
        split_stats.fold(record)
    return StagedBatch(episode_ids, split_stats.states())


def load_record(work: Path, index: int) -> dict[str, Any]:
    """An episode's staged record without its statistics (its map task folded them)."""
    record = msgpack.unpackb(episode_paths(work, index)[1].read_bytes(), raw=False)
    record.pop("stats", None)
    return record
