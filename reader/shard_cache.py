"""A node-local cache of whole remote shards (and their offset indexes), shared by every DataLoader
worker and rank of a node.

Why whole shards: the plan reads a few shards at a time, every sample of each once per epoch, so one
download per shard (in large ranged reads) replaces thousands of requests, and later epochs read from
local disk. Why on disk and not in memory: all processes of the node share it, and it survives them.

The rules that make it safe, with only the file system for coordination (no registry in memory):
- A shard is published whole or not at all. It is downloaded into a temporary file in the cache folder
  (`robowds-<sha256>.tar.<pid>-<token>.part`, preallocated to its full size), checked against the
  manifest's size and sha256, fsynced, then renamed to `robowds-<sha256>.tar` (atomic within one
  folder). A reader only ever opens that final name, so it never sees a partial file. A shard's offset
  index (`<shard>.idx`) is kept the same way, as `robowds-<its sha256>.idx`.
- One download per shard on the node: the downloader holds an exclusive `flock` on
  `robowds-<sha256>.lock`; a process that wants the same shard waits for that lock and then finds
  the published file. Locks die with their process, so a crashed downloader blocks nobody.
- The size limit: before a download, under the folder's lock (`robowds-cache.lock`), the least
  recently used shards are deleted until the shards present, the downloads in flight (counted at their
  full size) and the new one fit `limit_bytes`. If they cannot (the other downloads alone fill it), the
  download waits for them to land; if nothing else is left, the new shard lands anyway. So the folder
  exceeds the limit by at most the one shard landing. Every change to what is counted (a download
  created, published by rename, or evicted) happens under that lock, so a scan there is exact; a
  scan racing a rename can miss the file under both names. Use is recorded by setting the file's
  modification time on every open (access times are unreliable under `relatime`/`noatime`).
- A temporary file whose owner died (its `flock` can be taken) is removed; so are evicted shards'
  lock files. Nothing else: only names matching these patterns are ever deleted, never files this
  cache did not write. A shard evicted while another process has it open or mapped stays readable
  there (POSIX keeps the inode until it is closed).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import secrets
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

SHARD = re.compile(r"^robowds-(?P<sha>[0-9a-f]{64})\.(?P<kind>tar|idx)$")  # a shard, or its offset index
PART = re.compile(r"^robowds-(?P<sha>[0-9a-f]{64})\.(tar|idx)\.(?P<pid>[0-9]+)-(?P<token>[0-9a-f]{8})\.part$")
LOCK = re.compile(r"^robowds-(?P<sha>[0-9a-f]{64})\.lock$")
FOLDER_LOCK = "robowds-cache.lock"
CHUNK = 8 << 20  # bytes per ranged read of a download
WAIT_S = 0.05  # poll interval while other downloads fill the cache


class ShardCacheError(OSError):
    """A downloaded shard that does not match the manifest (size or sha256)."""


@dataclass(frozen=True)
class ShardCache:
    """Whole shards under `folder`, at most `limit_bytes` of them (None: no limit) plus the one landing.
    Picklable (a DataLoader worker gets a copy; the state is in the folder)."""

    folder: str
    limit_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.limit_bytes is not None and self.limit_bytes < 0:
            raise ValueError(f"cache_limit_bytes must be >= 0 or None, got {self.limit_bytes}")

    def path(self, sha256: str, kind: str = "tar") -> str:
        return os.path.join(self.folder, f"robowds-{sha256}.{kind}")

    def open(self, sha256: str, size: int, download: Callable[[int, int], bytes], kind: str = "tar") -> BinaryIO:
        """The shard (`kind` "tar") or shard index ("idx") with this sha256 and size, opened for
        reading: the published copy if there is one, else downloaded first with `download(start, stop)
        -> bytes` (ranged reads, retried by the caller). `ShardCacheError` if the download does not
        match; the caller's errors pass through."""
        if not re.fullmatch(r"[0-9a-f]{64}", sha256) or kind not in ("tar", "idx"):
            raise ValueError(f"not a sha256 hex digest and kind: {sha256!r}, {kind!r}")
        found = self._open_published(sha256, kind)
        if found is not None:
            return found
        os.makedirs(self.folder, exist_ok=True)
        with _flock(os.path.join(self.folder, f"robowds-{sha256}.lock")):  # one download per shard
            found = self._open_published(sha256, kind)  # a process that held the lock before us published it
            if found is not None:
                return found
            return self._download(sha256, size, download, kind)

    def usage(self) -> int:
        """Bytes of shards and downloads in flight in the folder (what the limit bounds)."""
        return sum(size for _, size, _, _ in _scan(self.folder, clean=False))

    def _open_published(self, sha256: str, kind: str) -> BinaryIO | None:
        try:
            fh = open(self.path(sha256, kind), "rb")
        except FileNotFoundError:
            return None
        try:
            os.utime(fh.fileno())  # a use: least recently used shards are evicted first
        except OSError:
            pass  # a read-only cache folder still serves its shards
        return fh

    def _download(self, sha256: str, size: int, download: Callable[[int, int], bytes], kind: str) -> BinaryIO:
        final = self.path(sha256, kind)
        part = final + f".{os.getpid()}-{secrets.token_hex(4)}.part"
        fd = self._reserve(part, size)
        try:
            digest, done = hashlib.sha256(), 0
            while done < size:
                data = download(done, min(size, done + CHUNK))
                if not data:
                    raise ShardCacheError(f"the download stopped at byte {done} of {size}")
                os.pwrite(fd, data, done)
                digest.update(data)
                done += len(data)
            if done != size or digest.hexdigest() != sha256:
                raise ShardCacheError(f"the downloaded copy does not match the manifest ({done} bytes, sha256 "
                                      f"{digest.hexdigest()[:16]}..., expected {size} bytes, {sha256[:16]}...)")
            os.fsync(fd)
            # Under the folder lock: a scan there must not list the temporary name and then miss both
            # names (stat after the rename fails, and listdir already passed the new one), or it would
            # count this shard as absent and admit one more (CI drew that: the folder ended over its limit).
            with _flock(os.path.join(self.folder, FOLDER_LOCK)):
                os.rename(part, final)  # published whole: readers open only this name
            _fsync_folder(self.folder)
            os.utime(fd)
            return os.fdopen(fd, "rb")  # our flock on it goes when the caller closes it
        except BaseException:
            os.close(fd)
            _remove(part)
            raise

    def _reserve(self, part: str, size: int) -> int:
        """Make room for `size` bytes (evicting least recently used shards), then create `part` at its
        full size, locked by us, all under the folder lock: other processes count it from then on."""
        while True:
            with _flock(os.path.join(self.folder, FOLDER_LOCK)):
                if self._make_room(size):
                    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                    fcntl.flock(fd, fcntl.LOCK_EX)  # alive while we hold it (see _scan)
                    os.ftruncate(fd, size)
                    return fd
            time.sleep(WAIT_S)  # other downloads fill the limit: wait for them to land, then evict

    def _make_room(self, size: int) -> bool:
        """Evict least recently used shards until everything fits with `size` more; False if the
        downloads in flight alone leave no room (wait), True otherwise (also when the new shard
        alone exceeds the limit and nothing else is left)."""
        if self.limit_bytes is None:
            return True
        entries = _scan(self.folder)
        used = sum(n for _, n, _, _ in entries)
        shards = sorted((mtime, path, n) for path, n, mtime, published in entries if published)
        for _, path, n in shards:
            if used + size <= self.limit_bytes:
                break
            _remove(path)
            _remove(os.path.splitext(path)[0] + ".lock")
            used -= n
        return used + size <= self.limit_bytes or used == 0


def _scan(folder: str, clean: bool = True) -> list[tuple[str, int, float, bool]]:
    """(path, size, mtime, published) of this cache's shards and live downloads; with `clean` (only
    under the folder lock, which every download holds from creating its file to locking it), removes
    the downloads of dead processes (their lock can be taken) on the way."""
    found: list[tuple[str, int, float, bool]] = []
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return found
    for name in names:
        path = os.path.join(folder, name)
        published = SHARD.match(name) is not None
        if not published and PART.match(name) is None:
            continue  # not ours (or a lock file): never counted, never touched
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue  # evicted or published meanwhile
        if clean and not published and _abandoned(path):
            _remove(path)
            continue
        found.append((path, st.st_size, st.st_mtime, published))
    return found


def _abandoned(part: str) -> bool:
    """Whether a download's temporary file has no live owner: its owner holds an exclusive flock on
    it until it publishes or removes it, so taking the lock means the owner is gone."""
    try:
        fd = os.open(part, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # also drops the lock if we took it
    return True


@contextmanager
def _flock(path: str) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _fsync_folder(folder: str) -> None:
    """Make the rename durable (a crash after it must not bring back the temporary name)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
