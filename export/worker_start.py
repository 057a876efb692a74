"""The first thing a pool worker of the export (and convert) runs, before it imports numpy: one BLAS
thread, and a watch that ends the worker with the main process.

Why: numpy's OpenBLAS starts one thread per core when it loads, and those threads spin before they
sleep. On a 16-core host each worker spent 1.45 s of CPU on `import numpy` alone (0.2 s of wall),
which was most of what kept 2 workers at 1.53x of 1 worker (docs/benchmarks.md, "Parallel scaling").
The export's tasks call no multi-threaded BLAS work worth a thread pool (they are per-episode numpy
on small arrays), and the pool's workers already use every core, so each worker gets one BLAS / OpenMP
thread. This module lives at the package root, outside `robowds.export.job`, because importing
that package imports numpy: the limit must be in the environment before anything loads OpenBLAS.
Only the worker's own environment changes (the pool's processes are robowds'); a value the user set
is kept.
"""

from __future__ import annotations

import os
import threading
from multiprocessing.connection import Connection

THREAD_LIMITS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def start_worker(lifeline: Connection) -> None:
    """Pool initializer: one BLAS thread per worker, then the watch on the main process."""
    for name in THREAD_LIMITS:
        os.environ.setdefault(name, "1")
    exit_with_parent(lifeline)


def exit_with_parent(lifeline: Connection) -> None:
    """End this worker as soon as the process that started the pool is gone.

    Why a pipe and not the parent's pid: a forkserver worker's parent is the forkserver, not the main
    process, and the forkserver itself waits for its workers before it exits (they hold its "alive"
    pipe), so without this a SIGKILLed export left the forkserver, the resource tracker and every
    worker running for as long as their current task (minutes on a long episode), still writing
    staging files. Only the main process holds the write end of `lifeline`, so reading the read end
    returns EOF exactly when it exits, however it dies (also as an unreaped zombie, and with no pid
    reuse to fool it). `PR_SET_PDEATHSIG` would not help here: it watches the forkserver. Once the
    workers are gone, the forkserver and the resource tracker see EOF on their own pipes and exit.
    """
    def watch() -> None:
        try:
            lifeline.recv_bytes()  # nothing is ever sent: returns only by EOF (or an error)
        except (EOFError, OSError):
            pass
        os._exit(1)  # not sys.exit: the main thread may be deep in a task; staging is resumable

    threading.Thread(target=watch, name="robowds-parent-watch", daemon=True).start()
