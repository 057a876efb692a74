"""Read throughput of the robowds reader against plain webdataset and raw file reads, on the same shards.

    python scripts/bench_read.py                 # ~1-2 minutes on 2 cores
    python scripts/bench_read.py --profile       # + cProfile of our small-sample path

What it does, in one run:

1. Writes one synthetic store (`robowds.export.cli.synth.write_synthetic_store`) and exports it twice with
   `robowds.export.cli.main.main(["export", ...])`:
   - small (~4 KB/sample): the image and every stream but `joints` are excluded, windows stay at the
     default 1 s at fps=10, so a sample is 4 members (joints.npy, joints_mask.npy, task.txt,
     meta.json), each one 512 B tar header + one 512 B data block. (Excluding only the image still
     leaves 12 members, i.e. >= 12 KB of headers and padding: 4 KB needs fewer members.)
   - large (~500 KB/sample): image excluded, a 100 s IMU window at 200 Hz (20000 x 6 float32 + a
     20000-step mask) per sample, anchors every `--large-stride` frames to bound the export.
   The actual bytes/sample (manifest shard bytes / samples) is printed for both.
2. Reads every shard once to warm the page cache, then measures on the same shards:
   - raw:     sequential `readinto` of every shard file in 1 MiB chunks (the disk/page-cache limit);
   - wds:     `webdataset.WebDataset(urls, shardshuffle=<#shards>, seed=0).shuffle(1000, seed=0)
              .decode()` (default handlers: .npy via np.load, .txt -> str, .json -> dict), iterated
              in this process; then `.batched(32, collation_fn=reader.collate)` in this process and
              under a `DataLoader(batch_size=None, num_workers=2)`;
   - ours:    `ShardDataset(out, "train", seed=0)` iterated directly (samples), and
              `ShardLoader(ShardDataset(...), batch_size=32, num_workers=0 / 2)` (batches).
   Both batched paths use the same collate (reader.collate), so they build identical batches.
   Sample-level loops touch one byte per 4 KiB page of every array of >= 4 KiB: our arrays are
   zero-copy views of the memory-mapped shard, and without this the large-sample row would not read
   the data at all. Batches need no touch: collate copies every array.
3. Time to first batch after a resume at 0% (fresh), 1%, 50% and 99% of an epoch: a ShardLoader is
   built (not timed), `load_state_dict` gets a cursor from a fresh loader with `consumed` set to that
   position (capped at epoch length - 32, so the first batch is a full one), and the time from
   `load_state_dict` to the first batch is reported (num_workers 0 and 2; with 2 it includes starting
   the worker processes). It must not grow with the position.

How to read it: each measurement runs whole passes (a fresh iterator per pass, as an epoch would) until
at least `--min-s` seconds have passed, stopping mid-pass at `--max-s`; the best of `--repeats` runs
is kept. samples/s counts samples delivered (samples in batches for the batched rows); MB/s is
payload = samples x manifest bytes/sample. `vs wds` = ours / the matching webdataset row (target: >= 2x
on small samples); `vs raw` = MB/s / raw MB/s (target: >= 85% on large samples). With a warm page
cache, "raw" is a memcpy from the page cache into one cache-resident, page-aligned 1 MiB buffer:
an upper bound no per-sample reader reaches; against a cold disk or network the bound is far lower.
The machine is noisy: repeat the run before trusting a difference under ~15%.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import mmap
import pstats
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import webdataset as wds  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from robowds.export.cli.main import main as robowds_main  # noqa: E402
from robowds.export.cli.synth import write_synthetic_store  # noqa: E402
from robowds.reader import ShardDataset, ShardLoader  # noqa: E402
from robowds.reader.collation import collate  # noqa: E402

PAGE = 4096
CHUNK = 1 << 20
BATCH = 32
SHUFFLE_BUFFER = 1000
ALL_BUT_JOINTS = "exclude=[overview,imu,orientation,gripper_cmd,actions]"


@dataclass(frozen=True)
class Export:
    """One exported split and what the manifest says about its size."""

    name: str
    out: Path
    urls: list[str]  # absolute shard paths, manifest order
    samples: int
    bytes: int  # sum of shard bytes in the manifest

    @property
    def per_sample(self) -> float:
        return self.bytes / self.samples


@dataclass
class Row:
    label: str
    samples: int
    seconds: float
    sample_bytes: float

    @property
    def rate(self) -> float:
        return self.samples / self.seconds

    @property
    def mbps(self) -> float:
        return self.rate * self.sample_bytes / 1e6


def export(store: Path, out: Path, name: str, sets: list[str]) -> Export:
    """Run the `robowds export` command in-process (2 workers) and read back the manifest."""
    argv = ["export", str(store), str(out), "--quiet", "--workers", "2"]
    argv += [x for kv in sets for x in ("--set", kv)]
    with contextlib.redirect_stdout(io.StringIO()):
        code = robowds_main(argv)
    if code != 0:
        raise SystemExit(f"export {name} failed with exit code {code}")
    split = json.loads((out / "manifest.json").read_text())["splits"]["train"]
    shards = split["shards"]
    return Export(name, out, [str(out / s["path"]) for s in shards],
                  sum(s["samples"] for s in shards), sum(s["bytes"] for s in shards))


def touch(sample: dict[str, Any]) -> int:
    """Read one byte per page of every array >= 4 KiB (mmap-backed views fault their pages in)."""
    total = 0
    for value in sample.values():
        if isinstance(value, np.ndarray) and value.nbytes >= PAGE:
            total += int(value.reshape(-1).view(np.uint8)[::PAGE].sum())
    return total


def count_sample(sample: dict[str, Any]) -> int:
    """1, after touching the sample's pages."""
    touch(sample)
    return 1


