"""Refuse, up front, a temporary folder whose path is too long for the DataLoader workers' sockets.

Why: with torch's default sharing strategy (`file_descriptor`) a worker hands each batch's shared
memory to the main process as a file descriptor, through a multiprocessing listener on an AF_UNIX
socket under the temporary folder (`<TMPDIR>/pymp-XXXXXXXX/listener-XXXXXXXX`). A socket path may
have at most 107 bytes (Linux's `sockaddr_un.sun_path` is 108 bytes with the terminating NUL; 104 on
macOS and the BSDs). With a longer TMPDIR (job schedulers set per-job ones such as
`/scratch/slurm/job-1234567/...`) the bind fails inside the worker's queue feeder thread, which only
prints a traceback: the batch is lost and the loader waits for it forever.

Why an error and not a fallback to a short folder: the temporary folder is the process's, not the
reader's. Redirecting it (`tempfile.tempdir`, or multiprocessing's cached folder) would move every
other library's temporary files too, out of a folder the user or the scheduler chose on purpose (a
job-private scratch space with its own quota and clean-up) into a shared `/tmp` that may be small or
not cleaned. One message naming the variable, its length, the limit and the fix costs the user one
restart.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import sys
import tempfile

SUN_PATH_MAX = 107 if sys.platform.startswith("linux") else 103  # bytes of a socket path, without the NUL


class TempDirTooLong(RuntimeError):
    """The temporary folder's path leaves no room for the workers' socket paths (the message ends with
    the fix on a `  fix:` line, as the CLI's user errors do)."""


def socket_path(sharing_strategy: str) -> str:
    """The longest socket path the workers need under torch's `sharing_strategy`: multiprocessing's
    listener that passes descriptors (`file_descriptor`, the default), or torch's shared-memory
    manager (`file_system`: `<tmp>/torch-shm-dir-XXXXXX/manager.sock`, a folder of at most 73 bytes
    measured with torch 2.13; it fails loudly, "torch_shm_manager ...: Invalid argument", not naming
    TMPDIR). multiprocessing is asked for its own path, so a Python that already picks a shorter
    folder on its own passes; only a name is made, not the socket (multiprocessing's `pymp-` folder
    is, as the first worker would make it, and removed at exit)."""
    if sharing_strategy == "file_system":
        return os.path.join(tempfile.gettempdir(), "torch-shm-dir-XXXXXX", "manager.sock")
    return multiprocessing.connection.arbitrary_address("AF_UNIX")


def check_socket_dir(sharing_strategy: str) -> None:
    """Raise `TempDirTooLong` when the workers' batches could not cross to the main process."""
    address = socket_path(sharing_strategy)
    size = len(os.fsencode(address))
    if size <= SUN_PATH_MAX:
        return
    folder = tempfile.gettempdir()
    variable = next((v for v in ("TMPDIR", "TEMP", "TMP") if os.environ.get(v)), "the temporary folder")
    room = SUN_PATH_MAX - (size - len(os.fsencode(folder)))
    raise TempDirTooLong(
        f"{variable} is {len(os.fsencode(folder))} bytes long ({folder}): DataLoader workers hand each batch to "
        f"the main process through an AF_UNIX socket under it ({address}, {size} bytes), and a socket path may "
        f"have at most {SUN_PATH_MAX} bytes, so the batches could not cross (the loader would wait forever)\n"
        f"  fix: run with a temporary folder of at most {room} bytes, e.g. `TMPDIR=/tmp python train.py`, "
        "or read with num_workers=0")
