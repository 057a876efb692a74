"""OUT at an fsspec URL (`s3://bucket/prefix`): the few object-store operations the export needs, each
retried on transient faults, and one `UserError` naming the URL and the fix when it fails for good.

Why a class of its own: an object store has no rename, no folders and no partial objects (a PUT or a
completed multipart upload appears whole, or not at all), so the local job's "temp file + rename"
becomes "PUT to the final key once the bytes are complete", and every step of the remote job
(`remote_job.py`) is one of: list the prefix, GET a small object, PUT bytes or a local file, copy an
object server-side, delete objects.

Retries: the filesystem comes from the reader's `remote_filesystem` (for s3, botocore's and s3fs's
own retries are off), and each operation is retried here under a `RetryPolicy`, with the reader's
classification of transient faults (`is_transient`: resets, cut bodies, timeouts, 5xx, throttling).
One policy bounds every call, so a dead endpoint fails in seconds, not after 25 nested attempts.
Uploads get no per-attempt timeout (a shard may take minutes); a stalled connection ends with the
client's own socket timeout.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from robowds.export.errors import UserError
from robowds.export.store.location import is_url as location_is_url
from robowds.reader.remote import RetryPolicy, describe, is_transient

T = TypeVar("T")
UPLOAD_POLICY = RetryPolicy(attempts=5, backoff_s=0.5, max_backoff_s=8.0, timeout_s=None)
OPTIONS_EXAMPLE = "--storage-options '{\"client_kwargs\": {\"endpoint_url\": \"http://HOST:PORT\"}}'"


def is_url(out: str | Path) -> bool:
    """Whether OUT names an fsspec URL (`s3://...`, `gs://...`, `memory://...`) rather than a folder
    (a `Path` never does: it would have collapsed the `//`)."""
    return isinstance(out, str) and location_is_url(out)


def _chain(exc: BaseException) -> list[BaseException]:
    found, current = [], exc
    while current is not None and len(found) < 8:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def remote_error(exc: BaseException, url: str, action: str, note: str = "") -> UserError:
    """One message for a failed `action` ("write", "list", ...) on `url`: no bucket, no credentials,
    access denied, or anything else (with the endpoint hint); `note` is added to the reason."""
    chain = _chain(exc)
    names = " ".join(type(e).__name__ for e in chain)
    text = describe(exc) + note
    creds = ("set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass "
             "--storage-options '{\"key\": ..., \"secret\": ...}'")
    if "NoCredentials" in names or "credentials" in text.lower():
        return UserError(f"cannot {action} {url}: no credentials ({text})", hint=creds)
    if any(isinstance(e, PermissionError) for e in chain) or "AccessDenied" in text or " 403" in text:
        return UserError(f"cannot {action} {url}: access denied ({text})",
                         hint=f"use credentials that may list, read, write and delete objects under that prefix "
                              f"({creds})")
    if "bucket does not exist" in text.lower() or "NoSuchBucket" in text:
        bucket = url.split("://", 1)[-1].split("/", 1)[0]
        return UserError(f"cannot {action} {url}: the bucket {bucket!r} does not exist ({text})",
                         hint=f"create the bucket first (e.g. `aws s3 mb s3://{bucket}`), or fix the output URL")
    return UserError(f"cannot {action} {url}: {text}",
                     hint=f"check the network, the endpoint ({OPTIONS_EXAMPLE} for an S3-compatible server) and "
                          f"the credentials, then re-run the same command: what is uploaded is kept")


class RemoteOut:
    """The output prefix at `url`; paths are POSIX paths relative to it (`train/shard-000000.tar`).

    Thread-safe as far as the filesystem is (s3fs runs its calls on one event loop thread): the
    uploads of several shards run in threads of the main process."""

    def __init__(self, url: str, options: dict[str, Any] | None = None, policy: RetryPolicy = UPLOAD_POLICY,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        from robowds.reader.source import remote_filesystem

        self.url = url.rstrip("/")
        self.options = dict(options or {})
        self.policy = policy
        self._sleep = sleep
        try:
            self.fs = remote_filesystem(self.url, self.options)
            self.root = self.fs._strip_protocol(self.url).rstrip("/")  # s3: bucket/prefix
        except (ImportError, ValueError) as exc:  # no s3fs / gcsfs, an unknown protocol
            raise UserError(f"cannot open {self.url}: {exc}",
                            hint="install the fsspec backend of that protocol (s3: pip install s3fs)") from exc
        except Exception as exc:  # noqa: BLE001 - credentials, endpoint: classified
            raise remote_error(exc, self.url, "open") from exc

    def where(self, rel: str) -> str:
        return f"{self.url}/{rel}"

    def _key(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def _retry(self, action: str, rel: str, call: Callable[[], T]) -> T:
        rng: random.Random | None = None
        for attempt in range(self.policy.attempts):
            try:
                return call()
            except Exception as exc:  # noqa: BLE001 - transient ones are retried, the rest is one UserError
                if not is_transient(exc) or attempt + 1 == self.policy.attempts:
                    note = f"; gave up after {self.policy.attempts} attempts" if is_transient(exc) else ""
                    raise remote_error(exc, self.where(rel) if rel else self.url, action, note) from exc
            rng = rng or random.Random(f"{self.url}|{rel}|{action}")
            self._sleep(self.policy.wait_s(attempt, rng))
        raise AssertionError("unreachable")

    def listing(self, under: str = "") -> dict[str, int]:
        """Every object under the prefix (or under `under` inside it): relative path -> size in bytes.
        One paginated LIST (1000 keys a request): scales with the objects there, a few per shard."""
        def call() -> dict[str, int]:
            self.fs.invalidate_cache()  # never an answer cached from before our own writes
            base = self._key(under).rstrip("/") if under else self.root
            found = self.fs.find(base, detail=True)
            return {name[len(self.root) + 1:]: int(info.get("size") or 0) for name, info in found.items()
                    if name.startswith(self.root + "/") and info.get("type", "file") == "file"}
        return self._retry("list", under, call)

    def get(self, rel: str) -> bytes | None:
        """The object's bytes, None when there is none."""
        def call() -> bytes | None:
            try:
                return bytes(self.fs.cat_file(self._key(rel)))
            except FileNotFoundError as exc:
                if "bucket" in str(exc).lower():
                    raise
                return None
        return self._retry("read", rel, call)

    def put(self, rel: str, data: bytes) -> None:
        self._retry("write", rel, lambda: self.fs.pipe_file(self._key(rel), data))

    def create(self, rel: str, data: bytes) -> bool:
        """PUT `data` only if no object is at `rel` (a conditional put, `If-None-Match: *` on S3);
        False when one is there. A retried attempt whose first try landed also answers False: the
        caller reads the object to tell (remote_lock.py does, by its token)."""
        def call() -> bool:
            try:
                self.fs.pipe_file(self._key(rel), data, mode="create")
            except FileExistsError:
                return False
            return True
        return self._retry("write", rel, call)

    def delete_if(self, rel: str, etag: str | None) -> bool:
        """Delete `rel` only while its ETag is `etag` (S3's conditional delete, `If-Match`); False when
        it changed (another writer replaced it). Where the backend has no conditional delete (not S3),
        or `etag` is unknown, a plain delete."""
        def call() -> bool:
            call_s3 = getattr(self.fs, "call_s3", None)
            if call_s3 is None or not etag:
                self.fs.rm(self._key(rel))
                return True
            bucket, key, _ = self.fs.split_path(self._key(rel))
            try:
                call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=etag)
            except (FileExistsError, FileNotFoundError):  # s3fs's names for PreconditionFailed / gone
                return False
            return True
        return self._retry("delete", rel, call)

    def etag(self, rel: str) -> str | None:
        """The object's ETag (None when there is none, or the backend has none)."""
        def call() -> str | None:
            try:
                info = self.fs.info(self._key(rel), refresh=True)
            except FileNotFoundError as exc:
                if "bucket" in str(exc).lower():
                    raise
                return None
            return info.get("ETag") or info.get("etag")
        return self._retry("read", rel, call)

    def upload(self, local: Path, rel: str) -> None:
        """A local file to `rel`: one PUT, or a multipart upload for large files; either way the object
        appears only once complete."""
        self._retry("write", rel, lambda: self.fs.put_file(str(local), self._key(rel)))

    def copy(self, src: str, dst: str) -> None:
        """Server-side copy (no bytes through this machine)."""
        self._retry("write", dst, lambda: self.fs.copy(self._key(src), self._key(dst)))

    def delete(self, rels: list[str]) -> None:
        """Delete objects (bulk requests of up to 1000 keys); ones already gone are fine."""
        for start in range(0, len(rels), 1000):
            part = [self._key(rel) for rel in rels[start:start + 1000]]

            def call(part: list[str] = part) -> None:
                try:
                    self.fs.rm(part)
                except FileNotFoundError as exc:
                    if "bucket" in str(exc).lower():
                        raise
            self._retry("delete", rels[start], call)
