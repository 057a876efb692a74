"""Parallel scaling of the export: 1 and 2 workers on a synthetic store and on the real G1 video data,
in one run, with where the CPU time goes.

    .venv/bin/python scripts/bench_export.py --episodes 300 --repeats 3

Every export runs in a fresh `python` process (pool start-up and imports are part of what is
measured), 1 and 2 workers interleaved per repeat so that slow spells of a shared machine hit both;
the best wall time of each is reported, and their ratio (target >= 1.8x).

Wall-clock ratios mean little on a machine that other jobs load, CPU seconds do: each export also
reports its phase profile (`robowds.export.executors.profile`): the parent process's own CPU time per phase
(plan, map, loading the staged records, shard plan, reduce, pool close, manifest and publish), the
CPU time inside the tasks, and the pool workers' CPU time outside their tasks (start-up, imports,
argument unpickling). From the 1-worker run it derives two bounds on the 2-worker speedup:
Amdahl's (the parent's own seconds serial, the tasks' split perfectly) and the list-scheduling bound
(the same 1-worker task times dealt to 2 workers, the next task to the first free worker, phase by
phase: a phase of 1 task, or of a few unequal ones, cannot use the second worker). From both runs, a
CPU-time estimate of the ratio: the 1-worker run's CPU over the 2-worker run's parent CPU plus its
workers' CPU (start-up included) split evenly over 2 cores; and how much more CPU the same tasks took
with 2 workers than with 1 (shared caches, memory bandwidth, other load). Peak RSS is the whole
process tree's, sampled every 20 ms.

The synthetic store: `robowds synth` of `--episodes` episodes; the export uses the `--set` overrides
below. G1: `robowds convert lerobot` of the vendored tests/data/real/unitree_g1_lerobot_v2.1_real
(2 episodes, 736 AV1 640x480 frames) into a temp store, exported with the video config of
`scripts/bench_video_export.py` (jpg, centre crop to 224x224, 2-frame windows, stride 1).

`--before REV` runs every export with git revision REV's code too (`git archive` of its export/ and
reader/ as the `robowds` package), interleaved with ours, so a change is measured against its parent
in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

import benchlib

ROOT = Path(__file__).resolve().parents[1]
SYNTH_SETS = ["streams.joints.rate_hz=50", "streams.imu.rate_hz=100", "streams.imu.duration_s=0.5",
              "streams.imu.offset_s=-0.5", "splits.val=0.1"]
TARGET = 1.8


def child(store: str, out: str, workers: int, sets: list[str]) -> None:
    """`--child`: one export in this fresh process; prints its summary and phase profile as JSON."""
    import robowds.export
    from robowds.export.job.config import load_config
    from robowds.export.job.run import run_export

    if os.environ.get("BENCH_BEFORE"):  # --before: the archived revision's code, not this checkout's
        assert str(ROOT) not in robowds.export.__file__, robowds.export.__file__
    summary = run_export(Path(store), Path(out), load_config(None, sets), workers=workers, progress=False)
    print(json.dumps({"windows": summary.windows, "bytes": summary.bytes, "job_s": summary.seconds,
                      "profile": summary.profile}))


def export_once(store: Path, out: Path, workers: int, sets: list[str], code: Path | None = None) -> dict[str, Any]:
    """One export in a child process: its JSON line plus the process's wall time (start-up included).
    `code`: a folder holding another revision's `robowds` package, imported instead of this one."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, __file__, "--child", str(store), str(out), str(workers), json.dumps(sets)]
    env = {**os.environ, "PYTHONPATH": str(code), "BENCH_BEFORE": "1"} if code else None
    began = time.perf_counter()
    log = out.with_name(out.name + ".log")  # a file, not a pipe: a full pipe would stall the child
    with open(log, "w") as fh:
        proc = psutil.Popen(cmd, cwd=code or ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env)
        peak = 0
        while proc.poll() is None:  # peak RSS of the process tree, sampled every 20 ms
            try:
                peak = max(peak, sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]))
            except psutil.NoSuchProcess:
                pass
            time.sleep(0.02)
    wall = time.perf_counter() - began
    output = log.read_text()
    if proc.returncode != 0:
        raise SystemExit(f"export with {workers} worker(s) failed:\n{output[-3000:]}")
    line = next(x for x in reversed(output.splitlines()) if x.startswith("{"))  # warnings may follow it
    return {**json.loads(line), "process_s": wall, "peak_rss": peak}


