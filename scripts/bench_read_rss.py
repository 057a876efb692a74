"""Peak memory while reading a large export of raw (zero-copy) samples with workers 0.

    python scripts/bench_read_rss.py                 # ~1.3 GB export, ~2 minutes on 2 cores
    python scripts/bench_read_rss.py --quick         # checks the script runs

What it does:

1. Writes a synthetic store (`write_synthetic_store`, `--episodes`) and exports it in-process like
   bench_read's large export: image excluded, a 100 s IMU window at 200 Hz per sample (~500 KB stored
   as is, so samples are read as zero-copy views of the mapped shard, as raw camera frames are),
   anchors every frame, 64 samples a shard.
2. Reads the export in a fresh child process (so that its peak is the read's alone), once per row:
   - samples: `ShardDataset(out, "train", seed=0)` iterated, one byte of every 4 KiB page of every
     array touched (what a consumer of the views reads);
   - batches: `ShardLoader(ShardDataset(...), batch_size=32, num_workers=0)`, every batch iterated.
   Each row samples /proc/self/status (VmRSS, RssFile) after every item and reports the peak VmRSS
   (VmHWM), the peak growth of RssFile over its value after the first item, and the pass's
   throughput (MB/s of sample bytes).
Targets (issue 26): peak VmRSS below 50% of the export and below 800 MB. Run it against another
checkout (`PYTHONPATH=... python scripts/bench_read_rss.py`) to compare, e.g. before reader/release.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib
import numpy as np

MB = 1e6


def status() -> dict[str, int]:
    """VmRSS, VmHWM and RssFile of this process in bytes."""
    found = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM", "RssFile"):
                found[name] = int(value.split()[0]) * 1024
    return found


def touch(sample: dict[str, Any]) -> int:
    """One byte per 4 KiB page of every array of at least 4 KiB (zero-copy views are read lazily)."""
    return sum(int(v.reshape(-1).view(np.uint8)[::4096].sum()) for v in sample.values()
               if isinstance(v, np.ndarray) and v.nbytes >= 4096)


def read_row(out: str, row: str) -> dict[str, float]:
    """One pass over the export in this process: peak VmRSS, RssFile growth, seconds, items."""
    from robowds.reader import ShardDataset, ShardLoader

    if row == "samples":
        items = (touch(s) for s in ShardDataset(out, "train", seed=0))
    else:
        items = iter(ShardLoader(ShardDataset(out, "train", seed=0), batch_size=32, num_workers=0))
    began = time.perf_counter()
    next(items)
    base = status()["RssFile"]
    peak_rss, peak_file, count = 0, 0, 1
    for _ in items:
        now = status()
        peak_rss, peak_file = max(peak_rss, now["VmRSS"]), max(peak_file, now["RssFile"] - base)
        count += 1
    return {"seconds": time.perf_counter() - began, "items": count, "peak_rss": max(peak_rss, status()["VmHWM"]),
            "peak_file_growth": peak_file}


def export_zero_copy(folder: Path, episodes: int) -> Path:
    """A synthetic store of `episodes` exported under `folder` (its `out`) with ~500 KB samples stored
    as is (a 100 s IMU window at 200 Hz, read as zero-copy views, as raw camera frames are), anchors
    every frame, 64 samples a shard: ~45 MB per episode. Also used by soak_reader.py."""
    from robowds.export.cli.main import main as robowds_main
    from robowds.export.cli.synth import write_synthetic_store

    store, out = folder / "store", folder / "out"
    write_synthetic_store(store, episodes=episodes, seed=0)
    with contextlib.redirect_stdout(io.StringIO()):
        code = robowds_main(["export", str(store), str(out), "--quiet", "--workers", "2",
                             "--set", "exclude=[overview]", "--set", "streams.imu.rate_hz=200",
                             "--set", "streams.imu.duration_s=100", "--set", "stride=1",
                             "--set", "shard.max_samples=64"])
    if code != 0:
        raise SystemExit(f"export failed with exit code {code}")
    return out


def main() -> None:
    described = benchlib.parser(__doc__, repeats=1, quick={"episodes": 3})
    described.add_argument("--episodes", type=int, default=28, help="synthetic episodes (28: ~1.3 GB)")
    described.add_argument("--read", nargs=2, metavar=("OUT", "ROW"), help=argparse_hidden())
    args = benchlib.parse(described)
    if args.read:
        print(json.dumps(read_row(*args.read)))
        return
    report = benchlib.Report("bench_read_rss", args)
    with tempfile.TemporaryDirectory(prefix="bench_read_rss_") as tmp:
        out = export_zero_copy(Path(tmp), args.episodes)
        shards = json.loads((out / "manifest.json").read_text())["splits"]["train"]["shards"]
        size = sum(s["bytes"] for s in shards)
        print(f"export: {sum(s['samples'] for s in shards)} samples in {len(shards)} shards, {size / MB:.0f} MB")
        for row in ("samples", "batches"):
            best: dict[str, float] | None = None
            for _ in range(args.repeats):
                done = subprocess.run([sys.executable, __file__, "--read", str(out), row], check=True,
                                      capture_output=True, text=True)
                got = json.loads(done.stdout.strip().splitlines()[-1])
                best = got if best is None or got["seconds"] < best["seconds"] else best
            assert best is not None
            target = f"< 50% of export ({size / 2 / MB:.0f} MB) and < 800 MB"
            report.add(f"read {row} (workers 0): peak VmRSS", best["peak_rss"] / MB, "MB", baseline=size / MB,
                       target=target)
            report.add(f"read {row} (workers 0): peak RssFile growth", best["peak_file_growth"] / MB, "MB",
                       baseline=size / MB)
            report.add(f"read {row} (workers 0): throughput", size / best["seconds"] / MB, "MB/s")
    report.finish()


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS  # the child process's mode: read OUT as ROW and print the figures as JSON


if __name__ == "__main__":
    main()
