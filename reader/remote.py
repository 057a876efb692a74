"""Ranged reads from fsspec URLs that survive a flaky network, and fail with one clear message when not.

Object stores and the networks in front of them reset connections, cut response bodies, stall, and
answer 5xx or throttle (429, 503 SlowDown). Each ranged read is therefore retried with bounded,
jittered exponential backoff (`RetryPolicy`); what is transient is decided from the exception chain
(`is_transient`), so s3fs, gcsfs and fsspec's HTTP filesystem are covered without knowing which one
raised. A response of the wrong length is checked here too: fewer bytes than asked is a cut body
(retried) unless the object really is shorter than the range (`ObjectTruncated`, not retried); more
bytes means the server ignored the `Range` header (reported as such once the attempts are spent).

Libraries retry on their own as well (botocore up to 5 attempts, s3fs up to 5 more around each), which
multiplies into minutes per failing read; for `s3://` they are turned off (botocore's unless the
caller's `storage_options` set `config_kwargs["retries"]`), so this policy is the one bound.

fsspec's caching chains (`simplecache::`, `filecache::`, `blockcache::` + a URL) are not safe with
concurrent reads: a whole-file cache checks only that the local file exists while another thread
still downloads into it (or a second download truncates it under the first: zeros), and the block
cache marks blocks as present before their bytes arrive, and keeps them marked when the fetch fails.
So reads through them hold a lock (`CacheChainGuard`): one read at a time per process, one per
object across the processes sharing a cache folder, and a failed read drops the local copy.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import random
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterator

TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})  # and any other 5xx
TRANSIENT_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "TooManyRequests", "RequestTimeout",
                             "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable", "RequestLimitExceeded",
                             "BandwidthLimitExceeded", "EC2ThrottledException"})


@dataclass(frozen=True)
class RetryPolicy:
    """How a remote read is retried. Attempt k (from 0) that fails transiently waits
    min(backoff_s * 2**k, max_backoff_s) scaled by a factor in [0.5, 1] (so the reads of many
    workers and ranks do not retry in lock step), then tries again, `attempts` times in all. The
    factor comes from a generator seeded by the read (reader, object, range), never from global
    random state: a run's waits are reproducible, and different reads still spread apart.
    `timeout_s` bounds one attempt (for fsspec's asynchronous filesystems: s3, gcs, http, az; others
    use their own timeouts). A read therefore gives up after at most `bound_s()` seconds.

    The defaults (5 attempts, 0.5 s doubling to at most 8 s, 60 s per attempt) ride out a few seconds
    of resets or throttling; with no network at all a read fails after ~7.5 s of waiting."""

    attempts: int = 5
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    timeout_s: float | None = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be >= 1, got {self.attempts}")
        if self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("RetryPolicy backoff_s and max_backoff_s must be >= 0")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"RetryPolicy.timeout_s must be > 0 or None, got {self.timeout_s}")

    def wait_s(self, attempt: int, rng: random.Random) -> float:
        return min(self.backoff_s * 2 ** attempt, self.max_backoff_s) * rng.uniform(0.5, 1.0)

    def bound_s(self) -> float:
        """The longest a read can take before it gives up (timeouts plus the longest waits)."""
        waits = sum(min(self.backoff_s * 2 ** k, self.max_backoff_s) for k in range(self.attempts - 1))
        return waits + self.attempts * (self.timeout_s or float("inf"))


class RemoteReadError(OSError):
    """A ranged read that failed for good (the message says why; the caller adds shard and range)."""


class ObjectTruncated(RemoteReadError):
    """The object is shorter than the range asked for: the shard itself is truncated."""

    def __init__(self, size: int) -> None:
        super().__init__(f"the object has {size} bytes; permanent, not retried")
        self.size = size


class _WrongLength(Exception):
    """A response whose body has another length than the range (cut body, or the Range ignored)."""


@lru_cache(maxsize=1)
def _transient_types() -> tuple[type[BaseException], ...]:
    """Exception types that are transient whatever they carry: connection trouble and timeouts."""
    types: list[type[BaseException]] = [ConnectionError, TimeoutError]  # resets, refusals, socket timeouts
    import http.client

    types.append(http.client.IncompleteRead)
    try:
        import aiohttp

        types += [aiohttp.ClientPayloadError, aiohttp.ClientConnectionError]  # cut bodies, disconnects
    except ImportError:
        pass
    try:
        from botocore import exceptions as bx

        types += [bx.HTTPClientError, bx.ConnectionError, bx.IncompleteReadError,  # EndpointConnectionError, ...
                  bx.FlexibleChecksumError]  # a body spoiled in transit (botocore checks whole-object CRCs)
    except ImportError:
        pass
    try:
        from fsspec.exceptions import FSTimeoutError

        types.append(FSTimeoutError)
    except ImportError:
        pass
    return tuple(types)


def _status_and_code(exc: BaseException) -> tuple[int | None, str | None]:
    """The HTTP status and service error code an exception carries (botocore ClientError, aiohttp)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore.exceptions.ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return (int(status) if status else None), response.get("Error", {}).get("Code")
    status = getattr(exc, "status", None)  # aiohttp.ClientResponseError
    return (status if isinstance(status, int) else None), None


