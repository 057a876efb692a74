"""Where an episode store lives: a local folder, or a prefix in object storage at an fsspec URL.

Everything the store code reads goes through a `StoreLocation`, so `validate` and `export` read a
store at `s3://bucket/store` with the same code, and the same bytes come out, as from a folder:
tables through pyarrow on a ranged file object, media (videos, images) streamed by range.

Why ranged file objects with a small block: s3fs's default block is 50 MB, so the first read of a
video would download most of it; PyAV and pyarrow read a container or a Parquet footer in small
pieces and seek (an mp4 whose `moov` index sits at the end is read there, then from the front), so
blocks of `BLOCK_BYTES` fetch about what is used, one GET per block: tables through a `readahead`
cache, media through blocks this process keeps for the file's next open (`open_media`). The block is
the store's `storage_options["default_block_size"]` (s3fs, gcsfs) or `["block_size"]` when given.

Why a filesystem per process: fsspec's asynchronous filesystems (s3fs, gcsfs) run an event loop in a
thread, which a forked worker does not inherit. `filesystem()` makes one per (process, protocol,
options) on first use in the task that needs it; a `StoreLocation` itself holds only the URL and the
options, so it pickles to worker processes and Ray tasks.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Iterator

BLOCK_BYTES = 4 << 20  # one GET: ~20-40 ms of S3 latency against ~40 ms of transfer at 100 MB/s
MEDIA_BLOCKS = 8  # blocks of a media file kept in memory (32 MiB at 4 MiB): an episode video's every block
MEDIA_FILES = 4  # media files whose blocks a process keeps (an episode's cameras): <= 128 MiB per process
_FILESYSTEMS: dict[tuple[int, str, str], Any] = {}  # (pid, protocol, options) -> filesystem
_MEDIA: OrderedDict[tuple[Any, ...], Any] = OrderedDict()  # (pid, url, options, size, version) -> BlockCache
_LOCK = threading.Lock()


def is_url(text: str) -> bool:
    return bool(re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text))


def filesystem(protocol: str, options: dict[str, Any]) -> Any:
    """The fsspec filesystem of this process for `protocol` and `options` (made here on first use, never
    inherited across a fork: see the module docstring)."""
    import fsspec

    key = (os.getpid(), protocol, json.dumps(options, sort_keys=True, default=repr))
    with _LOCK:
        fs = _FILESYSTEMS.get(key)
        if fs is None:
            fs = fsspec.filesystem(protocol, **{**options, "skip_instance_cache": True})
            _FILESYSTEMS[key] = fs
    return fs


class RemoteStoreError(OSError):
    """A store object that cannot be listed or read; `str()` says why (HTTP status, missing key...),
    `hint` how to fix it."""

    hint: str | None = None


def remote_problem(exc: BaseException, url: str) -> tuple[str, str]:
    """(what went wrong, how to fix it) for a failed listing or read of `url`: no bucket or key, no
    credentials, access denied, or no connection."""
    from robowds.reader.remote import describe

    chain, current = [], exc
    while current is not None and len(chain) < 8:
        chain.append(current)
        current = current.__cause__ or current.__context__
    names = " ".join(type(e).__name__ for e in chain)
    text = describe(exc)
    options = "--storage-options '{\"key\": ..., \"secret\": ...}' (or '{\"anon\": true}' for a public bucket)"
    if "Credentials" in names or "credentials" in text.lower():
        return (f"{url}: no credentials to read it ({text})",
                f"set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass {options}")
    if any(isinstance(e, PermissionError) for e in chain) or "403" in text or "AccessDenied" in text:
        return (f"{url}: access denied ({text})",
                f"use credentials that may read the bucket (AWS_PROFILE, or {options})")
    if any(isinstance(e, FileNotFoundError) for e in chain) or "NoSuchBucket" in text or "404" in text:
        return (f"{url}: not found ({text})", "check the bucket and prefix of the store URL")
    return (f"{url}: cannot be reached ({text})",
            "check the network and the endpoint (e.g. --storage-options "
            "'{\"client_kwargs\": {\"endpoint_url\": \"http://HOST:PORT\"}}' for an S3-compatible server)")


@dataclass(frozen=True)
class StoreFile:
    """One file of a store in object storage: what the media openers get instead of a `Path`
    (`name` and `open()` are all they use)."""

    location: "StoreLocation"
    rel: str  # posix path inside the store, normalised, never leaving it

    @property
    def name(self) -> str:
        return posixpath.basename(self.rel)

    def __str__(self) -> str:
        return self.location.join(self.rel)

    def open(self) -> BinaryIO:
        """A seekable binary file object, read by range in blocks whose bytes this process keeps for the
        next open of the same file (`StoreLocation.open_media`)."""
        return self.location.open_media(self.rel)

    def read_bytes(self) -> bytes:
        return self.location.read_bytes(self.rel)

    def is_file(self) -> bool:
        return self.location.is_file(self.rel)

    def size(self) -> int:
        return self.location.size(self.rel)


@dataclass(frozen=True)
class StoreLocation:
    """A store's root: `url` is a local folder path or an fsspec URL (no trailing slash)."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False)  # may hold credentials

    @property
    def local(self) -> bool:
        return not is_url(self.url)

    @property
    def path(self) -> Path:
        """The folder of a local store."""
        if not self.local:
            raise ValueError(f"{self.url} is not a local folder")
        return Path(self.url)

    @property
    def protocol(self) -> str:
        return self.url.split("://", 1)[0]

    def __str__(self) -> str:
        return self.url

    def join(self, rel: str) -> str:
        return str(self.path / rel) if self.local else f"{self.url}/{rel}"

    def fs(self) -> Any:
        return filesystem(self.protocol, self.storage_options)

    def _key(self, rel: str = "") -> str:
        """The filesystem's path of `rel` (for s3: bucket/prefix/rel)."""
        root = self.fs()._strip_protocol(self.url).rstrip("/")
        return f"{root}/{rel}" if rel else root

    def _remote(self, action: Any, rel: str = "") -> Any:
        """Run a remote call; a failure is a `RemoteStoreError` naming the object and what went wrong."""
        try:
            return action()
        except (RemoteStoreError, UnicodeError):
            raise
        except Exception as exc:  # noqa: BLE001 - s3fs, gcsfs, aiohttp, botocore: classified by remote_problem
            message, hint = remote_problem(exc, self.join(rel) if rel else self.url)
            error = RemoteStoreError(message)
            error.hint = hint
            raise error from exc

    def file(self, rel: str) -> Path | StoreFile:
        """A file of the store as the media openers take it (a `Path` when local)."""
        return self.path / rel if self.local else StoreFile(self, rel)

    def open(self, rel: str) -> BinaryIO:
        if self.local:
            return open(self.path / rel, "rb")
        return self._remote(lambda: self.fs().open(self._key(rel), "rb", block_size=self._block(),
                                                   cache_type="readahead"), rel)

    def _block(self) -> int:
        return int(self.storage_options.get("default_block_size") or self.storage_options.get("block_size")
                   or BLOCK_BYTES)

    def open_media(self, rel: str) -> BinaryIO:
        """A media file for PyAV: seekable, read in blocks through a cache this process keeps for the
        file's next open. A video is opened twice per episode, probed (every packet's timestamp, which
        reads the whole file) and then decoded: without the shared blocks its bytes crossed the network
        twice (2.0x the file for the G1 videos), with them once when the file fits in `MEDIA_BLOCKS`."""
        if self.local:
            return open(self.path / rel, "rb")
        from fsspec.caching import BlockCache

        key_path = self._key(rel)
        info = self._remote(lambda: self.fs().info(key_path), rel)
        size = int(info["size"])
        version = info.get("ETag") or info.get("mtime") or info.get("LastModified")  # a changed object: new blocks
        key = (os.getpid(), self.url, rel, json.dumps(self.storage_options, sort_keys=True, default=repr), size,
               str(version))
        with _LOCK:
            cache = _MEDIA.pop(key, None)
            if cache is None:
                def fetch(start: int, end: int) -> bytes:
                    return self._remote(lambda: self.fs().cat_file(key_path, start=start, end=end), rel)
                cache = BlockCache(self._block(), fetch, size, maxblocks=MEDIA_BLOCKS)
            _MEDIA[key] = cache  # most recently used last
            while len(_MEDIA) > MEDIA_FILES:
                _MEDIA.popitem(last=False)
        return io.BufferedReader(_BlockFile(cache, size), buffer_size=1 << 16)  # type: ignore[return-value]

    def read_bytes(self, rel: str) -> bytes:
        if self.local:
            return (self.path / rel).read_bytes()
        return self._remote(lambda: self.fs().cat_file(self._key(rel)), rel)

    def is_file(self, rel: str) -> bool:
        if self.local:
            return (self.path / rel).is_file()
        return bool(self._remote(lambda: self.fs().isfile(self._key(rel)), rel))

    def size(self, rel: str) -> int:
        if self.local:
            return (self.path / rel).stat().st_size
        return int(self._remote(lambda: self.fs().size(self._key(rel)), rel))

    def is_dir(self) -> bool:
        """Whether the store exists: a folder, or a prefix with objects under it. A bucket that cannot
        be reached is a `RemoteStoreError`, not False."""
        if self.local:
            return self.path.is_dir()
        self.fs().invalidate_cache(self._key())  # a listing cached earlier in this process may be stale
        try:
            self._remote(lambda: self.fs().ls(self._key()))  # isdir() would hide a missing bucket or no access
        except RemoteStoreError as exc:
            if isinstance(exc.__cause__, FileNotFoundError) and exc.__cause__.__cause__ is None:
                return False  # the bucket is there, nothing is under the prefix
            raise
        return True

    def tables(self) -> list[str]:
        """Names of the `*.parquet` files at the store's top level, sorted."""
        if self.local:
            return [p.name for p in sorted(self.path.glob("*.parquet"))]
        listed = self._remote(lambda: self.fs().ls(self._key(), detail=True))
        return sorted(posixpath.basename(e["name"].rstrip("/")) for e in listed
                      if e.get("type") == "file" and e["name"].endswith(".parquet"))

    def files(self) -> list[tuple[str, int]]:
        """(relative posix path, size) of every file in the store, in the order of their paths (the
        fingerprint's order). Local: linked folders followed, each real folder once; remote: one
        listing (1000 keys per request on S3)."""
        if self.local:
            return [(p.relative_to(self.path).as_posix(), p.stat().st_size) for p in _local_files(self.path)]
        root = self._key()
        self.fs().invalidate_cache(root)
        found = self._remote(lambda: self.fs().find(root, detail=True))
        rels = [(name[len(root) + 1:], int(info.get("size") or 0)) for name, info in found.items()
                if info.get("type") == "file" and name.startswith(root + "/")]
        return sorted(rels, key=lambda item: PurePosixPath(item[0]))

    def total_bytes(self) -> int:
        """Bytes of every file in the store (the export report's source size; local: links not followed)."""
        if self.local:
            return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())
        return sum(size for _, size in self.files())

    def parquet(self, rel: str, stream: bool = False) -> Any:
        """A `pyarrow.parquet.ParquetFile` of the table: footer, then row groups, read by range.

        `stream`: for `iter_batches` in bounded memory. pyarrow's default (`pre_buffer=True`) reads
        each whole column chunk of a row group before the first batch (a table written as one row
        group: all of it); with pre-buffering off and a 1 MiB read buffer it holds one data page per
        column (`row_stream.py`)."""
        import pyarrow.parquet as pq

        options: dict[str, Any] = {"pre_buffer": False, "buffer_size": 1 << 20} if stream else {}
        if self.local:
            return pq.ParquetFile(self.path / rel, **options)
        return self._remote(lambda: pq.ParquetFile(self.open(rel), **options), rel)

    def iter_chunks(self, rel: str, size: int = 1 << 22) -> Iterator[bytes]:
        """The file's bytes in chunks (hashing a table larger than memory)."""
        with self.open(rel) as fh:
            yield from iter(lambda: fh.read(size), b"")


