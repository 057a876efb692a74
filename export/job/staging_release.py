"""Letting go of staged windows once their shard is written, so an export's disk peak is ~1x its size.

Why: the map stages every episode's windows (`work/ep-NNNNNN.bin`) and the reduce copies each window
into exactly one shard; until the publish both copies stayed on disk, a peak of 2x the export (18.2 GB
for 8.8 GB at 20k episodes). Deleting an episode's file once every shard needing it is written frees
little: the windows of a split are shuffled over all its shards, so almost every episode is needed
until the last few shards. Each window, though, is needed by one shard only.

How: when a shard is in `ready/` (its record, index and tar durable, the folder synced), the main
process (`StagingRelease.shard_done`) appends the shard's (episode, window) pairs to the journal
`work/released.bin` (fsynced), then frees them in the staging files: `fallocate(PUNCH_HOLE)` on the
block-aligned inside of each run of released windows (a block shared with a window still needed is
kept, so nothing a later shard reads is touched), and the whole file once all its windows are
released. Where the file system cannot punch holes (EOPNOTSUPP: some network file systems) only
whole files go. The journal comes first: a kill between the two leaves windows freed later or never,
never freed without a record.

A resumed job reads the journal before its map (`released_windows`): a staged episode is then
checked by the CRC-32 of each window still needed (`stage.staged_record`), not of the whole file,
which holds zeros where it was punched, and a fully released episode is not read at all. Only shards
already in `ready/` are skipped on resume (`shards.write_shard`), and released windows belong to
those alone, so no shard is ever written from a punched window.

Scaling: the journal is 8 bytes per window (a 600k-window export: 4.8 MB), read only on resume;
in memory the main process holds one bool per window and the window offsets (O(windows) int64, as
the shard plan does). Time: per shard, one numpy pass over each episode it touches.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from pathlib import Path
from typing import Any

import numpy as np

from robowds.export.job.stage import episode_paths, is_released
from robowds.export.output.fsio import fsync_dir

RELEASED = "released.bin"  # in the work folder: int32 (episode index, window index) pairs
_PUNCH = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE (linux/falloc.h)


@functools.cache
def _fallocate() -> Any:
    """libc's fallocate(2), or None where there is none (not Linux). Looked up once per process in
    the symbols the interpreter already links (`CDLL(None)`): `ctypes.util.find_library` runs
    `ldconfig` in a subprocess, ~2 ms a call, which cost more than the export itself when called per
    punch."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "fallocate", None)
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        fn.restype = ctypes.c_int
    return fn


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Free the file's blocks inside [offset, offset + length), keeping its size (reads give zeros
    there). False where the file system or platform cannot; other errors raise."""
    fn = _fallocate()
    if fn is None:
        return False
    if fn(fd, _PUNCH, offset, length) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(code, os.strerror(code))


def released_windows(work: Path) -> dict[int, bytes]:
    """Episode index -> packed bits (np.packbits, window order) of its released windows, from the
    journal of an earlier run of this job; {} when there is none. A torn last record is ignored."""
    try:
        raw = (work / RELEASED).read_bytes()
    except FileNotFoundError:
        return {}
    pairs = np.frombuffer(raw[: len(raw) // 8 * 8], dtype="<i4").reshape(-1, 2)  # [R, 2]
    out: dict[int, bytes] = {}
    for ep, windows in by_episode(pairs[:, 0], pairs[:, 1]):
        bits = np.zeros(int(windows.max()) + 1, dtype=bool)
        bits[windows] = True
        out[ep] = np.packbits(bits).tobytes()
    return out


def by_episode(episodes: np.ndarray, values: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """`values` grouped by `episodes` ([N] each), episodes ascending, each group in its given order:
    one stable sort, O(N log N) (a mask per episode was O(N x episodes): 600k journal pairs of 20k
    episodes, 1.2e10 comparisons on resume)."""
    order = np.argsort(episodes, kind="stable")  # [N]
    keys, first = np.unique(episodes[order], return_index=True)
    return list(zip(keys.tolist(), np.split(values[order], first[1:])))


class StagingRelease:
    """The main process's view of which staged windows the written shards hold (module docstring)."""

    def __init__(self, work: Path, records: list[dict[str, Any]], episode_of: dict[str, int],
                 released: dict[int, bytes]) -> None:
        self.work = work
        self._starts: dict[int, np.ndarray] = {}  # episode index -> [k + 1] window byte offsets, then the end
        self._done: dict[int, np.ndarray] = {}  # episode index -> [k] bool: in a written shard
        for record in records:
            sizes = np.frombuffer(record["sizes"], np.int64)
            ep = episode_of[record["episode_id"]]
            self._starts[ep] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            self._done[ep] = is_released(released.get(ep), len(sizes))  # an earlier run's, when resumed
        self._block = os.statvfs(work).f_frsize or 4096
        self._punch = True  # until the file system says it cannot

    def shard_done(self, entries: np.ndarray, shard: Path) -> None:
        """The shard `shard` (in `ready/`) holds the windows `entries` ([S, 3]: episode index, byte
        offset in its staging file, size): journal them, then free them."""
        fsync_dir(shard.parent)  # the shard's rename is durable before its windows go
        # window indices per episode (a shard of S samples touches up to S episodes: one sort, not a mask each)
        taken = [(ep, np.searchsorted(self._starts[ep], offsets)) for ep, offsets in by_episode(entries[:, 0],
                                                                                                entries[:, 1])]
        pairs = np.concatenate([np.stack([np.full(len(w), ep), w], axis=1) for ep, w in taken]) \
            if taken else np.zeros((0, 2), np.int64)
        with open(self.work / RELEASED, "ab") as fh:
            fh.write(pairs.astype("<i4").tobytes())
            fh.flush()
            os.fsync(fh.fileno())
        for ep, windows in taken:
            self._release(ep, windows)

    def _release(self, ep: int, windows: np.ndarray) -> None:
        done, starts = self._done[ep], self._starts[ep]
        done[windows] = True
        path = episode_paths(self.work, ep)[0]
        if done.all():
            path.unlink(missing_ok=True)
            return
        if not self._punch:
            return
        # the runs of released windows that the new ones belong to: [first, stop) window indices
        needed = np.flatnonzero(~done)  # [n] sorted, n > 0: the windows still to be copied
        at = np.searchsorted(needed, windows)  # [w] needed windows before each new one
        first = np.where(at > 0, needed[np.maximum(at - 1, 0)] + 1, 0)  # after the needed one before it
        stop = np.where(at < len(needed), needed[np.minimum(at, len(needed) - 1)], len(done))  # its next needed
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:  # an earlier run of the job released all of it
            return
        try:
            for lo, hi in sorted(set(zip(first.tolist(), stop.tolist()))):
                begin = -(-int(starts[lo]) // self._block) * self._block  # inside: whole blocks only
                end = int(starts[hi]) // self._block * self._block if hi < len(done) else \
                    -(-int(starts[hi]) // self._block) * self._block  # the file's end: its last block too
                if end > begin and not punch_hole(fd, begin, end - begin):
                    self._punch = False
                    return
        finally:
            os.close(fd)