def _chain_has_status(exc: BaseException, status: int) -> bool:
    current: BaseException | None = exc
    for _ in range(8):
        if current is None:
            return False
        if _status_and_code(current)[0] == status:
            return True
        current = current.__cause__ or current.__context__
    return False


def is_transient(exc: BaseException) -> bool:
    """Whether retrying may help: the exception or one it was raised from (s3fs re-raises botocore
    errors as OSError from them) is a connection problem, a timeout, a cut body, a 5xx or throttling."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        if isinstance(current, _WrongLength) or isinstance(current, _transient_types()):
            return True
        status, code = _status_and_code(current)
        if (status is not None and (status >= 500 or status in TRANSIENT_STATUS)) or code in TRANSIENT_CODES:
            return True
        if isinstance(current, OSError) and current.errno in (errno.EBUSY, errno.ETIMEDOUT, errno.ECONNRESET):
            return True  # s3fs's translation of SlowDown / 503 when the cause is gone
        current = current.__cause__ or current.__context__
        seen += 1
    return False


def describe(exc: BaseException) -> str:
    """`HTTP 503 SlowDown: message` when the exception or one it was raised from carries an HTTP
    status (s3fs turns those into a bare OSError), else `Type: message`."""
    current: BaseException | None = exc
    for _ in range(8):
        if current is None:
            break
        status, code = _status_and_code(current)
        if status is not None or code:
            response = getattr(current, "response", None)
            message = (response.get("Error", {}).get("Message") if isinstance(response, dict)
                       else getattr(current, "message", "")) or ""
            return " ".join(p for p in ("HTTP", str(status or "?"), code or "") if p) + (f": {message}" if message else "")
        current = current.__cause__ or current.__context__
    text = str(exc) or (str(exc.__cause__) if exc.__cause__ else "")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_S3: dict[tuple[int, str], Any] = {}  # (pid, options) -> filesystem: one per process and option set
_S3_LOCK = threading.Lock()


def s3_filesystem(url: str, options: dict[str, Any]) -> Any:
    """An s3fs filesystem for `url` whose own retries are off, so that `RetryPolicy` alone bounds a
    read: botocore's (unless `options["config_kwargs"]["retries"]` says otherwise) and s3fs's loop
    around it (5 x 5 attempts per read otherwise). s3fs's count is an attribute, not an argument, so
    the instance is private (`skip_instance_cache`) and kept here per process, where fsspec's cache
    would have shared it. Its client is made now (`connect`), outside any attempt's timeout: loading
    botocore's service model takes a good part of a second."""
    import fsspec

    tuned = {**options, "skip_instance_cache": True}
    config = dict(tuned.get("config_kwargs") or {})
    config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
    tuned["config_kwargs"] = config
    key = (os.getpid(), json.dumps(tuned, sort_keys=True, default=repr))
    with _S3_LOCK:
        fs = _S3.get(key)
        if fs is None:
            fs = fsspec.url_to_fs(url, **tuned)[0]
            if isinstance(getattr(fs, "retries", None), int):
                fs.retries = 1
            if hasattr(fs, "connect"):
                fs.connect()
            _S3[key] = fs
    return fs