def drop_media_blocks() -> None:
    """Free the media blocks this process keeps (a long-lived process between jobs; benchmarks)."""
    with _LOCK:
        _MEDIA.clear()


class _BlockFile(io.RawIOBase):
    """A read-only, seekable view of a remote file through a block cache shared with its other opens."""

    def __init__(self, cache: Any, size: int) -> None:
        super().__init__()
        self._cache, self._size, self._pos = cache, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"seek to {base + offset}, before the start of the file")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self._size - self._pos)
        if want <= 0:
            return 0
        data = self._cache._fetch(self._pos, self._pos + want)  # whole blocks fetched, each once while cached
        buffer[:len(data)] = data
        self._pos += len(data)
        return len(data)


def _local_files(root: Path) -> list[Path]:
    """Every file under `root`, following linked folders (a media folder linked in under
    `media_roots`; `rglob` does not descend into those), each real folder once so a link loop ends.
    Sorted as paths, the order the fingerprint always used."""
    found, seen = [], set()
    for folder, dirs, names in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        found += [Path(folder) / name for name in names if (Path(folder) / name).is_file()]
    return sorted(found)


def store_location(store: str | os.PathLike[str] | StoreLocation,
                   storage_options: dict[str, Any] | None = None) -> StoreLocation:
    """The location of a store given as a folder, a `file://` URL or an fsspec URL (`s3://bucket/store`);
    `storage_options` (credentials, endpoint...) apply to URLs only."""
    if isinstance(store, StoreLocation):
        return store
    text = os.fspath(store)
    if text.startswith("file://"):
        return StoreLocation(text[len("file://"):] or "/")
    if is_url(text):
        return StoreLocation(text.rstrip("/"), dict(storage_options or {}))
    return StoreLocation(text)


def media_rel(rel: str) -> str:
    """A media path from a table of a remote store, normalised; ValueError if it could leave the store
    (`..`, absolute, a URL: object storage has no links and no media_roots, so nothing else can)."""
    scheme = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", rel)  # s3:, https:, c: (a Windows drive)
    if not rel or ".." in PurePosixPath(rel).parts or scheme or rel.startswith("/"):
        raise ValueError(rel)
    return posixpath.normpath(rel)
