"""Batches from DataLoader workers: the batch path (reused shared-memory slots) against the per-sample path.

    python scripts/bench_batches.py                      # exports bench_read.py's small and large sets first
    python scripts/bench_batches.py --data DIR           # DIR/small and DIR/large: existing exports

In one run, for each export, four `ShardLoader`s (per-sample path and batch path, workers 0 and 2),
each built once and iterated pass after pass (epochs, as training does), interleaved pass by pass for
`--repeats` rounds (the first round is warm-up). "per-sample path" is `collate_fn=PerSample()`, a
`Collate` subclass: ndarrays decoded per sample, then collated into a fresh shared storage per batch in a
worker; "batch path" is the default `collate`: arrays copied straight into the batch, in reused slots.
Printed per row: samples/s over whole passes (worker start-up included) and from each pass's first
batch on ("steady"); then workers=2 / workers=0 for both paths (issue-16 targets: >= 80% for small
samples, >= 50% for large), the cost of filling a fresh 16 MB shared storage against a reused one
(what the slots avoid), and the time a plain 2-worker DataLoader over a one-item dataset takes to its
first item (the start-up every epoch of workers pays, whatever the dataset). Needs only the reader (no webdataset/wids), so `--data` runs it anywhere.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from robowds.reader import ShardDataset, ShardLoader
from robowds.reader.collation import Collate

import benchlib


class PerSample(Collate):
    """`reader.collate` under another type: the per-sample path (see the module docstring)."""


def fill_ms(fresh: bool, nbytes: int, repeats: int) -> float:
    """Best ms to fill `nbytes` of a fresh shared storage (allocated per fill) or of one reused storage."""
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)  # [nbytes]
    kept = torch.UntypedStorage._new_shared(nbytes)

    def fill() -> None:  # a fresh storage is released on return, inside the timing
        storage = torch.UntypedStorage._new_shared(nbytes) if fresh else kept
        torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,)).numpy()[:] = src

    return benchlib.timed(fill, repeats).best * 1e3


class _One(torch.utils.data.IterableDataset):
    def __iter__(self):  # one tiny item: the DataLoader's own start-up, nothing of ours
        yield torch.zeros(1)


def startup_ms(workers: int, repeats: int) -> float:
    """Best ms from creating a plain DataLoader iterator with `workers` workers to its first item."""
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        iterator = iter(torch.utils.data.DataLoader(_One(), batch_size=None, num_workers=workers))
        next(iterator)
        best = min(best, time.perf_counter() - began)
        del iterator
    return best * 1e3


def bench(out: Path, batch: int, repeats: int) -> dict[tuple[str, int], tuple[float, float]]:
    """(path, workers) -> (median samples/s over whole passes, median steady samples/s)."""
    loaders = {}
    for workers in (0, 2):
        loaders[("per-sample path", workers)] = ShardLoader(ShardDataset(out, "train", seed=0), batch_size=batch,
                                                            num_workers=workers, collate_fn=PerSample())
        loaders[("batch path", workers)] = ShardLoader(ShardDataset(out, "train", seed=0), batch_size=batch,
                                                       num_workers=workers)
    rates: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for round_ in range(repeats + 1):
        for key, loader in loaders.items():
            began, first_at, first, n = time.perf_counter(), 0.0, 0, 0
            for item in loader:
                if not n:
                    first_at, first = time.perf_counter(), len(item["__key__"])
                n += len(item["__key__"])
                del item
            ended = time.perf_counter()
            if round_:  # round 0 warms the page cache and the loaders' slots
                rates.setdefault(key, []).append((n / (ended - began), (n - first) / max(ended - first_at, 1e-9)))
    return {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in rates.items()}


def main() -> None:
    # --repeats: measured rounds (medians), after one warm-up round
    parser = benchlib.parser(__doc__, repeats=5, quick={"episodes": 8, "repeats": 1})
    parser.add_argument("--data", type=Path, help="a folder with exports small/ and large/ (default: export them)")
    parser.add_argument("--episodes", type=int, default=120, help="synthetic store size when exporting")
    parser.add_argument("--large-batch", type=int, default=32, help="batch size for the large samples")
    parser.add_argument("--large-stride", type=int, default=16, help="anchor stride of the large export")
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_batches", args)
    with tempfile.TemporaryDirectory(prefix="bench_batches_") as tmp:
        data = args.data
        if data is None:
            sys.path.insert(0, str(Path(__file__).parent))
            import bench_read

            data = Path(tmp)
            store = data / "store"
            bench_read.write_synthetic_store(store, episodes=args.episodes, seed=0)
            bench_read.export(store, data / "small", "small", [bench_read.ALL_BUT_JOINTS, "shard.max_samples=1024"])
            bench_read.export(store, data / "large", "large", [
                "exclude=[overview]", "streams.imu.rate_hz=200", "streams.imu.duration_s=100",
                f"stride={args.large_stride}", "shard.max_samples=64"])
        for name, batch, goal in (("small", 32, 80), ("large", args.large_batch, 50)):
            samples = ShardDataset(data / name, "train").epoch_length()
            result = bench(data / name, batch, args.repeats)
            print(f"{name}: {samples} samples per pass, batch {batch}, median of {args.repeats} rounds")
            for (path, workers), (whole, steady) in result.items():
                print(f"  {path:16s} workers={workers}: {whole:9,.0f} samples/s   steady {steady:9,.0f} samples/s")
            for path in ("per-sample path", "batch path"):
                (w0, s0), (w2, s2) = result[(path, 0)], result[(path, 2)]
                print(f"  {path:16s} workers=2 / workers=0: {100 * w2 / w0:5.1f}% (steady {100 * s2 / s0:5.1f}%)"
                      f"  target >= {goal}%")
                report.add(f"{name}, {path}: workers=2 (vs workers=0)", w2, "samples/s", baseline=w0,
                           target=f">= {goal / 100:.2f}x")
            ratio = result[("batch path", 2)][0] / result[("per-sample path", 2)][0]
            print(f"  batch path / per-sample path, workers=2: {ratio:.2f}x")
            report.add(f"{name}, workers=2: batch path (vs per-sample path)", result[("batch path", 2)][0],
                       "samples/s", baseline=result[("per-sample path", 2)][0])
    nbytes = 16 << 20
    fresh, reused = fill_ms(True, nbytes, 10), fill_ms(False, nbytes, 10)
    print(f"fill a 16 MiB shared storage: fresh {fresh:.1f} ms, reused {reused:.1f} ms")
    startup = startup_ms(2, 5)
    print(f"a plain DataLoader with 2 workers over one tiny item: {startup:.0f} ms to its first item")
    report.add("fill a 16 MiB shared storage: reused (vs fresh)", reused, "ms", baseline=fresh)
    report.add("plain DataLoader, 2 workers, to its first item", startup, "ms")
    report.finish()


if __name__ == "__main__":
    main()