def count_batch(batch: dict[str, Any]) -> int:
    return len(batch["__key__"])


def measure(make: Callable[[], Iterable[Any]], count: Callable[[Any], int], min_s: float, max_s: float,
            repeats: int) -> tuple[int, float]:
    """(samples, seconds) of the best of `repeats`: whole passes over `make()` until `min_s` have
    passed, stopping inside a pass at `max_s`. Best = highest samples/s."""
    best: tuple[int, float] | None = None
    for _ in range(repeats):
        n = 0
        began = time.perf_counter()
        elapsed = 0.0
        while elapsed < min_s:
            iterator = iter(make())
            for item in iterator:
                n += count(item)
                if time.perf_counter() - began >= max_s:
                    break
            elapsed = time.perf_counter() - began
            del iterator  # DataLoader workers shut down here (timed, like an epoch's end, except after the last pass)
            if elapsed >= max_s:
                break
        if best is None or n / elapsed > best[0] / best[1]:
            best = (n, elapsed)
    assert best is not None
    return best


def raw_pass(urls: list[str]) -> Iterator[int]:
    """Bytes of each 1 MiB chunk of every shard, read sequentially into one page-aligned buffer.

    Page-aligned because the copy from the page cache is alignment-sensitive: on the AMD EPYC
    development VM a `bytearray` (16 bytes past a page boundary) read at 7-8 GB/s where an aligned
    buffer read at 18 GB/s, so an unaligned buffer would make the baseline weaker than it is."""
    buffer = mmap.mmap(-1, CHUNK)  # anonymous mappings start on a page boundary
    for url in urls:
        with open(url, "rb", buffering=0) as fh:
            while True:
                got = fh.readinto(buffer)
                if not got:
                    break
                yield got


def wds_samples(ex: Export) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return (wds.WebDataset(ex.urls, shardshuffle=len(ex.urls), seed=0)
                .shuffle(SHUFFLE_BUFFER, seed=0).decode())


def wds_batches(ex: Export) -> Any:
    return wds_samples(ex).batched(BATCH, collation_fn=collate)


def ours_samples(ex: Export) -> ShardDataset:
    return ShardDataset(ex.out, "train", seed=0)


def bench_size(ex: Export, args: argparse.Namespace) -> list[tuple[Row, Row | None]]:
    """The table rows for one export: (row, the webdataset row it is compared with)."""
    def row(label: str, make: Callable[[], Iterable[Any]], count: Callable[[Any], int]) -> Row:
        n, seconds = measure(make, count, args.min_s, args.max_s, args.repeats)
        return Row(label, n, seconds, ex.per_sample)

    raw = row("raw read (1 MiB chunks)", lambda: raw_pass(ex.urls), lambda got: got)
    raw.samples = int(raw.samples / ex.per_sample)  # bytes -> sample equivalents
    rows: list[tuple[Row, Row | None]] = [(raw, None)]

    wds_s = row("wds samples, main process", lambda: wds_samples(ex), count_sample)
    ours_s = row("ours ShardDataset samples", lambda: ours_samples(ex), count_sample)
    wds_b0 = row("wds batched(32), main process", lambda: wds_batches(ex), count_batch)
    ours_b0 = row("ours ShardLoader(32), workers=0",
                  lambda: ShardLoader(ours_samples(ex), batch_size=BATCH, num_workers=0), count_batch)
    wds_b2 = row("wds batched(32), DataLoader workers=2",
                 lambda: DataLoader(wds_batches(ex), batch_size=None, num_workers=2), count_batch)
    ours_b2 = row("ours ShardLoader(32), workers=2",
                  lambda: ShardLoader(ours_samples(ex), batch_size=BATCH, num_workers=2), count_batch)
    rows += [(wds_s, None), (ours_s, wds_s), (wds_b0, None), (ours_b0, wds_b0), (wds_b2, None), (ours_b2, wds_b2)]
    return rows


def print_table(rows: list[tuple[Row, Row | None]]) -> None:
    raw = rows[0][0]
    print(f"{'':40s} {'samples/s':>10s} {'MB/s':>9s} {'vs wds':>7s} {'vs raw':>7s} {'samples':>8s} {'s':>5s}")
    for r, ref in rows:
        vs_wds = f"{r.rate / ref.rate:6.2f}x" if ref is not None else ""
        vs_raw = f"{100 * r.mbps / raw.mbps:6.1f}%" if r is not raw else ""
        print(f"{r.label:40s} {r.rate:10,.0f} {r.mbps:9,.1f} {vs_wds:>7s} {vs_raw:>7s} {r.samples:8d} {r.seconds:5.2f}")


