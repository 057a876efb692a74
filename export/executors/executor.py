"""Where map and reduce tasks run: in-process, in a local process pool, or as Ray tasks on a cluster.

The interface is `map_unordered(fn, items)`, yielding results as tasks finish, and `map_ordered`,
yielding them in task order (converters write their store in source order, so the bytes never depend
on the worker count). Tasks are
top-level functions of picklable arguments whose results carry their own identity, so the job's output
never depends on completion order or on the backend. `ExecutorChoice` is what the command line picks
(`--executor local|ray`, `--address`); the Ray backend lives in `ray_executor.py` and is imported only
when chosen, so Ray stays an optional extra (`robowds[ray]`).
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol, TypeVar

from robowds.export.errors import UserError
from robowds.export.executors.task_usage import TaskUsage, run_timed
from robowds.export.worker_start import start_worker

T = TypeVar("T")
R = TypeVar("R")


class Executor(Protocol):
    """A backend may also have `usage: TaskUsage` (what its tasks cost, where they ran): the job's
    phase profile reads it where present (every backend here has it)."""

    workers: int  # tasks that run at once: the job sizes its batches of episodes by it
    in_flight: int  # tasks submitted and not yet handed back, at most (what their outputs may hold on disk)

    def map_unordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]: ...

    def map_ordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]: ...

    def check_shared(self, folder: Path, read: Iterable[Path] = ()) -> None:
        """Raise UserError unless every machine that runs tasks sees `folder` (tasks write there) and
        the paths in `read` (tasks read them) as this process does: a no-op on one machine."""

    def close(self) -> None: ...


class InlineExecutor:
    """Runs tasks one after the other in this process (workers = 1; easiest to debug)."""

    workers = 1
    in_flight = 1

    def __init__(self) -> None:
        self.usage = TaskUsage()

    def map_unordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        for item in items:
            result, (pid, cpu, wall, _) = run_timed(fn, item)
            self.usage.add(pid, cpu, wall, None)
            yield result

    map_ordered = map_unordered  # one task at a time: completion order is task order

    def check_shared(self, folder: Path, read: Iterable[Path] = ()) -> None:
        pass  # this process is the only one

    def close(self) -> None:
        pass


class ProcessExecutor:
    """A local process pool. Workers start from a fresh interpreter (forkserver), not a fork of a
    process that already runs pyarrow's threads. At most 2 x workers tasks are in flight, so a huge
    task list is never materialised as futures. Workers exit when this process dies (see
    `exit_with_parent`) and run one BLAS thread each (`robowds.export.worker_start`)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.in_flight = 2 * workers  # map_unordered / map_ordered keep this many submitted
        self.usage = TaskUsage()
        self._broken = False  # a worker died: close() ends the others instead of waiting for them
        context = multiprocessing.get_context("forkserver")
        # the read end goes to every worker (duplicated into it by the forkserver at start); the write
        # end stays here only: the forkserver and resource tracker get explicit fds, never this one
        self._lifeline, self._keepalive = context.Pipe(duplex=False)
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=context,
                                         initializer=start_worker, initargs=(self._lifeline,))

    def map_unordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        pending: set[Future[tuple[R, Any]]] = set()
        for item in items:
            if len(pending) >= self.in_flight:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield self._result(future)
            pending.add(self._submit(fn, item))
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield self._result(future)

    def _submit(self, fn: Callable[[T], R], item: T) -> Future[tuple[R, tuple[int, float, float, float]]]:
        try:
            return self._pool.submit(run_timed, fn, item)
        except BrokenProcessPool as exc:  # the pool broke before this task: the same message
            raise self._died() from exc

    def _result(self, future: Future[tuple[R, tuple[int, float, float, float]]]) -> R:
        try:
            result, timing = future.result()
        except BrokenProcessPool as exc:  # a worker died mid-task (OOM killer, SIGKILL, a crash in C code)
            raise self._died() from exc
        self.usage.add(*timing)
        return result

    def _died(self) -> UserError:
        self._broken = True
        return UserError("a worker process of the pool died while running a task (killed by the system, "
                         "e.g. out of memory, or crashed); nothing finished is lost",
                         hint="re-run the same command: it resumes from the steps already finished; a worker "
                              "that keeps dying is usually out of memory (check `dmesg`), so try fewer --workers")

    def map_ordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """Results in task order, with at most 2 x workers tasks in flight: a slow task holds back the
        ones after it (their results wait in memory, bounded by the window), never reorders them."""
        pending: deque[Future[tuple[R, Any]]] = deque()
        for item in items:
            if len(pending) >= self.in_flight:
                yield self._result(pending.popleft())
            pending.append(self._submit(fn, item))
        while pending:
            yield self._result(pending.popleft())

    def check_shared(self, folder: Path, read: Iterable[Path] = ()) -> None:
        pass  # workers on this machine see its file system

    def close(self) -> None:
        if self._broken:
            # Every worker ends now (see exit_with_parent). Without this a broken pool's shutdown could
            # wait forever: CPython 3.11's manager thread terminates the workers it knows, sends stop
            # sentinels to those alive, then joins every worker, including one that `submit` started
            # meanwhile, which got neither (an export whose worker was SIGKILLed hung in `p.join()`
            # 1 time in 92 here, and in CI).
            self._keepalive.close()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._keepalive.close()  # after shutdown: closing it first would end workers mid-task
        self._lifeline.close()


@dataclass(frozen=True)
class ExecutorChoice:
    """Which backend runs the tasks (`--executor`, `--address`); the output is the same bytes for each.

    `local`: in-process for 1 worker, else a process pool. `ray`: Ray tasks, on a new local Ray
    instance of `workers` CPUs, or on the cluster at `address` (what `ray.init(address=...)` takes),
    or on the Ray this process already initialised; a task whose worker process died is re-run up to
    `max_retries` times (tasks are idempotent: a step is done iff its output exists under its final
    name)."""

    kind: str = "local"  # or "ray"
    address: str | None = None
    max_retries: int = 3

    def __post_init__(self) -> None:
        if self.kind not in ("local", "ray"):
            raise ValueError(f"executor kind must be 'local' or 'ray', got {self.kind!r}")

    def check_available(self) -> None:
        """Fail before anything is written when the backend cannot run here (Ray not installed)."""
        if self.kind == "ray":
            from robowds.export.executors.ray_executor import import_ray

            import_ray()

    def make(self, workers: int) -> Executor:
        if self.kind == "ray":
            from robowds.export.executors.ray_executor import RayExecutor

            return RayExecutor(workers, address=self.address, max_retries=self.max_retries)
        return InlineExecutor() if workers <= 1 else ProcessExecutor(workers)


LOCAL = ExecutorChoice()


def make_executor(workers: int, choice: ExecutorChoice = LOCAL) -> Executor:
    return choice.make(workers)
