"""One export at a time into an OUT folder: an OS advisory lock on `OUT/.robowds-lock`.

Why: two exports into one OUT at once (different seeds, say) both write `.robowds-work/` and both
publish, and what is left is a mix of their shards under one manifest that `verify` rejects, while
one of them exits 0. The export therefore holds this lock from before it looks at OUT (a killed
publish is finished under it too) until it returns, and a second export is refused at once with
the first one's pid and host.

Why `flock` on a file held open: the kernel drops the lock when the process dies, however it dies
(SIGKILL, OOM killer, power loss: the file then stays, unlocked), so a crashed export never leaves
OUT locked and its re-run resumes without any step from the user. The lock belongs to the open file
description: the descriptor is opened close-on-exec, and the job's pool workers start from a
forkserver or Ray (fresh interpreters that never get it), so workers orphaned by a SIGKILLed main
process do not keep OUT locked (tests/test_out_lock.py stops them and checks). Two descriptors of one
process conflict like two processes do, so a test can hold the lock in-process. `flock` works on
local disks and on NFS (Linux maps it to NFS byte-range locks); a file system without locks is one
error naming the fix rather than an unguarded export.

The lock file is deleted at release while still locked (an export that opened it meanwhile sees the
name gone and opens it again: `_open_locked` checks that the locked file is the one under the name),
so a finished export leaves nothing behind.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from robowds.export.errors import UserError

LOCK_NAME = ".robowds-lock"  # in OUT (a folder), or under an output URL (remote_lock.py)
HELD_HINT = ("wait for that export to finish, or export into another output folder (a crashed export frees its "
             "lock by itself)")


@dataclass(frozen=True)
class LockOwner:
    """Who holds a lock: enough for a user to find the process, and for a remote lock's owner to be
    proved dead (`remote_lock.py`: same host and pid namespace, pid gone)."""

    pid: int
    host: str
    started: float  # seconds since the epoch
    pidns: str = ""  # the pid namespace (Linux: /proc/self/ns/pid's target): containers share host names
    token: str = ""  # a remote lock's random id: which process wrote the object

    def describe(self, now: float | None = None) -> str:
        """`pid 123 on host gpu-7, since 2026-11-27 13:40:02 UTC (12 s ago)`."""
        age = max(0.0, (time.time() if now is None else now) - self.started)
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        return f"pid {self.pid} on host {self.host}, since {since} ({_age(age)} ago)"

    def to_bytes(self) -> bytes:
        return json.dumps({"robowds_lock": 1, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def parse(cls, data: bytes | None) -> LockOwner | None:
        """The owner a lock file or object records; None when it is empty (being written) or not ours."""
        try:
            doc: Any = json.loads(data or b"")
            return cls(int(doc["pid"]), str(doc["host"]), float(doc["started"]), str(doc.get("pidns", "")),
                       str(doc.get("token", "")))
        except (ValueError, KeyError, TypeError):
            return None


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def this_process(token: str = "") -> LockOwner:
    return LockOwner(os.getpid(), socket.gethostname(), time.time(), pid_namespace(), token)


def held_error(where: str, owner: LockOwner | None, hint: str) -> UserError:
    """The one message a second export gets: who writes `where`, and the fix."""
    who = owner.describe() if owner is not None else "its pid is not recorded yet"
    return UserError(f"another robowds export is writing {where} ({who}); two exports into one output would mix "
                     f"their shards", hint=hint)


class OutLock:
    """The lock on an OUT folder, as a context manager; `OutLock(out)` can be held by a test too.

    Creates OUT if it does not exist (the lock file lives in it) and removes it again at release if
    the export left it empty (a refused export leaves no trace)."""

    def __init__(self, out: Path, hint: str = HELD_HINT) -> None:
        self.out = out
        self.hint = hint  # the fix a refused export is given (an append's differs: append.py)
        self.path = out / LOCK_NAME
        self._fd: int | None = None
        self._made_out = False

    def __enter__(self) -> OutLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock or raise the UserError naming its holder; never waits."""
        if self.out.exists() and not self.out.is_dir():
            raise UserError(f"output folder {self.out} is a file", hint="choose an empty or new folder")
        self._made_out = not self.out.exists()
        self.out.mkdir(parents=True, exist_ok=True)
        try:
            self._fd = self._open_locked()
        except BaseException:
            self._remove_made_out()
            raise
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, this_process().to_bytes(), 0)  # read by a refused export, for its message

    def _open_locked(self) -> int:
        for _ in range(100):  # another export deleting the file between our open and flock: open again
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = LockOwner.parse(os.pread(fd, 4096, 0))
                os.close(fd)
                raise held_error(str(self.out), owner, self.hint) from None
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise UserError(f"cannot lock output folder {self.out}: its file system has no file locks "
                                    f"({exc.strerror})", hint="export into a folder on a local disk or an NFS "
                                    "mount with locking, then copy the export where you need it") from exc
                raise
            try:
                named = os.stat(self.path)
            except FileNotFoundError:
                named = None
            here = os.fstat(fd)
            if named is not None and (named.st_dev, named.st_ino) == (here.st_dev, here.st_ino):
                return fd
            os.close(fd)  # we locked a file the previous holder had already deleted
        raise UserError(f"cannot lock output folder {self.out}: {self.path} keeps being replaced",
                        hint="make sure only robowds exports write into that folder, then re-run")

    def release(self) -> None:
        """Delete the lock file (still locked, so no export takes the old one), then unlock."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None
            self._remove_made_out()

    def _remove_made_out(self) -> None:
        if self._made_out:
            try:
                self.out.rmdir()  # only if empty: whatever the export wrote there stays
            except OSError:
                pass
            self._made_out = False
