"""Where `export --append` reads the export it grows and puts what it adds: OUT a folder or an output URL.

Why a module of its own: the append's steps (`job/append.py`) are the same for both kinds of OUT; what
differs is the full export's machinery for each, which an append reuses as it is (never a second
publish):

- a folder (`FolderOut`): the lock `output/out_lock.OutLock`, the work folder `OUT/.robowds-work/`
  (`run._prepare_work`), shards written into its `ready/` and placed by the journaled
  `output/publish.publish`;
- a URL (`UrlOut`, `s3://bucket/prefix`): the lock object `output/remote_lock.RemoteLock` (`--break-lock`),
  a local work folder under `--work-dir` (`remote_job.local_work_dir`), the URL's `.robowds-work/`
  prepared by `remote_job.prepare_remote` (which also discards another job's partial upload), each new
  shard uploaded to its final key as soon as it is written (`remote_job.reduce_shards`; a re-run, on
  any machine, skips the shards a killed or failed run uploaded: their upload records), and the
  journaled `remote_job.publish_remote`.

Why the old export's objects are never rewritten, in both: a publish moves (folder) or copies (URL)
only what is staged in the work folder, and an append stages none of the old export's files: its new
shards have new names (numbered on, so they go straight to their final keys), and the files it does
change are the side files, wids indexes, `.nv-meta/` and the manifest. The journal lists the old
shards (the new manifest does), but with nothing staged for them they are neither moved nor copied,
and it removes nothing (every file of the old manifest is in the new one).

Both first finish a publish a killed run left (its journal), before reading OUT's manifest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from robowds.export.errors import UserError
from robowds.export.job.remote_job import (RemoteState, default_work_root, finish_remote_publish, publish_remote,
                                           read_remote_manifest)
from robowds.export.job.run import WORK_DIR, _prepare_remote_out, _prepare_work, break_lock_error
from robowds.export.output.oserrors import os_error
from robowds.export.output.out_lock import OutLock
from robowds.export.output.publish import finish_publish, publish, read_manifest, remove_work
from robowds.export.output.remote_lock import RemoteLock
from robowds.export.output.remote_out import RemoteOut, is_url


# the fix a refused append names when another export or append holds OUT (a folder's lock)
APPEND_HELD = ("wait for that export or append to finish, then run the append again (it adds what OUT lacks "
               "then; a crashed export frees its lock by itself)")

class AppendOut(Protocol):
    """OUT as an append sees it: read the old export, prepare a work folder, publish."""

    out: Path | str  # what the summary names: the folder, or the URL
    state: RemoteState | None  # the URL's job state once prepared (None for a folder)

    def lock(self) -> OutLock | RemoteLock: ...

    def finish_publish(self) -> None:
        """Carry out a publish a killed run journaled (its journal is this OUT's)."""

    def manifest(self) -> dict[str, Any] | None: ...

    def read(self, rel: str) -> bytes | None:
        """The bytes of the file at `rel` (relative to OUT), None when there is none."""

    def where(self, rel: str) -> str:
        """`rel` as a user finds it: a path or a URL."""

    def prepare(self, job_id: str) -> Path:
        """The local work folder of the append `job_id` (kept if it is this job's: resume)."""

    def publish(self, work: Path, manifest: dict[str, Any], side: dict[str, bytes]) -> list[str]:
        """Put the appended export in place; returns warnings (`.nv-meta/` files of the user's, kept)."""

    def os_error(self, exc: OSError) -> UserError: ...


def append_out(out: Path | str, options: dict[str, Any] | None = None, work_dir: Path | None = None,
               break_lock: bool = False) -> AppendOut:
    """OUT a folder or an fsspec URL (`options`: its storage options; `work_dir`, `break_lock`: as
    `run_export` takes them, for a URL only)."""
    if is_url(out):
        return UrlOut(RemoteOut(str(out), options), work_dir, break_lock)
    if break_lock:
        raise break_lock_error(out)
    return FolderOut(Path(out).resolve())


@dataclass
class FolderOut:
    """OUT a folder: the work folder is `OUT/.robowds-work/`, publish renames."""

    out: Path
    state: RemoteState | None = None

    def lock(self) -> OutLock:
        return OutLock(self.out, hint=APPEND_HELD)

    def finish_publish(self) -> None:
        finish_publish(self.out, self.out / WORK_DIR)

    def manifest(self) -> dict[str, Any] | None:
        return read_manifest(self.out) if self.out.is_dir() else None

    def read(self, rel: str) -> bytes | None:
        path = self.out / rel
        return path.read_bytes() if path.is_file() else None

    def where(self, rel: str) -> str:
        return str(self.out / rel)

    def prepare(self, job_id: str) -> Path:
        return _prepare_work(self.out / WORK_DIR, job_id)

    def publish(self, work: Path, manifest: dict[str, Any], side: dict[str, bytes]) -> list[str]:
        return publish(self.out, work, manifest, side)

    def os_error(self, exc: OSError) -> UserError:
        return os_error(exc, "export", self.out)


@dataclass
class UrlOut:
    """OUT at a URL: a local work folder under `work_dir`, uploads as shards are written, publish by
    server-side copies and conditional puts (`remote_job.py`)."""

    remote: RemoteOut
    work_dir: Path | None = None
    break_lock: bool = False
    state: RemoteState | None = field(default=None)

    @property
    def out(self) -> str:
        return self.remote.url

    def lock(self) -> RemoteLock:
        return RemoteLock(self.remote, self.break_lock)

    def finish_publish(self) -> None:
        finish_remote_publish(self.remote)

    def manifest(self) -> dict[str, Any] | None:
        return read_remote_manifest(self.remote)

    def read(self, rel: str) -> bytes | None:
        return self.remote.get(rel)

    def where(self, rel: str) -> str:
        return self.remote.where(rel)

    def prepare(self, job_id: str) -> Path:
        # overwrite=True: the export there is the one this append grows, so that its job id is not the
        # append's is expected (never "another export"); the append's id hashes that export's, so the
        # URL can never hold a finished export of this very append (prepare's other answer)
        work, state = _prepare_remote_out(self.remote, job_id, True, self.work_dir)
        if isinstance(work, dict) or state is None:
            raise AssertionError(f"{self.remote.url} holds a finished export of the append {job_id}")
        self.state = state
        return work

    def publish(self, work: Path, manifest: dict[str, Any], side: dict[str, bytes]) -> list[str]:
        if self.state is None:
            raise AssertionError("publish before prepare")
        kept = publish_remote(self.state, manifest, side)
        remove_work(work)  # the local staging: every shard is uploaded, the publish is done
        return kept

    def os_error(self, exc: OSError) -> UserError:
        # with OUT at a URL the local file system is the work folder's (the URL's faults are UserErrors)
        return os_error(exc, "export", Path(self.work_dir or default_work_root()))
