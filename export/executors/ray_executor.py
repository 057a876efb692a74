"""The Ray backend of the executor interface (`--executor ray`): the same map and reduce functions as the
process pool, run as Ray tasks on one machine or a cluster.

Ray is an optional extra (`pip install 'robowds[ray]'`) and is imported only here, only when this
backend is chosen (`import robowds.export...` never imports it: a test checks that), because it is a
large install and slow to import.

Why the output is byte-identical to `--workers 1`: tasks are the same top-level functions, their
results carry their own identity, and every step writes its output to a temp name and renames it
into place, so a task may run anywhere, in any order, and run again. That last point is what makes
retries safe: a task whose worker process died (SIGKILL, OOM killer, a lost node) is re-run by Ray up to
`max_retries` times, and the re-run skips what the dead attempt already finished. A task that raised
is never retried: its exception (a `UserError`, an `OSError`, a bug) reaches the caller as the
original exception, so the command prints the same message as with the local executor.

Tasks read the store and write staging files and shards under OUT, and the driver (this process)
reads them back: every node must see both at the same path. `check_shared` probes every live node
before the first task and names those that do not.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from robowds.export.errors import UserError
from robowds.export.executors.task_usage import TaskUsage, run_timed

T = TypeVar("T")
R = TypeVar("R")

INSTALL_HINT = "pip install 'robowds[ray]'"
CHECK_TIMEOUT_S = 300.0  # a node whose probe has not run by then (no free slot, unreachable) is reported
TASKS_PER_CPU = 2  # tasks in flight per CPU, as ProcessExecutor: the next one is queued when one ends


def import_ray() -> Any:
    """The `ray` module, or one UserError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise UserError(f"--executor ray needs Ray, which is not installed in this Python ({exc})",
                        hint=f"{INSTALL_HINT}, or use --executor local") from None
    return ray


def _call(fn: Callable[[T], R], item: T) -> tuple[R, tuple[int, float, float, float]]:
    """The one remote function: runs `fn(item)` in a Ray worker and measures it there, as the process
    pool does (`task_usage.run_timed`). One trampoline instead of `ray.remote(fn)` so that any picklable
    callable is a task, as with the process pool."""
    return run_timed(fn, item)


def _sees(probe: str, token: str, read: list[str]) -> list[str]:
    """Runs on one node: what of the shared paths this node does not see as the driver does."""
    missing = []
    try:
        if Path(probe).read_text() != token:
            missing.append(str(Path(probe).parent))
    except OSError:
        missing.append(str(Path(probe).parent))
    return missing + [p for p in read if not Path(p).exists()]


