"""What tasks cost, measured where they run (a pool worker, a Ray worker, or this process): shared by
every executor backend (`executor.py`, `ray_executor.py`) and read by the job's phase profile
(`profile.py`). Its own module so that the backends import it without importing each other.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class TaskUsage:
    """CPU and wall seconds spent in tasks, measured where they run: what `run.py`'s phase profile
    (`export/executors/profile.py`) sets against the parent's own CPU time to find the serial share.

    `worker_cpu_s` holds, per worker process, its whole CPU time (start-up, imports, argument
    unpickling and every task so far) as of its latest finished task; minus `cpu_s` it is the pool's
    per-worker overhead. O(workers) entries, whatever the number of tasks."""

    tasks: int = 0
    cpu_s: float = 0.0  # inside the task functions, summed over tasks
    wall_s: float = 0.0
    worker_cpu_s: dict[int, float] = field(default_factory=dict)  # pid -> CPU s of that whole process
    each_cpu_s: list[float] = field(default_factory=list)  # per task, in completion order: 8 bytes a task

    def add(self, pid: int, cpu_s: float, wall_s: float, process_cpu_s: float | None) -> None:
        """`process_cpu_s`: None for a task run in this process (no worker to account for)."""
        self.tasks += 1
        self.cpu_s += cpu_s
        self.wall_s += wall_s
        self.each_cpu_s.append(cpu_s)
        if process_cpu_s is not None:
            self.worker_cpu_s[pid] = max(process_cpu_s, self.worker_cpu_s.get(pid, 0.0))


def _process_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def run_timed(fn: Callable[[T], R], item: T) -> tuple[R, tuple[int, float, float, float]]:
    """Runs one task in a pool worker and measures it there: (result, (pid, task CPU s, task wall s,
    the worker's whole CPU s so far))."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(item)
    return result, (os.getpid(), time.process_time() - cpu, time.perf_counter() - wall, _process_cpu_s())
