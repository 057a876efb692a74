"""Cold-cache read throughput of large (~500 KB) samples: raw sequential shard reads vs ShardDataset,
with the page cache dropped before every measurement (needs root: writes /proc/sys/vm/drop_caches).

    python scripts/bench_cold_read.py

Warm-cache numbers (scripts/bench_read.py) compare against a memcpy from the page cache; this one
compares against the disk. Prints MB/s and the ours/raw ratio for the shuffled plan (block 4096) and
for shard-sequential reading (block 1): best and median of `--repeats` runs, the rows interleaved.
The "disk, ... ranges" rows read the same byte ranges in the same order with no reader (all hinted
at once, then pread): what the disk gives for that access pattern.
The default ~900 MB keeps each run near half a second: with the earlier 113 MB, reader start-up
and the first read's latency were a large part of a ~60 ms run.
"""

from __future__ import annotations

import glob
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from robowds.export.cli.main import main as robowds
from robowds.export.cli.synth import write_synthetic_store
from robowds.reader import ShardDataset
from robowds.reader.source import ShardSource

import benchlib


def drop_caches() -> None:
    subprocess.run("sync; echo 3 > /proc/sys/vm/drop_caches", shell=True, check=True,
                   stderr=subprocess.DEVNULL)


def raw(out: Path) -> int:
    total = 0
    for name in sorted(glob.glob(str(out / "train" / "*.tar"))):
        with open(name, "rb", buffering=0) as fh:
            while chunk := fh.read(1 << 20):
                total += len(chunk)
    return total


def plan_order_limit(out: Path, block: int) -> int:
    """The disk's rate for the plan's byte ranges in the plan's order, with no reader at all: every
    range is hinted at once (`posix_fadvise(WILLNEED)`, unlimited queue depth), then read with pread.
    A shuffled plan reads 512 KB ranges in random order, which a disk serves slower than one stream."""
    dataset = ShardDataset(out, "train", seed=0, block=block)
    ranges = []
    source = ShardSource(dataset.base)  # reads each shard's offset index once
    reads = dataset.reads()
    for sample_id in dataset.sequence().tolist():
        shard, start, stop = reads.locate(sample_id, source)
        ranges.append((str(out / shard.path), start, stop))
    fds = {path: os.open(path, os.O_RDONLY) for path, _, _ in ranges}
    try:
        for path, start, stop in ranges:
            os.posix_fadvise(fds[path], start, stop - start, os.POSIX_FADV_WILLNEED)
        return sum(len(os.pread(fds[path], stop - start, start)) for path, start, stop in ranges)
    finally:
        for fd in fds.values():
            os.close(fd)


def ours(out: Path, block: int) -> int:
    total = 0
    for sample in ShardDataset(out, "train", seed=0, block=block):
        for value in sample.values():
            if getattr(value, "nbytes", 0) >= 4096:  # touch every page: the arrays are views of the files
                total += int(value.reshape(-1).view("u1")[::4096].sum() >= 0) * value.nbytes
    return total


def main() -> None:
    parser = benchlib.parser(__doc__, repeats=5, quick={"episodes": 4, "repeats": 1})
    parser.add_argument("--episodes", type=int, default=320, help="~2.8 MB of samples per episode")
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_cold_read", args)
    try:
        drop_caches()
    except subprocess.CalledProcessError:
        raise SystemExit("cannot drop the page cache here (needs root); nothing measured")
    with tempfile.TemporaryDirectory() as tmp:
        store, out = Path(tmp) / "store", Path(tmp) / "out"
        write_synthetic_store(store, episodes=args.episodes, seed=0)
        robowds(["export", str(store), str(out), "--quiet", "--set", "exclude=[overview]", "--set",
                 "streams.imu.rate_hz=200", "--set", "streams.imu.duration_s=100", "--set", "stride=16",
                 "--set", "shard.max_samples=64"])
        size = sum(p.stat().st_size for p in (out / "train").glob("*.tar"))
        rows = {"raw sequential read (1 MiB chunks)": lambda: raw(out),
                "disk, shuffled plan's ranges": lambda: plan_order_limit(out, 4096),
                "ours, shuffled plan (block 4096)": lambda: ours(out, 4096),
                "disk, shard-sequential ranges": lambda: plan_order_limit(out, 1),
                "ours, shard-sequential (block 1)": lambda: ours(out, 1)}
        times: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.repeats):  # rows interleaved, so a slow spell of the machine hits all of them
            for name, fn in rows.items():
                drop_caches()
                began = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - began)
        print(f"{size / 1e6:.0f} MB of ~500 KB samples, page cache dropped before each run, "
              f"{args.repeats} interleaved runs per row")
        print(f"  {'':<36} {'best MB/s':>9} {'vs raw':>7} {'median MB/s':>12} {'vs raw':>7}")
        base = {stat: size / stat(times["raw sequential read (1 MiB chunks)"]) for stat in (min, statistics.median)}
        for name, runs in times.items():
            best, median = size / min(runs), size / statistics.median(runs)
            print(f"  {name:<36} {best / 1e6:9.0f} {best / base[min]:7.0%} {median / 1e6:12.0f} "
                  f"{median / base[statistics.median]:7.0%}")
            if not name.startswith("raw"):
                report.add(f"cold read, {name} (vs raw sequential)", best / 1e6, "MB/s", baseline=base[min] / 1e6)
    report.finish()

if __name__ == "__main__":
    main()
