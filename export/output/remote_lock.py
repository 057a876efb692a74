"""One export at a time into an output URL: a lock object `<prefix>/.robowds-lock` made by a
conditional put (S3's `If-None-Match: *`: the PUT fails when the object exists, atomically, on the
server), holding its owner (`out_lock.LockOwner`: pid, host, pid namespace, start time, a random token).

Why an object and not a heartbeat: an object store cannot tell that the process behind a lock died.
The lock is deleted when the export ends, fails or is interrupted (Ctrl-C); it stays only when the
process is killed (SIGKILL, OOM killer, a crashed machine). Then:

- the re-run on the same machine takes it over by itself: the owner's host and pid namespace are
  this process's, and its pid no longer runs, which proves the lock stale (a reused pid only makes
  the check refuse, never wrongly take over). The stale object is deleted with `If-Match` on the
  ETag it had when judged, so of two re-runs racing for it only one wins;
- from another machine nothing can prove the owner dead, so the export is refused with the owner and
  the lock's age, and the fix: `--break-lock` once the user knows that export is gone. An expiry
  after N minutes without a heartbeat was the other choice: it would need a thread rewriting the
  object, a threshold no value of which fits every network, and it breaks a live export's lock
  whenever its heartbeat is late, which is the very mix the lock exists to prevent. A person's
  `--break-lock` after an age shown in the message is rarer and never wrong by itself.

Release deletes only the lock object, and only while it still holds this process's token.
"""

from __future__ import annotations

import os
import socket
import uuid

from robowds.export.output.out_lock import LOCK_NAME, LockOwner, held_error, pid_namespace, this_process
from robowds.export.output.remote_out import RemoteOut


def _dead_here(owner: LockOwner) -> bool:
    """Whether `owner` provably no longer runs: same host and pid namespace, and no such pid."""
    if owner.host != socket.gethostname() or owner.pidns != pid_namespace() or not owner.pidns:
        return False
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


class RemoteLock:
    """The lock object under `out`, as a context manager; `break_lock` deletes a lock that another
    (crashed) export left before taking it (only a robowds lock object: one that parses as one)."""

    def __init__(self, out: RemoteOut, break_lock: bool = False) -> None:
        self.out = out
        self.break_lock = break_lock
        self.owner = this_process(uuid.uuid4().hex)
        self._held = False

    def __enter__(self) -> RemoteLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock or raise the UserError naming its holder, its age and the fix."""
        data, may_break = self.owner.to_bytes(), self.break_lock
        self._held = True  # until refused: release() deletes the object only if it holds our token
        for _ in range(3):  # a lock deleted (released, or stale and taken over) between our tries
            if self.out.create(LOCK_NAME, data):
                return
            etag = self.out.etag(LOCK_NAME)
            holder = LockOwner.parse(self.out.get(LOCK_NAME))
            if holder is not None and holder.token == self.owner.token:
                return  # our own PUT landed, its answer was lost and the retry found it
            if etag is None:
                continue  # gone meanwhile: try again
            if holder is not None and (may_break or _dead_here(holder)):
                self.out.delete_if(LOCK_NAME, etag)  # False: replaced meanwhile; the next create decides
                may_break = False  # --break-lock breaks the lock it was given for, never a newer one
                continue
            self._held = False
            raise self._held_by(holder)
        self._held = False
        raise self._held_by(LockOwner.parse(self.out.get(LOCK_NAME)))

    def _held_by(self, holder: LockOwner | None) -> Exception:
        lock = self.out.where(LOCK_NAME)
        if holder is None and self.out.get(LOCK_NAME) is not None:
            return held_error(self.out.url, None, f"{lock} is not a robowds lock: move it away and re-run")
        return held_error(self.out.url, holder,
                          f"wait for that export to finish, or export to another URL; if it is no longer "
                          f"running (killed, or its machine crashed), re-run with --break-lock, which "
                          f"deletes {lock}")

    def release(self) -> None:
        """Delete the lock object if it still holds this process's token (never another export's)."""
        if not self._held:
            return
        self._held = False
        etag = self.out.etag(LOCK_NAME)
        holder = LockOwner.parse(self.out.get(LOCK_NAME))
        if holder is not None and holder.token == self.owner.token:
            self.out.delete_if(LOCK_NAME, etag)
