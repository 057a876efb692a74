"""Where map and reduce tasks run: in-process or in a local process pool (a cluster backend is planned).

The interface is one method, `map_unordered(fn, items)`, yielding results as tasks finish. Tasks are
top-level functions of picklable arguments whose results carry their own identity, so the job's output
never depends on completion order or on the backend. A Ray backend (planned, not written yet) would
implement the same method with `ray.remote` tasks, imported lazily as an optional extra.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Callable, Iterable, Iterator, Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Executor(Protocol):
    def map_unordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]: ...

    def close(self) -> None: ...


class InlineExecutor:
    """Runs tasks one after the other in this process (workers = 1; easiest to debug)."""

    def map_unordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        for item in items:
            yield fn(item)

    def close(self) -> None:
        pass


class ProcessExecutor:
    """A local process pool. Workers start from a fresh interpreter (forkserver), not a fork of a
    process that already runs pyarrow's threads. At most 2 x workers tasks are in flight, so a huge
    task list is never materialised as futures."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("forkserver"))

    def map_unordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        pending: set[Future[R]] = set()
        for item in items:
            if len(pending) >= 2 * self.workers:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield future.result()
            pending.add(self._pool.submit(fn, item))
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield future.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def make_executor(workers: int) -> Executor:
    return InlineExecutor() if workers <= 1 else ProcessExecutor(workers)
