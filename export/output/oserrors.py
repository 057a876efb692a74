"""File system failures (disk full, read-only, no permission, a file where a folder must be) as one
user error: what happened to which path, and what to do.

Why here and not at each `open`: the export writes from many places and from worker processes (the
error comes back pickled, errno and path intact), and the fix depends only on the errno, not on the
call site. Anything the user cannot fix by freeing space, choosing another folder or fixing a path
is not an OSError, and stays a traceback (a bug).
"""

from __future__ import annotations

import errno
from pathlib import Path

from robowds.export.errors import UserError

RESUME = "re-run the same command: finished steps are kept and the result is byte-identical"


def work_note(work: Path) -> str:
    """How to get rid of an unfinished export's work folder (partial `*.tmp-PID` files included)."""
    if not work.is_dir():
        return ""
    size = sum(p.stat().st_size for p in work.rglob("*") if p.is_file())  # one stat per staged file
    return (f"the unfinished export in {work} ({size / 1e6:.1f} MB) is resumed by re-running the same command "
            f"(a run with another store or config replaces it); delete that folder to start over or to free "
            f"its space now")


def _file_in_the_way(path: Path) -> Path | None:
    """The first of `path` and its parents that exists and is not a folder."""
    for candidate in [*reversed(path.parents), path]:
        if candidate.exists() and not candidate.is_dir():
            return candidate
    return None


def os_error(exc: OSError, command: str, out: Path | None = None, work: Path | None = None) -> UserError:
    """The `UserError` for `exc`, raised while `command` ran (with `out`: while writing into OUT)."""
    path = Path(exc.filename) if isinstance(exc.filename, (str, Path)) else None
    if out is not None and path is not None and not path.resolve().is_relative_to(out.resolve()):
        out = work = None  # not the output: a store file that went away or cannot be read
    reason = exc.strerror or str(exc)
    code = exc.errno
    if out is not None:
        what = f"output folder {out}"
        folder = "an output folder"
        detail = f" ({path}: {reason})" if path is not None and path != out else f" ({reason})"
    else:
        what = str(path) if path is not None else "a file"
        folder = "a folder"
        detail = f" ({reason})"
    if code in (errno.ENOSPC, errno.EDQUOT):
        hint = (f"free space on that disk (or choose {folder} on a larger one) and {RESUME}"
                + (f"; to give back the space of the unfinished export now, delete {work}" if work else ""))
        return UserError(f"disk full while writing {'into ' if out is not None else ''}{what}{detail}", hint=hint)
    if code == errno.EROFS:
        return UserError(f"cannot write {what}: read-only file system{detail if path != out else ''}",
                         hint=f"choose {folder} on a writable file system")
    if code in (errno.EACCES, errno.EPERM):
        return UserError(f"no permission to write {what}{detail}",
                         hint=f"choose {folder} you may write to, or fix its permissions")
    if code == errno.ENOTDIR:
        culprit = _file_in_the_way(out if out is not None else path) if (out or path) else None
        where = f": {culprit} is a file, not a folder" if culprit else f": a part of the path is a file{detail}"
        return UserError(f"cannot create {what}{where}", hint=f"choose {folder} whose parents are all folders")
    if code == errno.EISDIR:
        return UserError(f"{what} is a folder, a file was expected", hint=f"pass a file to `robowds {command}`")
    if code == errno.ENOENT:
        return UserError(f"{what} does not exist{detail}", hint="check the path")
    return UserError(f"file system error on {what}{detail}",
                     hint=f"fix the cause and {RESUME}" if command == "export" else "fix the cause and re-run")