def list_schedule(each: list[float], workers: int) -> float:
    """Makespan of `each` (task seconds, in submission order) dealt to `workers`, the next task to the
    first free worker: what a pool of that size needs at best for these tasks."""
    free = [0.0] * workers
    for seconds in each:
        free[free.index(min(free))] += seconds
    return max(free)


def bounds(profile: dict[str, Any], workers: int = 2) -> tuple[float, float, float]:
    """(serial share, Amdahl bound, list-scheduling bound) of a 1-worker profile for `workers`."""
    from robowds.export.executors.profile import amdahl_bound

    serial, tasks = profile["parent_cpu_s"], profile["task_cpu_s"]
    total = serial + tasks
    scheduled = serial + sum(list_schedule(p["task_cpu_each"], workers) for p in profile["phases"].values())
    return serial / total, amdahl_bound(serial, tasks, workers), total / scheduled


def breakdown(name: str, runs: dict[int, dict[str, Any]]) -> None:
    """Seconds per phase of the 1- and 2-worker runs: wall, the parent's own CPU, CPU in tasks (count)."""
    print("  per phase, s: wall | parent's own CPU | CPU in tasks (tasks); 1 worker ;; 2 workers")
    for phase in runs[1]["profile"]["phases"]:
        cells = []
        for workers in (1, 2):
            p = runs[workers]["profile"]["phases"].get(phase)
            cells.append(f"{p['wall_s']:6.2f} | {p['parent_cpu_s']:6.2f} | {p['task_cpu_s']:6.2f} ({p['tasks']:3d})"
                         if p else "-")
        print(f"    {phase:<11} {cells[0]} ;; {cells[1]}")
    for workers in (1, 2):
        prof = runs[workers]["profile"]
        total = prof["parent_cpu_s"] + prof["task_cpu_s"] + prof["worker_overhead_cpu_s"]
        print(f"  {workers} worker(s): parent {prof['parent_cpu_s']:.2f} s ({prof['parent_cpu_s'] / total:.0%}), "
              f"tasks {prof['task_cpu_s']:.2f} s, workers outside tasks {prof['worker_overhead_cpu_s']:.2f} s; "
              f"job wall {runs[workers]['job_s']:.2f} s")
    inflation = runs[2]["profile"]["task_cpu_s"] / runs[1]["profile"]["task_cpu_s"]
    print(f"  CPU in tasks, 2 workers / 1 worker: {inflation:.2f}x (the same tasks: > 1 when the two workers "
          "slow each other down, e.g. shared caches and memory bandwidth, or other load)")
    share, amdahl, scheduled = bounds(runs[1]["profile"])
    one, two = runs[1]["profile"], runs[2]["profile"]
    estimate = (one["parent_cpu_s"] + one["task_cpu_s"]) / (
        two["parent_cpu_s"] + (two["task_cpu_s"] + two["worker_overhead_cpu_s"]) / 2)
    print(f"  1-worker serial share {share:.1%} -> Amdahl bound for 2 workers {amdahl:.2f}x, "
          f"list-scheduling bound {scheduled:.2f}x; CPU-time estimate {estimate:.2f}x (the 2-worker run's parent "
          "serial, its workers' CPU, start-up included, split evenly over 2 cores)")


