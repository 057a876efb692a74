"""Batches per second through ShardLoader with `reader.collate` against torch's `default_collate`, on
the same shards, in-process and with DataLoader workers.

    python scripts/bench_collate.py              # ~1 minute on 2 cores

One synthetic store exported with the default config (every stream with its mask, the camera image,
text and meta: 11 tensors per batch), read with `ShardLoader(batch_size=32)`. Both collate functions
get the same decoded samples and build the same values. In a worker, `torch.utils.data.default_collate`
allocates every tensor in a shared-memory storage of its own, and torch passes each storage to the main
process as a file descriptor over its own socket connection. `reader.collate` allocates one storage per
batch and makes every tensor a view of it (`reader/collation.py: _allocate`). Rows are interleaved and
each is the best of `--repeats` runs of at least `--seconds`; ratio = ours / default_collate.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

from torch.utils.data import default_collate

from robowds.export.cli.main import main as robowds
from robowds.export.cli.synth import write_synthetic_store
from robowds.reader import ShardDataset, ShardLoader
from robowds.reader.collation import collate

import benchlib

BATCH = 32


def rate(out: Path, collate_fn: Callable[[list[dict[str, Any]]], Any], workers: int, seconds: float) -> float:
    """Samples/s over whole epochs (worker start-up included, as in training) for at least `seconds`."""
    def epoch() -> int:
        loader = ShardLoader(ShardDataset(out, "train", seed=0), batch_size=BATCH, num_workers=workers,
                             collate_fn=collate_fn)
        return sum(len(batch["__key__"]) for batch in loader)

    return benchlib.throughput(epoch, seconds)


def main() -> None:
    parser = benchlib.parser(__doc__, repeats=2, quick={"episodes": 8, "seconds": 0.2, "repeats": 1})
    parser.add_argument("--episodes", type=int, default=120)
    parser.add_argument("--stride", type=int, default=4, help="anchor stride of the export")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_collate", args)
    warnings.simplefilter("ignore")  # default_collate warns about the read-only (mapped) arrays
    with tempfile.TemporaryDirectory(prefix="bench_collate_") as tmp:
        store, out = Path(tmp) / "store", Path(tmp) / "out"
        write_synthetic_store(store, episodes=args.episodes, seed=0)
        with contextlib.redirect_stdout(io.StringIO()):
            code = robowds(["export", str(store), str(out), "--quiet", "--workers", "2", "--set", f"stride={args.stride}"])
        if code != 0:
            raise SystemExit(f"export failed with exit code {code}")
        dataset = ShardDataset(out, "train")
        first = next(iter(ShardLoader(ShardDataset(out, "train"), batch_size=BATCH)))
        tensors = sum(1 for v in first.values() if hasattr(v, "untyped_storage"))
        print(f"{len(dataset)} samples, {tensors} tensors per batch of {BATCH}")
        print(f"{'':12s} {'reader.collate':>15s} {'default_collate':>16s} {'ratio':>6s}")
        for workers in (0, 2):
            best: dict[str, float] = {"ours": 0.0, "torch": 0.0}
            for _ in range(args.repeats):  # interleaved: a slow spell of the machine hits both
                best["ours"] = max(best["ours"], rate(out, collate, workers, args.seconds))
                best["torch"] = max(best["torch"], rate(out, default_collate, workers, args.seconds))
            print(f"workers={workers:<4d} {best['ours']:12,.0f}/s {best['torch']:13,.0f}/s "
                  f"{best['ours'] / best['torch']:5.2f}x")
            report.add(f"reader.collate, workers={workers} (vs default_collate)", best["ours"], "samples/s",
                       baseline=best["torch"])
    report.finish()


if __name__ == "__main__":
    main()
