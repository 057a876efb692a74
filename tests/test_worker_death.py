"""Killing only the export's main process ends its whole process tree (issue 10, item 9).

A real export with 2 workers runs as its own process; once workers are staging episodes, the main
process alone gets SIGKILL (not its process group: that is what a crashed or OOM-killed parent
looks like). Before the fix the forkserver, the resource tracker and both workers kept running, the
workers still writing staging files; now all of them are gone within 5 s, and a re-run finishes
byte-identical to an export that was never interrupted.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from robowds.export.cli.synth import write_synthetic_store

ENV = dict(os.environ)


def export_cmd(store: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "robowds.export", str(store), str(out), "--quiet", "--workers", "2"]


def tree_bytes(out: Path) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file()}


def alive(procs: list[psutil.Process]) -> list[str]:
    """The processes of `procs` still running (zombies, which run nothing and write nothing, are not)."""
    running = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                running.append(f"{proc.pid} {' '.join(proc.cmdline())[:100]}")
        except psutil.NoSuchProcess:
            pass
    return running


@pytest.mark.slow
def test_sigkill_of_the_main_process_ends_every_worker(tmp_path: Path) -> None:
    store = write_synthetic_store(tmp_path / "store", episodes=40, seed=5).root
    out, work = tmp_path / "out", tmp_path / "out" / ".robowds-work"
    proc = subprocess.Popen(export_cmd(store, out), env=ENV)
    try:
        deadline = time.monotonic() + 120
        while not list(work.glob("ep-*.rec")):  # the map has started: workers are staging episodes
            assert proc.poll() is None, "the export ended before it could be killed"
            assert time.monotonic() < deadline, "no episode was staged in 120 s"
            time.sleep(0.02)
        tree = psutil.Process(proc.pid).children(recursive=True)  # forkserver, tracker, 2 workers
        staged = len(list(work.glob("ep-*.rec")))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(tree) >= 3, [p.cmdline() for p in tree]
    assert staged < 40 and not (out / "manifest.json").exists(), "killed too late to test anything"
    deadline = time.monotonic() + 5.0
    while alive(tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive(tree) == [], "still running 5 s after the main process was killed"
    subprocess.run(export_cmd(store, out), check=True, env=ENV)
    subprocess.run(export_cmd(store, tmp_path / "ref"), check=True, env=ENV)
    assert tree_bytes(out) == tree_bytes(tmp_path / "ref")


def _die(_: int) -> None:
    os._exit(1)  # what the OOM killer leaves: the worker gone mid-task, no exception


def test_a_pool_worker_that_dies_mid_task_is_one_message_with_its_fix() -> None:
    """A worker that dies mid-task (OOM killer, SIGKILL, a crash in C code) ends the map with one
    UserError and its fix, which the CLI prints without a traceback; before, the pool's
    BrokenProcessPool escaped as a raw traceback."""
    from robowds.export.errors import UserError
    from robowds.export.executors.executor import ProcessExecutor

    executor = ProcessExecutor(2)
    try:
        with pytest.raises(UserError) as caught:
            list(executor.map_unordered(_die, range(2)))
    finally:
        executor.close()
    assert caught.value.message.startswith("a worker process of the pool died while running a task")
    assert caught.value.hint.startswith("re-run the same command: it resumes from the steps already finished")


def _die_on_zero(i: int) -> int:
    if i == 0:
        os._exit(1)
    return i


def test_a_task_submitted_after_a_worker_died_is_the_same_message() -> None:
    """The pool breaks between two submissions (the task list is a slow generator, as the export's
    batches are): the next `submit` raises BrokenProcessPool itself, not through a future. That is
    the same UserError, not a traceback; and close() returns with every worker gone."""
    from robowds.export.errors import UserError
    from robowds.export.executors.executor import ProcessExecutor

    executor = ProcessExecutor(2)

    def items() -> Iterator[int]:
        yield 0
        deadline = time.monotonic() + 60
        while not executor._pool._broken:  # CPython's own flag: its manager thread saw the death
            assert time.monotonic() < deadline, "the pool never noticed its dead worker"
            time.sleep(0.01)
        yield 1

    try:
        with pytest.raises(UserError) as caught:
            list(executor.map_unordered(_die_on_zero, items()))
    finally:
        executor.close()
    assert caught.value.message.startswith("a worker process of the pool died while running a task")
    assert not alive(forkserver_children()), "a worker outlived close()"


def forkserver_children() -> list[psutil.Process]:
    """This process's pool workers: children of its forkserver."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            parent = proc.parent()
            if parent is not None and parent.pid != os.getpid() and "forkserver" in " ".join(parent.cmdline()):
                found.append(proc)
        except psutil.NoSuchProcess:
            pass
    return found


def _worker_threads(_: int) -> tuple[str | None, int]:
    import numpy  # noqa: F401 (loads OpenBLAS, which starts its threads here)

    threads = next(line for line in open("/proc/self/status") if line.startswith("Threads:"))
    return os.environ.get("OPENBLAS_NUM_THREADS"), int(threads.split()[1])


def test_pool_workers_run_one_blas_thread_each() -> None:
    """numpy's OpenBLAS would start a spinning thread per core in every worker (1.45 s of CPU each on a
    16-core host); the pool's initializer limits it before numpy loads: a worker of our pool runs
    fewer threads than one of a plain forkserver pool, although it also runs the watch on the main
    process."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from robowds.export.executors.executor import ProcessExecutor

    if (os.cpu_count() or 1) < 2 or "OPENBLAS_NUM_THREADS" in os.environ:
        pytest.skip("OpenBLAS starts no extra thread here")
    executor = ProcessExecutor(2)
    try:
        ours = list(executor.map_unordered(_worker_threads, range(2)))
    finally:
        executor.close()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("forkserver")) as pool:
        plain = pool.submit(_worker_threads, 0).result()
    assert plain[0] is None and {env for env, _ in ours} == {"1"}
    watch = 1
    assert {threads for _, threads in ours} == {plain[1] - (os.cpu_count() - 1) + watch}, (ours, plain)
