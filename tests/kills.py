"""Killing an export at a chosen phase of its job, read from its work folder (export/job/run.py,
export/output/publish.py): the tools of the SIGKILL tests (test_export_e2e.py, test_export_overwrite.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable


WORK = ".robowds-work"
PHASES = ("start", "map", "staged", "reduce", "manifest", "publish", "cleanup", "done")  # in the order a run passes them


def work_phase(out: Path, episodes: int, old_manifest: bytes | None = None) -> str:
    """The furthest phase an export into `out` has reached, read from what its work folder holds
    (export/job/run.py, export/output/publish.py): `map` = some episodes staged (`ep-N.rec`), not all; `staged` =
    all of them, no shard yet; `reduce` = shard records, temp shards or finished shards in `ready/`;
    `manifest` = the wids indexes / manifest written (or being written) into `ready/`, before the
    journal; `publish` = the journal `publish.json` (the commit point) exists, the manifest is not in
    OUT yet; `cleanup` = the manifest is in OUT, the work folder not yet removed; `done` = manifest in
    OUT, no work folder. With `old_manifest` (an --overwrite of an export whose manifest has these
    bytes) only a manifest with other bytes counts as this run's."""
    work = out / WORK
    for _ in range(5):  # a folder listed while the run creates or removes it: read again
        try:
            return _phase_once(out, work, episodes, old_manifest)
        except FileNotFoundError:
            continue
    return "start"


def _phase_once(out: Path, work: Path, episodes: int, old_manifest: bytes | None) -> str:
    if (out / "manifest.json").exists() and (old_manifest is None or (out / "manifest.json").read_bytes() != old_manifest):
        return "done" if not work.exists() else "cleanup"
    names = os.listdir(work)
    if "job.json" not in names:
        return "start"
    if "publish.json" in names:
        return "publish"
    ready = os.listdir(work / "ready")
    if any(".json" in n for n in ready):  # <split>.wids.json, manifest.json and their temp files
        return "manifest"
    if os.listdir(work / "shards") or os.listdir(work / "tmp") or any(os.listdir(work / "ready" / d) for d in ready):
        return "reduce"
    staged = sum(n.endswith(".rec") for n in names)
    return "staged" if staged == episodes else "map" if staged else "start"


def work_files(out: Path) -> set[str]:
    """Every file under `out` but the job file (each run rewrites it through a temp file at start).
    os.walk skips a folder removed while it walks."""
    return {os.path.relpath(os.path.join(folder, name), out) for folder, _, names in os.walk(out)
            for name in names if not name.startswith("job.json")}


def _start_until(cmd: list[str], env: dict[str, str], out: Path, episodes: int, target: str,
                 delay_s: float, old_manifest: bytes | None) -> tuple[subprocess.Popen[bytes], set[str]]:
    """Start the export (its own process group) and return once its work folder shows it entered
    `target` (plus `delay_s`), or once it ended; with the files OUT held before it started."""
    before = work_files(out)
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    while proc.poll() is None:
        if PHASES.index(work_phase(out, episodes, old_manifest)) >= PHASES.index(target) and work_files(out) - before:
            time.sleep(delay_s)
            break
        time.sleep(0.0005)
    return proc, before


def _stop(proc: subprocess.Popen[bytes]) -> bool:
    """SIGSTOP the export's process group and wait until its main process is stopped; False if it had
    ended first (then reaped here, its exit status kept on `proc`)."""
    try:
        os.killpg(proc.pid, signal.SIGSTOP)
    except ProcessLookupError:  # ended and reaped already
        return False
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    if os.WIFSTOPPED(status):
        return True
    proc.returncode = os.waitstatus_to_exitcode(status)
    return False


def run_and_kill_in(cmd: list[str], env: dict[str, str], out: Path, episodes: int, target: str,
                    delay_s: float, old_manifest: bytes | None = None) -> str:
    """Start the export, SIGKILL its process group `delay_s` after its work folder shows it entered
    `target`, and return the phase the kill landed in: the folder's phase once the group is dead, if
    this run added a file (a run resumed from a phase starts there: without new files it did nothing),
    else "none". Deterministic: the folder is read after the kill, when nothing changes it any more."""
    proc, before = _start_until(cmd, env, out, episodes, target, delay_s, old_manifest)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the run finished before the kill: its folder says "done"
        pass
    proc.wait()
    return work_phase(out, episodes, old_manifest) if work_files(out) - before else "none"


def run_paused_in(cmd: list[str], env: dict[str, str], out: Path, episodes: int, target: str,
                  while_stopped: Callable[[int], None], old_manifest: bytes | None = None) -> tuple[str, int]:
    """Start the export, stop it (SIGSTOP) once its work folder shows `target`, call `while_stopped`
    with its pid, let it go on (SIGCONT) and wait for it: (the phase it was stopped in, or "none" if it
    ended first; its exit status)."""
    proc, _ = _start_until(cmd, env, out, episodes, target, 0.0, old_manifest)
    phase = "none"
    if proc.poll() is None and _stop(proc):
        phase = work_phase(out, episodes, old_manifest)
        try:
            while_stopped(proc.pid)
        finally:
            os.killpg(proc.pid, signal.SIGCONT)
    return phase, proc.wait()


def phase_durations(cmd: list[str], env: dict[str, str], out: Path, episodes: int) -> dict[str, float]:
    """Run the export to the end, returning how long its work folder showed each phase (seconds)."""
    seen: dict[str, float] = {}
    proc = subprocess.Popen(cmd, env=env)
    last, since = "start", time.perf_counter()
    while proc.poll() is None:
        phase, now = work_phase(out, episodes), time.perf_counter()
        if phase != last:
            seen[last], last, since = now - since, phase, now
        time.sleep(0.0005)
    assert proc.returncode == 0
    return seen
