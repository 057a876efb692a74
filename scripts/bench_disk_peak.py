"""The export's disk peak: the most bytes OUT (the export and its work folder) holds during an export,
as a multiple of the finished export's size, with staged windows released as their shards are written
(`export/job/staging_release.py`) against the same export that keeps them until the publish (the
baseline: `StagingRelease.shard_done` replaced by a no-op, i.e. the code before it), in the same run.

    python scripts/bench_disk_peak.py                   # 150 synthetic episodes, 2 workers; ~3 minutes
    python scripts/bench_disk_peak.py --episodes 1000

Disk use is the allocated size (st_blocks) of every file under OUT, sampled every 20 ms by a thread
while the export runs (a punched hole counts as freed, as `du` shows it). Also with `--overwrite` over
a finished export of another seed, where the old export stays until the publish replaces it.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import benchlib

from robowds.export.cli.main import main as cli
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.job import staging_release

SETTINGS = ["--set", "shard.max_samples=200", "--workers", "2", "--quiet"]


def allocated(root: Path) -> int:
    """Bytes allocated to the files under `root` (files may vanish while it walks)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def peak_during(run: Callable[[], Any], root: Path) -> int:
    """The most bytes allocated under `root` while `run()` runs, sampled every 20 ms."""
    peak, done = [allocated(root) if root.exists() else 0], threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            if root.exists():
                peak[0] = max(peak[0], allocated(root))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        run()
    finally:
        done.set()
        thread.join()
    return max(peak[0], allocated(root))


def export_peak(store: Path, out: Path, release: bool, overwrite: bool) -> tuple[int, int]:
    """(peak bytes under OUT, the finished export's bytes) of one export, staged windows released or not."""
    shutil.rmtree(out, ignore_errors=True)
    if overwrite:  # an export of another seed in OUT, replaced by this one
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli(["export", str(store), str(out), *SETTINGS, "--seed", "1"]) == 0
    original = staging_release.StagingRelease.shard_done
    if not release:
        staging_release.StagingRelease.shard_done = lambda self, entries, shard: None  # type: ignore[method-assign]
    try:
        args = ["export", str(store), str(out), *SETTINGS, *(["--overwrite"] if overwrite else [])]
        with contextlib.redirect_stdout(io.StringIO()):  # the export's summary line
            peak = peak_during(lambda: cli(args), out)
    finally:
        staging_release.StagingRelease.shard_done = original  # type: ignore[method-assign]
    return peak, allocated(out)


def main() -> None:
    parser = benchlib.parser(__doc__, repeats=1, quick={"episodes": 20})
    parser.add_argument("--episodes", type=int, default=150)
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_disk_peak", args)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
        store = write_synthetic_store(Path(tmp) / "store", episodes=args.episodes).root
        for overwrite in (False, True):
            name = "--overwrite" if overwrite else "new OUT"
            figures = {}
            for release in (True, False):
                peaks = [export_peak(store, Path(tmp) / "out", release, overwrite) for _ in range(args.repeats)]
                peak, final = max(peaks)
                figures[release] = peak / final
                print(f"{name:<12} release={release!s:<5}: peak {peak / 1e6:8.1f} MB, export {final / 1e6:8.1f} MB, "
                      f"{peak / final:.2f}x")
            report.add(f"{args.episodes} episodes, {name}: disk peak / export size", figures[True], "x",
                       baseline=figures[False], target="<= 1.3x" if not overwrite else "")
    report.finish()


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"# {time.perf_counter() - start:.0f} s")
