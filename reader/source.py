"""Where shard bytes come from: local files (memory-mapped) or any fsspec URL (ranged reads).

Local samples are zero-copy views of the mapped shard; for large ones the kernel is asked to read
ahead (`madvise(MADV_WILLNEED)`) when they enter the read-ahead window, so the disk works while
earlier samples decode. Against `pread` into fresh buffers (one copy, and ~95 page faults per 512 KB
sample for the new memory) this cut kernel time per pass by two thirds and read large samples 13%
faster from the page cache (scripts/bench_read.py: 5.35 vs 4.74 GB/s); from a cold disk both reached
~1.8 GB/s (scripts/bench_cold_read.py).

Reads are by byte range from each shard's offset index (`<shard>.idx`, read and checked against the
manifest's `index_sha256` when the shard is first read, then kept in a bounded cache; inline in a
version 1 manifest), so resuming never replays consumed data. `pipe:`
URLs (which run a shell command, as webdataset allows) are refused: random access needs ranged reads,
which fsspec URLs give without running anything. Remote reads are retried on transient faults
(`reader/remote.py`); one that fails for good is a `ShardReadError` naming shard, byte range, length and
URL. Remote samples are fetched ahead in plan order, neighbours joined into one request of at most
`max_request_bytes` (`read_ahead`, `reader/fetch.py`); with a node cache (`reader/shard_cache.py`) whole
shards are downloaded once into a local folder and then mapped like local ones.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import posixpath
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Sequence

from robowds.reader.fetch import MAX_REQUEST_BYTES, fetch_in_order
from robowds.reader.manifest import (INDEX_DTYPE, INDEX_SUFFIX, MANIFEST_NAME, ManifestError, ShardIndexError,
                                     ShardInfo, parse_manifest, shard_index)
from robowds.reader.remote import ObjectTruncated, RangeReader, RemoteReadError, RetryPolicy, s3_filesystem
from robowds.reader.shard_cache import ShardCache, ShardCacheError

MAX_OPEN = 64
MAX_OPEN_CACHED = 8  # node-cached shards kept mapped: an evicted one keeps its disk space while mapped
INDEX_CACHE_ENTRIES = 1 << 21  # offsets kept per source (16 MB): ~2000 shards of 1000 samples
PREFETCH_MIN = 64 * 1024  # local samples from this size on get a read-ahead hint (smaller: fault-around does it)


class ShardReadError(IOError):
    """A shard that cannot be read as the manifest says (names the shard and byte offset)."""


def _is_url(path: str) -> bool:
    return "://" in path or path.startswith("pipe:")


def _check_pipe(path: str) -> None:
    if path.startswith("pipe:"):
        raise ManifestError(f"{path!r} is a pipe: URL, which would run a shell command; robowds reads by byte "
                            "range and refuses it: use a local path or an fsspec URL (s3://, gs://, https://)")


def remote_filesystem(url: str, storage_options: dict[str, Any] | None) -> Any:
    """The fsspec filesystem for `url`, with the library's own retries off where `RetryPolicy` takes over."""
    import fsspec
    from fsspec.core import split_protocol

    options = dict(storage_options or {})
    if split_protocol(url)[0] in ("s3", "s3a") and "::" not in url:
        return s3_filesystem(url, options)
    return fsspec.url_to_fs(url, **options)[0]


def load_manifest(source: str | os.PathLike[str], storage_options: dict[str, Any] | None = None,
                  retry: RetryPolicy | None = None) -> tuple[dict[str, Any], str]:
    """(manifest, base) from a manifest path/URL or the folder holding it; base is its folder. A remote
    manifest is read under `retry` (default `RetryPolicy()`), failing as `ManifestError` with the URL."""
    text = os.fspath(source)
    _check_pipe(text)
    if not _is_url(text):
        path = os.path.abspath(text)
        if os.path.isdir(path):
            path = os.path.join(path, MANIFEST_NAME)
        with open(path, "rb") as fh:
            return parse_manifest(fh.read(), path), os.path.dirname(path)
    url = text if text.endswith(".json") else text.rstrip("/") + "/" + MANIFEST_NAME
    reader = RangeReader(remote_filesystem(url, storage_options), retry or RetryPolicy())
    try:
        data = reader.read_all(url)
    except RemoteReadError as exc:
        raise ManifestError(f"{url}: cannot be read: {exc}") from exc
    return parse_manifest(data, url), url.rsplit("/", 1)[0]


