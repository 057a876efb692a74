"""`robowds report` on a large export: seconds and page bytes (issue 27: 20k episodes / 600k windows
in under a minute on 2 cores, the page under 10 MB).

    python scripts/bench_report.py                      # 20,000 episodes x 30 windows; builds the export once
    python scripts/bench_report.py --episodes 2000      # smaller, e.g. to see how it scales

The export is as cheap as an export of that many episodes can be, since the report's cost grows with
episodes and windows, not with sample bytes: one 1-D stream of 30 samples at 10 Hz per episode (30
windows each), no camera. It is cached under `--cache` (default: TMPDIR/robowds-bench-report/<episodes>)
and reused while its manifest is there. The report runs as a `robowds report` process (start-up
included, as a user waits for it), best of `--repeats`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import benchlib
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

SAMPLES = 30  # per episode, at 10 Hz: 30 windows each at the export's fps 10


def write_store(root: Path, episodes: int) -> None:
    """A store of `episodes` episodes of one stream `x` ([t, v] rows), written as one table."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    t = np.arange(SAMPLES) / 10.0  # [S]
    values = rng.normal(size=(episodes, SAMPLES))  # [E, S]
    rows = np.stack([np.broadcast_to(t, values.shape), values], axis=-1).reshape(-1)  # [E*S*2]
    inner = pa.ListArray.from_arrays(pa.array(np.arange(episodes * SAMPLES + 1, dtype=np.int32) * 2),
                                     pa.array(rows, pa.float64()))
    series = pa.ListArray.from_arrays(pa.array(np.arange(episodes + 1, dtype=np.int32) * SAMPLES), inner)
    ids = pa.array([f"ep_{i:06d}" for i in range(episodes)], pa.string())
    pq.write_table(pa.table({"episode_id": ids, "x": series}), root / "trajectories.parquet", row_group_size=4096)
    (root / "store.yaml").write_text(yaml.safe_dump({"version": 1, "clock": "x", "fields": {"x": {"names": ["v"]}}}))


def robowds(*args: str) -> subprocess.CompletedProcess[str]:
    """One `robowds` command in a new process (its start-up counted, as a user's is)."""
    command = "import sys; from robowds.export.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", command, *args], check=True, capture_output=True, text=True)


def main() -> None:
    parser = benchlib.parser(__doc__, repeats=2, quick={"episodes": 500, "repeats": 1})
    parser.add_argument("--episodes", type=int, default=20000)
    parser.add_argument("--cache", type=Path, help="folder holding the store and export (reused)")
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_report", args)
    base = args.cache or Path(os.environ.get("TMPDIR", "/tmp")) / "robowds-bench-report" / str(args.episodes)
    store, out = base / "store", base / "out"
    if not (out / "manifest.json").is_file():
        if not (store / "store.yaml").is_file():
            write_store(store, args.episodes)
        start = time.perf_counter()
        robowds("export", str(store), str(out), "--quiet", "--workers", "2", "--fps", "10")
        print(f"export of {args.episodes:,} episodes: {time.perf_counter() - start:.1f} s (cached in {base})")
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        printed = robowds("report", str(out)).stdout.strip()
        seconds.append(time.perf_counter() - start)
    size = (out / "report.html").stat().st_size
    windows = sum(s["samples"] for s in json.loads((out / "manifest.json").read_text())["splits"].values())
    print(printed)
    print(f"report of {args.episodes:,} episodes, {windows:,} windows: best {min(seconds):.2f} s "
          f"(runs {', '.join(f'{s:.2f}' for s in seconds)}), page {size / 1e6:.2f} MB")
    report.add(f"report, {args.episodes:,} episodes / {windows:,} windows", min(seconds), "s", target="< 60 s")
    report.add("page bytes", size / 1e6, "MB", target="< 10 MB")
    report.finish()


if __name__ == "__main__":
    main()