class CacheChainGuard:
    """Mutual exclusion for reads through one of fsspec's caching filesystems (`CachingFileSystem`:
    simplecache, filecache, blockcache), which assume one reader at a time.

    Within a process every read holds one lock: the caches share a metadata dict and file that their
    reads of different objects update without locks. Across the processes that share the cache
    folder (DataLoader workers, ranks given the same `cache_storage`), a read holds an exclusive
    `flock` on a lock file for its object in that folder (`.robowds-<hash>.lock`, never removed), so a
    second process waits for the first one's download instead of reading the half-written file. A
    read that fails drops the object's local copy (`drop`), so a retry downloads it again rather
    than reading a truncated file or blocks marked present that never arrived."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs
        self._lock = threading.Lock()

    @staticmethod
    def applies(fs: Any) -> bool:
        try:
            from fsspec.implementations.cached import CachingFileSystem
        except ImportError:
            return False
        return isinstance(fs, CachingFileSystem)

    def _key(self, url: str) -> str:
        return self.fs._strip_protocol(url)

    @contextlib.contextmanager
    def hold(self, url: str) -> Iterator[None]:
        folder = self.fs.storage[-1]
        name = hashlib.blake2b(self._key(url).encode(), digest_size=12).hexdigest()
        with self._lock:
            os.makedirs(folder, exist_ok=True)
            fd = os.open(os.path.join(folder, f".robowds-{name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # released by the close, also if this process dies
                try:
                    yield
                except BaseException:
                    self.drop(url)
                    raise
            finally:
                os.close(fd)

    def drop(self, url: str) -> None:
        """Remove the object's local copy and its cache entry (the caller holds `hold(url)`)."""
        path = self._key(url)
        try:
            self.fs.pop_from_cache(path)  # filecache, blockcache: metadata entry and file
        except Exception:  # noqa: BLE001 - best effort; the file itself goes below
            pass
        for folder in self.fs.storage:
            with contextlib.suppress(OSError):  # simplecache keeps no metadata: the file alone
                os.remove(os.path.join(folder, self.fs._mapper(path)))


