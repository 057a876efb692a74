"""A store whose tables are one large row group (what `pyarrow.parquet.write_table` makes by default,
up to 1M rows per group) against the same store in row groups of 64 episodes: export time and the
peak RSS of the export's whole process tree (main process and workers, summed, sampled every 20 ms).

Each export task reads the rows of its batch (8 episodes by default) through a forward cursor per
table (`export/store/row_stream.py`): one record batch at a time, each worker passing each table
once per job. Before that, a worker kept the whole decoded row group for its next task (46a6514),
and before that every task decoded it again. `--before REV` also runs git revision REV's code
(`git archive` of `export/` and `reader/` as the `robowds` package) on both stores, interleaved.

    python scripts/bench_row_groups.py [--episodes 400] [--workers 1] [--repeats 2] [--before REV]
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq

from robowds.export.cli.synth import write_synthetic_store

import benchlib

ROOT = Path(__file__).resolve().parents[1]


def stores(root: Path, episodes: int) -> dict[str, Path]:
    small = write_synthetic_store(root / "groups-of-64", episodes=episodes, seed=1).root  # row groups of 64
    large = root / "one-group"
    shutil.copytree(small, large)
    for path in large.glob("*.parquet"):
        pq.write_table(pq.read_table(path), path, row_group_size=1 << 20)
    return {"row groups of 64": small, "one row group": large}


def tree_rss(process: psutil.Process) -> int:
    """RSS of a process and all its descendants now."""
    total = 0
    try:
        family = [process, *process.children(recursive=True)]
    except psutil.Error:
        return 0
    for member in family:
        try:
            total += member.memory_info().rss
        except psutil.Error:
            pass
    return total


def export_run(store: Path, out: Path, env: dict[str, str], workers: int) -> tuple[float, int]:
    """(seconds, peak RSS bytes of the process tree) of one `python -m robowds.export`."""
    shutil.rmtree(out, ignore_errors=True)
    began = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "robowds.export", str(store), str(out), "--quiet", "--workers",
                             str(workers), "--set", "exclude=[overview]"], env=env, stdout=subprocess.DEVNULL)
    peak, watched = 0, psutil.Process(proc.pid)

    def sample() -> None:
        nonlocal peak
        while proc.poll() is None:
            peak = max(peak, tree_rss(watched))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    if proc.wait():
        raise SystemExit(f"export of {store} failed")
    sampler.join()
    return time.perf_counter() - began, peak


def archived(rev: str, folder: Path) -> dict[str, str]:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "export", "reader"], capture_output=True,
                             check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder / "robowds")
    (folder / "robowds" / "__init__.py").touch()
    return {**os.environ, "PYTHONPATH": str(folder)}


def main() -> None:
    parser = benchlib.parser(__doc__, repeats=2, quick={"episodes": 8, "repeats": 1})
    parser.add_argument("--episodes", type=int, default=400)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--before", help="also run this git revision's code")
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_row_groups", args)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        layouts = stores(root, args.episodes)
        codes = {"this code": dict(os.environ)}
        if args.before:
            codes[f"before ({args.before})"] = archived(args.before, root / "before")
        best: dict[tuple[str, str], float] = {}
        peak: dict[tuple[str, str], int] = {}
        for _ in range(args.repeats):
            for code, env in codes.items():
                for layout, store in layouts.items():
                    took, rss = export_run(store, root / "out", env, args.workers)
                    best[code, layout] = min(best.get((code, layout), float("inf")), took)
                    peak[code, layout] = max(peak.get((code, layout), 0), rss)
    print(f"{args.episodes} synthetic episodes, {args.workers} worker(s), best of {args.repeats}: seconds per export "
          "(job + start-up) and the highest peak RSS of the process tree")
    mib = 2**20
    for code in codes:
        small, large = best[code, "row groups of 64"], best[code, "one row group"]
        small_rss, large_rss = peak[code, "row groups of 64"], peak[code, "one row group"]
        print(f"  {code:22s}: row groups of 64 {small:6.2f} s {small_rss / mib:6.0f} MiB   one row group "
              f"{large:6.2f} s {large_rss / mib:6.0f} MiB   -> {large / small:.2f}x time, "
              f"{large_rss / small_rss:.2f}x memory")
        report.add(f"{code}: one row group (vs row groups of 64), time", large, "s", baseline=small)
        report.add(f"{code}: one row group (vs row groups of 64), peak RSS", large_rss / mib, "MiB",
                   baseline=small_rss / mib)
    if args.before:
        before = f"before ({args.before})"
        for layout in layouts:
            print(f"  {layout}: this code / before: {best['this code', layout] / best[before, layout]:.2f}x time, "
                  f"{peak['this code', layout] / peak[before, layout]:.2f}x memory")
            report.add(f"{layout}: this code (vs {before}), peak RSS", peak["this code", layout] / mib, "MiB",
                       baseline=peak[before, layout] / mib)
    report.finish()


if __name__ == "__main__":
    main()
