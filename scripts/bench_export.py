"""Export throughput with 1 and 2 workers on one synthetic store, in one run (machines are noisy: read
the ratio, not the absolute times).

    python scripts/bench_export.py --episodes 300

Prints windows/s, MB/s of shard output, peak RSS of the whole process tree (sampled every 20 ms),
and the 2-worker / 1-worker throughput ratio. Each configuration runs `--repeats` times; the best
time is reported.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]

from robowds.export.cli.synth import write_synthetic_store


def run_export(store: Path, out: Path, workers: int, extra: list[str]) -> tuple[float, int]:
    """(seconds, peak RSS bytes of the export process and all its children)."""
    cmd = [sys.executable, "-m", "robowds.export", str(store), str(out), "--quiet", "--workers", str(workers), *extra]
    began = time.perf_counter()
    proc = psutil.Popen(cmd, cwd=ROOT)
    peak = 0
    while proc.poll() is None:
        try:
            tree = [proc, *proc.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.02)
    seconds = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"export failed with exit code {proc.returncode}")
    return seconds, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--set", dest="overrides", action="append", default=[
        "streams.joints.rate_hz=50", "streams.imu.rate_hz=100", "streams.imu.duration_s=0.5",
        "streams.imu.offset_s=-0.5", "splits.val=0.1"])
    args = parser.parse_args()
    extra = [x for kv in args.overrides for x in ("--set", kv)]
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        summary = write_synthetic_store(store, episodes=args.episodes, seed=0)
        source_mb = sum(p.stat().st_size for p in store.rglob("*") if p.is_file()) / 1e6
        print(f"store: {summary.episodes} episodes, {summary.total_seconds:.0f} s of data, {source_mb:.1f} MB")
        rows = {}
        for workers in (1, 2):
            best, peak = float("inf"), 0
            for _ in range(args.repeats):
                out = Path(tmp) / f"out{workers}"
                shutil.rmtree(out, ignore_errors=True)
                seconds, rss = run_export(store, out, workers, extra)
                best, peak = min(best, seconds), max(peak, rss)
            manifest = json.loads((out / "manifest.json").read_text())
            windows = sum(s["samples"] for s in manifest["splits"].values())
            mb = sum(s["bytes"] for s in manifest["splits"].values()) / 1e6
            rows[workers] = (windows / best, mb / best)
            print(f"workers={workers}: {windows} windows, {mb:.1f} MB in {best:.2f} s (incl. ~1 s process start) -> "
                  f"{windows / best:,.0f} windows/s, {mb / best:.1f} MB/s, peak RSS {peak / 2**20:.0f} MiB")
        print(f"ratio 2 workers / 1 worker: {rows[2][0] / rows[1][0]:.2f}x windows/s")


if __name__ == "__main__":
    main()