def first_batch_after_resume(ex: Export, workers: int, fraction: float | None, repeats: int) -> tuple[int, float]:
    """(consumed, best seconds from load_state_dict to the first batch); fraction None = fresh start."""
    best = float("inf")
    consumed = 0
    for _ in range(repeats):
        loader = ShardLoader(ours_samples(ex), batch_size=BATCH, num_workers=workers)
        state = loader.state_dict()
        length = loader.dataset.epoch_length()
        # at most length - BATCH, so that the first batch is a full one at every position
        consumed = 0 if fraction is None else min(int(fraction * length), max(0, length - BATCH))
        state["consumed"] = consumed
        began = time.perf_counter()
        loader.load_state_dict(state)
        iterator = iter(loader)
        batch = next(iterator)
        best = min(best, time.perf_counter() - began)
        assert count_batch(batch) > 0
        del iterator, batch
    return consumed, best


def print_resume(ex: Export, repeats: int) -> None:
    length = ex.samples
    print(f"time to first batch after resume ({ex.name}, epoch of {length} samples, batch {BATCH}; "
          f"best of {repeats}):")
    for workers in (0, 2):
        cells = []
        for label, fraction in (("fresh", None), ("1%", 0.01), ("50%", 0.5), ("99%", 0.99)):
            consumed, seconds = first_batch_after_resume(ex, workers, fraction, repeats)
            cells.append(f"{label} (@{consumed}): {seconds * 1e3:6.1f} ms")
        print(f"  workers={workers}:  " + "   ".join(cells))


def profile_small(ex: Export, top: int) -> None:
    """cProfile of our small-sample path, one full pass each: ShardDataset iterated in-process (samples),
    then ShardLoader(32, num_workers=0) (adds collate and the DataLoader's per-batch work)."""
    paths: list[tuple[str, Callable[[], Iterable[Any]], Callable[[Any], int]]] = [
        ("ShardDataset samples", lambda: ours_samples(ex), count_sample),
        ("ShardLoader(32), workers=0", lambda: ShardLoader(ours_samples(ex), batch_size=BATCH), count_batch)]
    for label, make, count in paths:
        profiler = cProfile.Profile()
        profiler.enable()
        n = sum(count(item) for item in make())
        profiler.disable()
        stream = io.StringIO()
        stats = pstats.Stats(profiler, stream=stream).strip_dirs().sort_stats("tottime")
        stats.print_stats(top)
        print(f"\ncProfile of ours, {label} over {ex.name} ({n} samples), sorted by tottime:")
        print("\n".join(line for line in stream.getvalue().splitlines()
                        if line.strip() and "Ordered by" not in line and "List reduced" not in line))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=120, help="synthetic store size (both exports)")
    parser.add_argument("--large-stride", type=int, default=16, help="anchor stride of the large export")
    parser.add_argument("--imu-seconds", type=float, default=100.0, help="IMU window of the large export (200 Hz)")
    parser.add_argument("--min-s", type=float, default=1.0, help="run whole passes for at least this long")
    parser.add_argument("--max-s", type=float, default=2.5, help="stop a measurement after this long")
    parser.add_argument("--repeats", type=int, default=2, help="best of N")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of our small-sample path")
    parser.add_argument("--top", type=int, default=18, help="cProfile entries to print")
    args = parser.parse_args()

    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_read_") as tmp:
        store = Path(tmp) / "store"
        summary = write_synthetic_store(store, episodes=args.episodes, seed=0)
        print(f"store: {summary.episodes} episodes, {summary.total_seconds:.0f} s of data")
        small = export(store, Path(tmp) / "small", "small", [ALL_BUT_JOINTS, "shard.max_samples=1024"])
        large = export(store, Path(tmp) / "large", "large", [
            "exclude=[overview]", "streams.imu.rate_hz=200", f"streams.imu.duration_s={args.imu_seconds:g}",
            f"stride={args.large_stride}", "shard.max_samples=64"])
        for ex in (small, large):
            print(f"{ex.name}: {ex.samples} samples in {len(ex.urls)} shards, {ex.bytes / 1e6:.1f} MB, "
                  f"{ex.per_sample:,.0f} bytes/sample (manifest)")
        for ex in (small, large):
            sum(raw_pass(ex.urls))  # warm the page cache
        print(f"setup {time.perf_counter() - began:.1f} s; each row: whole passes >= {args.min_s:g} s, "
              f"cut at {args.max_s:g} s, best of {args.repeats}")
        for ex, target in ((small, "target: ours >= 2x wds"), (large, "target: ours >= 85% of raw")):
            print(f"\n== {ex.name}: {ex.per_sample:,.0f} bytes/sample ({target})")
            print_table(bench_size(ex, args))
        print()
        for ex in (small, large):
            print_resume(ex, args.repeats)
        if args.profile:
            profile_small(small, args.top)
    print(f"\ntotal {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