def measure(name: str, store: Path, tmp: Path, sets: list[str], repeats: int, before: tuple[str, Path] | None,
            report: benchlib.Report) -> None:
    """Best of `repeats` for 1 and 2 workers (and the same with revision `before`'s code), interleaved
    so that a slow spell of a shared machine hits every row."""
    codes = {"": None, **({f" at {before[0]}": before[1]} if before else {})}
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for _ in range(repeats):
        for label, code in codes.items():
            for workers in (1, 2):
                run = export_once(store, tmp / f"out-{workers}", workers, sets, code)
                if (label, workers) not in best or run["process_s"] < best[label, workers]["process_s"]:
                    best[label, workers] = run
    for label in codes:
        for workers in (1, 2):
            run = best[label, workers]
            print(f"{name}{label} workers={workers}: {run['windows']} windows, {run['bytes'] / 1e6:.1f} MB in "
                  f"{run['process_s']:.2f} s (job {run['job_s']:.2f} s) -> "
                  f"{run['windows'] / run['process_s']:,.0f} windows/s, peak RSS {run['peak_rss'] / 2**20:.0f} MiB")
        ratio = best[label, 1]["process_s"] / best[label, 2]["process_s"]
        job_ratio = best[label, 1]["job_s"] / best[label, 2]["job_s"]
        print(f"{name}{label} ratio 2 workers / 1 worker: {ratio:.2f}x (job only: {job_ratio:.2f}x; target "
              f"{TARGET}x: {'met' if ratio >= TARGET else 'missed'})")
        report.add(f"{name}{label}: 2 workers (vs 1 worker), process wall", best[label, 2]["process_s"], "s",
                   baseline=best[label, 1]["process_s"], ratio=ratio, target=f"ratio >= {TARGET}x")
        breakdown(name, {w: best[label, w] for w in (1, 2)})


def archived(rev: str, tmp: Path) -> Path:
    """`git archive` of revision `rev`'s export/ and reader/ as a `robowds` package under `tmp`."""
    src = tmp / f"rev-{rev}"
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "export", "reader"], capture_output=True,
                             check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(src / "robowds")
    (src / "robowds" / "__init__.py").touch()
    return src


def g1_store(tmp: Path) -> tuple[Path, list[str]]:
    """The G1 store (converted once) and the export overrides of bench_video_export.py's jpg row."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_video_export import G1, export_args

    from robowds.export.cli.main import main as robowds

    store = tmp / "g1"
    with contextlib.redirect_stdout(io.StringIO()):
        if robowds(["convert", "lerobot", str(G1), str(store), "--quiet"]) != 0:
            raise SystemExit(f"robowds convert lerobot {G1} failed")
    args = export_args(store, tmp / "unused", "jpg")
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    sets += [f"{flag[2:]}={args[i + 1]}" for i, flag in enumerate(args) if flag in ("--fps", "--stride")]
    return store, sets


def main() -> None:
    parser = benchlib.parser(__doc__, repeats=2, quick={"episodes": 8, "repeats": 1})
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--set", dest="overrides", action="append", default=None,
                        help=f"synthetic export overrides (default: {' '.join(SYNTH_SETS)})")
    parser.add_argument("--only", choices=("synthetic", "g1"), help="run one of the two exports")
    parser.add_argument("--before", metavar="REV", help="also run every export with git revision REV's code "
                        "(REV must have the phase profile: 9b72131 or later)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)  # STORE OUT WORKERS SETS-JSON
    args = benchlib.parse(parser)
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]), json.loads(args.child[3]))
        return
    from robowds.export.cli.synth import write_synthetic_store

    report = benchlib.Report("bench_export", args)  # prints the load at the start
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        before = (args.before, archived(args.before, tmp)) if args.before else None
        if args.only in (None, "synthetic"):
            store = tmp / "synth"
            summary = write_synthetic_store(store, episodes=args.episodes, seed=0)
            source_mb = sum(p.stat().st_size for p in store.rglob("*") if p.is_file()) / 1e6
            print(f"synthetic store: {summary.episodes} episodes, {summary.total_seconds:.0f} s of data, "
                  f"{source_mb:.1f} MB")
            measure("synthetic", store, tmp, args.overrides or SYNTH_SETS, args.repeats, before, report)
        if args.only in (None, "g1"):
            store, sets = g1_store(tmp)
            measure("G1 video (jpg)", store, tmp, sets, args.repeats, before, report)
    report.finish()  # prints the load at the end


if __name__ == "__main__":
    main()