class ShardSource:
    """Byte ranges of shards under one base (a folder or URL prefix); one per DataLoader worker.

    `cache` (remote bases only) serves whole shards from a node-local folder, downloaded on first use
    (`shards` gives their sizes and sha256); `max_request_bytes` bounds a coalesced remote request
    (0: one request per sample); `jitter_key` (rank, worker) spreads the retries of different readers."""

    def __init__(self, base: str, storage_options: dict[str, Any] | None = None,
                 verify: dict[str, str] | None = None, retry: RetryPolicy | None = None, *,
                 cache: ShardCache | None = None, shards: Sequence[ShardInfo] = (),
                 max_request_bytes: int = MAX_REQUEST_BYTES, jitter_key: str = "") -> None:
        _check_pipe(base)
        self.base = base
        self.remote = _is_url(base)
        self.cache = cache if self.remote else None  # local shards are read in place
        self.mapped = self.cache is not None or not self.remote  # samples are views of mapped files
        self.max_request_bytes, self.jitter_key = int(max_request_bytes), jitter_key
        self._shards = {s.path: s for s in shards} if self.cache is not None else {}
        self._downloads: dict[str, Future] = {}  # shard path -> its file, downloading (prefetch)
        self.storage_options = storage_options or {}
        self.verify = verify or {}  # shard path -> sha256 to check before the first read
        self._maps: OrderedDict[str, mmap.mmap] = OrderedDict()
        self._lock = threading.Lock()  # reads may come from read-ahead threads
        self._verify_lock = threading.Lock()
        self._verified: set[str] = set()
        self._corrupt: dict[str, str] = {}  # shard path -> why it failed its sha256 check (<= one per shard)
        self.hashed = 0  # shards hashed by this source: each at most once, whatever its verdict
        self.retry = retry or RetryPolicy()
        self._reader: RangeReader | None = None
        self._indexes: OrderedDict[str, memoryview] = OrderedDict()  # shard path -> offsets [samples + 1]
        self._indexed = 0  # entries in `_indexes`
        self._bad_index: dict[str, str] = {}  # shard path -> why its index was refused (asked once)
        self.indexes_read = 0  # index files read by this source (each shard's once while cached)

    def offsets(self, shard: ShardInfo) -> memoryview:
        """The byte offsets of `shard`'s samples and its end ([samples + 1] int64, indexable as Python
        ints): read from `<shard>.idx` and checked the first time (`manifest.shard_index`), then from
        a cache of at most INDEX_CACHE_ENTRIES offsets (least recently used out; always the newest).
        A missing or refused index is a `ShardReadError` naming shard, index and fix, remembered so
        that skipping that shard's samples does not read the index again for each one; a remote read
        that fails after its retries is one too, not remembered (`RangeReader` tries such an object
        once per read from then on)."""
        cached = self._indexes.get(shard.path)
        if cached is not None:
            self._indexes.move_to_end(shard.path)
            return cached
        if shard.path in self._bad_index:
            raise ShardReadError(self._bad_index[shard.path])
        try:
            size = INDEX_DTYPE.itemsize * (shard.samples + 1)
            index = memoryview(shard_index(shard, lambda rel: self._read_index(rel, size)))  # [samples + 1] int64
        except ShardIndexError as exc:
            self._bad_index[shard.path] = str(exc)
            raise ShardReadError(str(exc)) from exc
        except ShardReadError as exc:  # the remote index could not be fetched
            raise ShardReadError(f"shard {shard.path}: {exc}") from exc
        self.indexes_read += shard.offsets is None
        self._indexes[shard.path] = index
        self._indexed += len(index)
        while self._indexed > INDEX_CACHE_ENTRIES and len(self._indexes) > 1:
            self._indexed -= len(self._indexes.popitem(last=False)[1])
        return index

    def _read_index(self, path: str, size: int) -> bytes:
        """The bytes of the index file `path` under the base (FileNotFoundError if absent): a local file
        whole, a remote one as the ranged read [0, size) of the size the manifest implies, retried and
        length-checked like a sample's (a shorter object reads as b"", which its sha256 check refuses)."""
        if not self.remote:
            with open(self.location(path), "rb") as fh:
                return fh.read()
        url = self.location(path)
        shard = self._shards.get(path[:-len(INDEX_SUFFIX)]) if path.endswith(INDEX_SUFFIX) else None
        if self.cache is not None and shard is not None and shard.index_sha256:
            try:  # from the node cache, downloaded and checked there on first use
                fetch = lambda start, stop: self._remote().read(url, start, stop)  # noqa: E731
                with self.cache.open(shard.index_sha256, size, fetch, "idx") as fh:
                    return fh.read()
            except (ShardCacheError, RemoteReadError, OSError):
                pass  # read as below, so that its problem is reported as an uncached index's is
        try:
            return self._remote().read(url, 0, size)
        except ObjectTruncated:
            return b""
        except RemoteReadError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):  # not transient, so the cause is the error itself
                raise FileNotFoundError(url) from exc
            raise ShardReadError(f"index {path}: {url} cannot be read: {exc}") from exc

    def read_file(self, path: str, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of the export's file `path` (fewer where it ends first): one `pread`
        when local, one ranged read (retried) when remote. FileNotFoundError when it is absent."""
        if not self.remote:
            with open(self.location(path), "rb") as fh:
                return os.pread(fh.fileno(), stop - start, start)
        url = self.location(path)
        try:
            return self._remote().read(url, start, stop)
        except ObjectTruncated:
            return b""
        except RemoteReadError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                raise FileNotFoundError(url) from exc
            raise ShardReadError(f"{path}: bytes {start}-{stop} of {url} cannot be read: {exc}") from exc

    def location(self, path: str) -> str:
        return posixpath.join(self.base, path) if self.remote else os.path.join(self.base, path)

    def span(self, path: str, start: int, stop: int) -> tuple[bytes | mmap.mmap, int]:
        """Bytes [start, stop) of shard `path` as (buffer, where `start` is in it): the mapped file when
        local (nothing is copied), the fetched bytes when remote."""
        if path in self.verify and path not in self._verified:
            with self._verify_lock:
                if path not in self._verified:
                    self._check_sha(path)
        if not self.mapped:
            data: bytes | mmap.mmap = self._remote_range(path, start, stop)
            have, offset = len(data), 0
        else:
            data = self._map(path)
            have, offset = max(0, min(stop, len(data)) - start), start
        if have != stop - start:
            raise ShardReadError(f"shard {path}: byte {start + have}: shard is truncated "
                                 f"(wanted bytes {start}-{stop})")
        return data, offset

    def read_ahead(self, ids: Iterable[int], locate: Callable[[int], tuple[ShardInfo, int, int]],
                   threads: int) -> Iterator[tuple[ShardInfo | None, int, int, Future | BaseException]]:
        """Remote samples `ids` in order as (shard, start, size, future of (buffer, offset)), fetched
        ahead in `threads` threads, neighbours coalesced into requests of <= max_request_bytes; a sample
        that cannot be located (its index is unreadable) is (None, 0, 0, ShardReadError)."""
        def located() -> Iterator[tuple[ShardInfo, int, int] | BaseException]:
            for sample_id in ids:
                try:
                    yield locate(sample_id)
                except ShardReadError as exc:
                    yield exc

        return fetch_in_order(located(), lambda shard, start, stop: self.span(shard.path, start, stop),
                              key=lambda shard: shard.path, threads=threads, max_request_bytes=self.max_request_bytes,
                              alone=lambda exc: isinstance(exc.__cause__, ObjectTruncated))

    def prefetch(self, path: str, start: int, stop: int) -> None:
        """Start reading bytes [start, stop) of a local shard into the page cache, asynchronously; with
        a node cache, start downloading a shard not yet there."""
        if self.cache is not None and path not in self._maps:
            self._download_soon(path)
            return
        if not self.mapped or stop - start < PREFETCH_MIN or not hasattr(mmap, "MADV_WILLNEED"):
            return
        low = start - start % mmap.PAGESIZE  # madvise wants a page-aligned start
        mm = self._map(path)
        if low < len(mm):  # past the end: the read itself reports the truncated shard
            mm.madvise(mmap.MADV_WILLNEED, low, min(stop, len(mm)) - low)

    def release(self, path: str, start: int, stop: int) -> None:
        """Drop the pages of bytes [start, stop) (start page-aligned) of the mapped shard `path` from this
        process (`madvise(MADV_DONTNEED)`; `reader/release.py` says why views of them stay correct). A
        shard no longer mapped here, or a remote one, has nothing to drop."""
        with self._lock:
            mm = self._maps.get(path) if self.mapped else None
        if mm is not None and start < len(mm) and hasattr(mmap, "MADV_DONTNEED"):
            mm.madvise(mmap.MADV_DONTNEED, start, min(stop, len(mm)) - start)

    def _map(self, path: str) -> mmap.mmap:
        with self._lock:
            mm = self._maps.get(path)
            if mm is not None:
                self._maps.move_to_end(path)
                return mm
            download = self._downloads.pop(path, None)
        try:  # outside the lock: a download may take a while
            if self.cache is not None:
                fh = download.result() if download is not None else self._open_cached(path)
            else:
                fh = open(self.location(path), "rb")
            with fh:
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ShardReadError:
            raise
        except (OSError, ValueError) as exc:
            raise ShardReadError(f"shard {path}: cannot be opened: {exc}") from exc
        with self._lock:
            self._maps[path] = mm
            if len(self._maps) > (MAX_OPEN if self.cache is None else MAX_OPEN_CACHED):
                self._maps.popitem(last=False)  # not closed: arrays may still view it; GC unmaps it
        return mm

    def _open_cached(self, path: str) -> BinaryIO:
        """The node cache's copy of a remote shard, downloaded first if absent (ranged reads, retried).
        A copy that does not match the manifest is remembered like a failed sha256 check."""
        if path in self._corrupt:
            raise ShardReadError(self._corrupt[path])
        assert self.cache is not None
        shard = self._shards[path]
        try:
            return self.cache.open(shard.sha256, shard.bytes, lambda start, stop: self._remote_range(path, start, stop))
        except ShardCacheError as exc:
            self._corrupt[path] = f"shard {path}: byte 0: {self.location(path)}: {exc}"
            raise ShardReadError(self._corrupt[path]) from exc

    def _download_soon(self, path: str) -> None:
        """Download a shard into the node cache in a background thread (once per source)."""
        with self._lock:
            if path in self._downloads or path in self._maps:
                return
            future: Future = Future()
            self._downloads[path] = future

        def run() -> None:
            try:
                future.set_result(self._open_cached(path))
            except BaseException as exc:  # noqa: BLE001 - raised where the shard is mapped
                future.set_exception(exc)

        threading.Thread(target=run, name="robowds-cache-download", daemon=True).start()

    def _remote(self) -> RangeReader:
        with self._lock:  # made in the process that reads (a DataLoader worker), not pickled into it
            if self._reader is None:
                self._reader = RangeReader(remote_filesystem(self.base, self.storage_options), self.retry,
                                           jitter_key=self.jitter_key)
        return self._reader

    def _remote_range(self, path: str, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of a remote shard, retried; a `ShardReadError` naming shard, range and URL."""
        url = self.location(path)
        try:
            return self._remote().read(url, start, stop)
        except ObjectTruncated as exc:
            raise ShardReadError(f"shard {path}: byte {exc.size}: shard is truncated (wanted bytes {start}-{stop} "
                                 f"of {url}, {exc})") from exc
        except RemoteReadError as exc:
            raise ShardReadError(f"shard {path}: bytes {start}-{stop} ({stop - start} bytes) of {url}: {exc}") from exc

    def _check_sha(self, path: str) -> None:
        """Hash the shard once and remember the verdict: with on_error="skip" every sample of a corrupt
        shard asks again, and re-hashing a 241 MB shard per sample skipped 6 samples/s."""
        if path in self._corrupt:
            raise ShardReadError(self._corrupt[path])
        self.hashed += 1
        digest = hashlib.sha256()
        if not self.mapped:  # in ranged reads, each retried: [0, size) in 4 MiB pieces, memory stays 4 MiB
            url = self.location(path)
            try:
                size = self._remote().size(url)
            except RemoteReadError as exc:
                raise ShardReadError(f"shard {path}: byte 0: cannot get the size of {url}: {exc}") from exc
            for low in range(0, size, 1 << 22):
                digest.update(self._remote_range(path, low, min(size, low + (1 << 22))))
        else:
            digest.update(self._map(path))
        if digest.hexdigest() != self.verify[path]:
            self._corrupt[path] = f"shard {path}: byte 0: sha256 does not match the manifest (corrupt or replaced)"
            raise ShardReadError(self._corrupt[path])
        self._verified.add(path)
