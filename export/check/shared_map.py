"""Run a function over tasks on this process and a pool at once, results in task order.

Why not only a pool: `verify --workers 2` with a pool of 2 left this process waiting while the pool
started (a forkserver, then each worker importing numpy, Pillow and the reader: ~0.5-1 s on the 2-core
VM, ~2 s under load) and then idling while the pool checked. Here this process is one of the
`processes`: it starts on the first task at once, while a pool of `processes - 1` starts beside it, and
both take the next task from one queue, so neither waits for the other until the queue is empty.

Tasks are taken largest first (`cost`), so what is left for the last process to finish at the end is
a small task, not a large one. Results are still handed back in task order: a result that arrives
early waits in `done` until those before it are handed back; at worst (one very slow large task)
that holds every later task's result, O(tasks) small objects (a verify result is its shard's keys).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Generic, Iterator, Sequence, TypeVar

from robowds.export.executors.executor import ProcessExecutor

T = TypeVar("T")
R = TypeVar("R")


class _Shared(Generic[R]):
    """What this process and the pool's feeder thread share: the queue of task indices not yet taken
    (a deque: `popleft` is atomic), the results not yet handed back, and the feeder's error."""

    def __init__(self, order: list[int]) -> None:
        self.queue: deque[int] = deque(order)
        self.done: dict[int, R] = {}
        self.error: BaseException | None = None
        self.feeding = True
        self.stop = False
        self.changed = threading.Condition()

    def take(self) -> Iterator[int]:
        """Task indices for the pool, taken one at a time as it has room (never ahead of its need)."""
        while not self.stop:
            try:
                yield self.queue.popleft()
            except IndexError:
                return

    def put(self, index: int, result: R) -> None:
        with self.changed:
            self.done[index] = result
            self.changed.notify()


def _indexed(job: tuple[Callable[[T], R], int, T]) -> tuple[int, R]:
    """A pool task: the result with its task's index (the pool hands results back as they finish)."""
    fn, index, task = job
    return index, fn(task)


def map_shared(fn: Callable[[T], R], tasks: Sequence[T], processes: int,
               cost: Callable[[T], int]) -> Iterator[R]:
    """`fn` over `tasks` on this process and a pool of `processes - 1` (>= 1) at once, largest `cost`
    first; yields the results in task order. An exception from `fn`, here or in the pool, is raised
    here (the pool's after its tasks in flight end); closing the iterator early stops the pool."""
    if not tasks:
        return
    order = sorted(range(len(tasks)), key=lambda i: -cost(tasks[i]))
    shared: _Shared[R] = _Shared(order)

    def feed() -> None:
        pool = ProcessExecutor(processes - 1)
        try:
            jobs = ((fn, index, tasks[index]) for index in shared.take())
            for index, result in pool.map_unordered(_indexed, jobs):
                shared.put(index, result)
        except BaseException as exc:  # handed to the caller's thread, raised there
            shared.error = exc
        finally:
            pool.close()
            with shared.changed:
                shared.feeding = False
                shared.changed.notify()

    feeder = threading.Thread(target=feed, name="robowds-verify-pool", daemon=True)
    first = shared.queue.popleft()  # the largest is this process's, taken before the pool can take it
    feeder.start()
    try:
        shared.put(first, fn(tasks[first]))
        for index in range(len(tasks)):
            while index not in shared.done:
                try:
                    mine = shared.queue.popleft()
                except IndexError:  # all taken: wait for the pool's
                    with shared.changed:
                        shared.changed.wait_for(lambda: index in shared.done or not shared.feeding)
                    if index not in shared.done:
                        raise shared.error or RuntimeError("the pool ended without this task's result")
                    break
                shared.put(mine, fn(tasks[mine]))
                if shared.error is not None:  # the pool failed: stop at once, not after every task here
                    raise shared.error
            yield shared.done.pop(index)
    finally:
        shared.stop = True
        feeder.join()
