"""Where an export's CPU time goes, per phase: the parent process's own, and its tasks'.

Why: on a shared machine wall-clock speedups of 2 workers over 1 are noise, but CPU seconds are not.
The parent's CPU time in a phase where tasks run (planning, result handling, the pool's own threads)
and in the phases between them (loading records, planning shards, the manifest) is the serial part
that caps parallel scaling (Amdahl); the tasks' CPU time is the parallel part, and a worker's CPU time
outside its tasks (start-up, imports, argument unpickling) is the pool's overhead.
`scripts/bench_export.py` prints this breakdown. Cost: two clock reads per phase and per task.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from robowds.export.executors.task_usage import TaskUsage


@dataclass
class Phase:
    wall_s: float = 0.0
    parent_cpu_s: float = 0.0  # this process, all its threads, tasks run in-process excluded
    tasks: int = 0
    task_cpu_s: float = 0.0  # inside the task functions, wherever they ran
    task_wall_s: float = 0.0
    task_cpu_each: list[float] = field(default_factory=list)  # per task: how evenly the work can split


class JobProfile:
    """A lap clock over the job's phases: `lap(name)` closes the phase that began at the previous lap
    (or at construction), so the job marks phase ends without wrapping its code in blocks. Holds the
    phases in the order they ran, plus the workers' whole CPU time (start-up included)."""

    def __init__(self) -> None:
        self.phases: dict[str, Phase] = {}
        self.worker_cpu_s = 0.0  # pool workers' whole CPU time, as of their last task (0 in-process)
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        self._seen: tuple[int, float, float] = (0, 0.0, 0.0)  # the executor usage at the previous lap

    def lap(self, name: str, usage: TaskUsage | None = None) -> None:
        """Close the current phase as `name`; `usage`: the executor's task accounting, if it ran tasks
        (one executor per job: its counters only grow)."""
        wall, cpu = time.perf_counter(), time.process_time()
        entry = self.phases.setdefault(name, Phase())
        entry.wall_s += wall - self._wall
        entry.parent_cpu_s += cpu - self._cpu
        self._wall, self._cpu = wall, cpu
        if usage is None:
            return
        first, task_cpu, task_wall = self._seen[0], usage.cpu_s - self._seen[1], usage.wall_s - self._seen[2]
        self._seen = (usage.tasks, usage.cpu_s, usage.wall_s)
        entry.tasks += usage.tasks - first
        entry.task_cpu_each += usage.each_cpu_s[first:]
        entry.task_cpu_s += task_cpu
        entry.task_wall_s += task_wall
        if usage.worker_cpu_s:
            self.worker_cpu_s = sum(usage.worker_cpu_s.values())
        else:  # the tasks ran in this process: their CPU time is not the parent's own
            entry.parent_cpu_s -= task_cpu

    def to_json(self) -> dict[str, Any]:
        """Seconds per phase and the totals the scaling argument needs (see `amdahl_bound`)."""
        parent = sum(p.parent_cpu_s for p in self.phases.values())
        tasks = sum(p.task_cpu_s for p in self.phases.values())
        return {"phases": {n: {k: _rounded(v) for k, v in p.__dict__.items()} for n, p in self.phases.items()},
                "parent_cpu_s": round(parent, 4), "task_cpu_s": round(tasks, 4),
                "worker_overhead_cpu_s": round(max(0.0, self.worker_cpu_s - tasks), 4) if self.worker_cpu_s else 0.0,
                "wall_s": round(sum(p.wall_s for p in self.phases.values()), 4)}


def amdahl_bound(serial_s: float, parallel_s: float, workers: int) -> float:
    """Best speedup of `workers` over one when `serial_s` CPU seconds cannot overlap the tasks and
    `parallel_s` split perfectly: (serial + parallel) / (serial + parallel / workers)."""
    total = serial_s + parallel_s
    return total / (serial_s + parallel_s / workers) if total else 1.0


def _rounded(value: Any) -> Any:
    if isinstance(value, list):
        return [round(v, 4) for v in value]
    return round(value, 4) if isinstance(value, float) else value