class RayExecutor:
    """Tasks on Ray, at most `TASKS_PER_CPU` x the cluster's CPUs in flight (a huge task list is never
    submitted at once, and results are fetched as they come, so the driver's memory stays bounded).

    Without `address`, and when this process has not initialised Ray itself, a new local Ray instance
    of `workers` CPUs is started and shut down by `close`. With `address` it connects to that cluster
    (`auto`, `HOST:PORT`, `ray://HOST:10001`) and disconnects on `close`. A Ray this process already
    initialised (a notebook, a test) is used as it is and left running.
    """

    def __init__(self, workers: int, address: str | None = None, max_retries: int = 3) -> None:
        ray = import_ray()
        self._ray = ray
        self.max_retries = max_retries
        self._owned = not ray.is_initialized()
        if self._owned:
            try:
                if address:
                    ray.init(address=address, logging_level=logging.WARNING)
                else:  # "local": a new instance, never an unrelated `ray start` cluster found on this machine
                    ray.init(address="local", num_cpus=workers, include_dashboard=False,
                             logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
                where = f"the Ray cluster at {address!r}" if address else "a local Ray instance"
                raise UserError(f"could not start or reach {where}: {exc}",
                                hint="check --address (`auto` on a cluster node, HOST:PORT of the head node or "
                                     "ray://HOST:10001) and that `ray status` works there" if address else
                                     "see the Ray logs under /tmp/ray/session_latest/logs, or use "
                                     "--executor local") from exc
        cpus = int(ray.cluster_resources().get("CPU", 0))
        self.workers = max(1, cpus if cpus else workers)
        self.in_flight = TASKS_PER_CPU * self.workers  # the window of map_unordered / map_ordered
        self.usage = TaskUsage()  # measured in the Ray workers, as with the process pool (profile.py)
        self._remote = ray.remote(max_retries=max_retries, num_cpus=1)(_call)

    def _submit(self, fn: Callable[[T], R]) -> Callable[[T], Any]:
        name = getattr(fn, "__name__", type(fn).__name__)  # the task's name in `ray list tasks` and ps
        remote = self._remote.options(name=name)
        fn_ref = self._ray.put(fn)  # sent once, not with every task
        return lambda item: remote.remote(fn_ref, item)

    def _get(self, ref: Any, fn: Callable[..., Any]) -> Any:
        """The task's result, or the task's own exception (unwrapped from Ray's), or one UserError when
        Ray could not run it (its worker died `max_retries` + 1 times, its node was lost)."""
        ray = self._ray
        try:
            result, timing = ray.get(ref)
            self.usage.add(*timing)
            return result
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException) and not isinstance(cause, ray.exceptions.RayError):
                raise cause from exc  # the remote traceback stays attached for bugs
            raise
        except ray.exceptions.RayError as exc:
            name = getattr(fn, "__name__", type(fn).__name__)
            tries = f"{self.max_retries + 1} attempt(s)" if self.max_retries >= 0 else "every attempt"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise UserError(f"Ray could not finish a {name} task after {tries}: {type(exc).__name__}: {first}",
                            hint="re-run the same command: it resumes from the steps already finished; a worker "
                                 "that keeps dying is usually out of memory (see `ray logs` on its node, or "
                                 "give it fewer CPUs' worth of tasks)") from exc

    def _cancel(self, refs: Iterable[Any]) -> None:
        """Stop tasks whose results nobody will read (after an error, or a consumer that stopped)."""
        for ref in refs:
            try:
                self._ray.cancel(ref)
            except Exception:  # noqa: BLE001 - already finished or its worker gone: nothing to stop
                pass

    def map_unordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        submit = self._submit(fn)
        window = self.in_flight
        pending: list[Any] = []
        try:
            for item in items:
                while len(pending) >= window:
                    ready, pending = self._ray.wait(pending, num_returns=1)
                    yield self._get(ready[0], fn)
                pending.append(submit(item))
            while pending:
                ready, pending = self._ray.wait(pending, num_returns=1)
                yield self._get(ready[0], fn)
        finally:
            self._cancel(pending)

    def map_ordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """Results in task order; a slow task holds back the ones after it, never reorders them."""
        submit = self._submit(fn)
        window = self.in_flight
        pending: deque[Any] = deque()
        try:
            for item in items:
                if len(pending) >= window:
                    yield self._get(pending.popleft(), fn)
                pending.append(submit(item))
            while pending:
                yield self._get(pending.popleft(), fn)
        finally:
            self._cancel(pending)

    def check_shared(self, folder: Path, read: Iterable[Path] = ()) -> None:
        """Every live node must see `folder` (a probe file written here is read back there) and the paths
        in `read`; raise one UserError naming the nodes and paths that do not. On one machine it always
        passes; nodes added later by an autoscaler are not probed."""
        ray = self._ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        token = uuid.uuid4().hex
        probe = Path(folder) / f".robowds-node-check-{token}"
        probe.write_text(token)
        try:
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            check = ray.remote(num_cpus=0, max_retries=self.max_retries)(_sees)
            refs = [check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                    .remote(str(probe), token, [str(p) for p in read]) for n in nodes]
            try:
                results = ray.get(refs, timeout=CHECK_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                self._cancel(refs)
                raise UserError(f"the Ray cluster's nodes did not answer within {CHECK_TIMEOUT_S:.0f} s whether "
                                f"they see {folder}", hint="check the cluster with `ray status`") from None
            except ray.exceptions.RayError as exc:  # a node lost between listing and probing it
                raise UserError(f"could not check that every Ray node sees {folder}: {type(exc).__name__}: "
                                f"{str(exc).strip()[:300]}", hint="check the cluster with `ray status`, then "
                                                                "re-run") from exc
        finally:
            probe.unlink(missing_ok=True)
        blind = [f"{n.get('NodeManagerAddress', n['NodeID'])} (not: {', '.join(missing)})"
                 for n, missing in zip(nodes, results) if missing]
        if blind:
            raise UserError(f"Ray node(s) do not see the folders the tasks share with this process: "
                            f"{'; '.join(blind)}",
                            hint="put the store and OUT on storage that every node mounts at the same path "
                                 "(NFS, a shared volume), or run without --address on one machine")

    def close(self) -> None:
        if self._owned and self._ray.is_initialized():
            self._ray.shutdown()