class RangeReader:
    """Byte ranges of remote objects through one fsspec filesystem, retried under a `RetryPolicy`.
    Thread-safe (the dataset reads ahead in threads).

    An object whose read just failed for good gets one attempt per read, without waits, until a read
    of it succeeds: with `on_error="skip"`, a shard that cannot be reached would otherwise cost each
    of its thousands of samples a full round of retries (hours for one shard).

    `jitter_key` (e.g. rank and worker) seeds the backoff factors together with the object and range,
    so that readers that fail on the same object at the same moment do not retry in lock step."""

    def __init__(self, fs: Any, policy: RetryPolicy, sleep: Callable[[float], None] = time.sleep,
                 jitter_key: str = "") -> None:
        self.fs = fs
        self.policy = policy
        self._sleep = sleep
        self._jitter_key = jitter_key
        self._failing: set[str] = set()  # URLs whose last read failed for good (at most one per shard)
        self._guard = CacheChainGuard(fs) if CacheChainGuard.applies(fs) else None

    def read(self, url: str, start: int, stop: int) -> bytes:
        """Exactly the bytes [start, stop) of `url`; `RemoteReadError` naming the last fault once the
        attempts are spent, `ObjectTruncated` at once when the object ends before `stop`."""
        want = stop - start
        try:
            data = self._retry(lambda: self._guarded(url, lambda: self._checked(url, start, stop, want)),
                               1 if url in self._failing else None, f"{url}|{start}|{stop}")
        except RemoteReadError:
            self._failing.add(url)
            raise
        self._failing.discard(url)
        return data

    def read_all(self, url: str) -> bytes:
        """The whole object (a manifest): the client checks the length against Content-Length."""
        return self._retry(lambda: self._guarded(url, lambda: self._call(self.fs.cat_file, "_cat_file", url)),
                           key=f"{url}|all")

    def size(self, url: str) -> int:
        return int(self._retry(lambda: self._call(self.fs.size, "_size", url), key=f"{url}|size"))

    def _guarded(self, url: str, attempt: Callable[[], Any]) -> Any:
        """One attempt, under the cache chain's lock when reading through one."""
        if self._guard is None:
            return attempt()
        with self._guard.hold(url):
            return attempt()

    def _checked(self, url: str, start: int, stop: int, want: int) -> bytes:
        try:
            data = self._call(self.fs.cat_file, "_cat_file", url, start=start, end=stop)
        except Exception as exc:
            if _chain_has_status(exc, 416):  # a range starting past the object's end
                self._raise_if_shorter(url, stop)
            raise
        if len(data) > want:
            if self._size(url) == len(data):
                raise _WrongLength(f"the server ignored the byte range: it returned the whole object ({len(data)} "
                                   f"bytes) for a range of {want} bytes (does it support HTTP Range requests?)")
            raise _WrongLength(f"the server returned {len(data)} bytes for a range of {want} bytes")
        if len(data) < want:
            self._raise_if_shorter(url, stop)
            raise _WrongLength(f"the response body was cut: {len(data)} of {want} bytes")
        return data

    def _size(self, url: str) -> int | None:
        """The object's size (one HEAD, one attempt), None when that fails too."""
        try:
            return int(self._call(self.fs.size, "_size", url))
        except Exception:  # noqa: BLE001 - unknown: the caller treats its read as transient
            return None

    def _raise_if_shorter(self, url: str, stop: int) -> None:
        """`ObjectTruncated` if the object ends before `stop` (unknown size: nothing)."""
        size = self._size(url)
        if size is not None and size < stop:
            raise ObjectTruncated(size)

    def _call(self, method: Callable[..., Any], coroutine: str, *args: Any, **kwargs: Any) -> Any:
        """One attempt; on an asynchronous filesystem its coroutine under `timeout_s` (cancelled when
        it runs out, as fsspec's `sync` does), else the blocking method."""
        timeout = self.policy.timeout_s
        # not through a cache chain: it forwards `async_impl` and unknown coroutines to the filesystem
        # it wraps, so `_cat_file` would bypass the cache (blockcache) or skip its bookkeeping
        if (timeout is not None and self._guard is None and getattr(self.fs, "async_impl", False)
                and hasattr(self.fs, coroutine)):
            from fsspec.asyn import sync

            return sync(self.fs.loop, getattr(self.fs, coroutine), *args, timeout=timeout, **kwargs)
        return method(*args, **kwargs)

    def _retry(self, attempt: Callable[[], Any], attempts: int | None = None, key: str = "") -> Any:
        attempts = attempts or self.policy.attempts
        began = time.monotonic()
        rng: random.Random | None = None
        for k in range(attempts):
            try:
                return attempt()
            except ObjectTruncated:
                raise
            except Exception as exc:  # noqa: BLE001 - classified below; anything else is re-raised
                if not is_transient(exc):
                    raise RemoteReadError(f"{describe(exc)} (permanent: not retried)") from exc
                if k + 1 == attempts:
                    what = str(exc) if isinstance(exc, _WrongLength) else describe(exc)
                    tries = (f"gave up after {attempts} attempts" if attempts > 1 else
                             "1 attempt: an earlier read of this object failed after its retries")
                    raise RemoteReadError(f"{what} ({tries} in {time.monotonic() - began:.1f} s)") from exc
            if rng is None:  # jitter only (never affects which bytes are returned); seeded by the read
                rng = random.Random(f"{self._jitter_key}|{key}")
            self._sleep(self.policy.wait_s(k, rng))
        raise AssertionError("unreachable")
