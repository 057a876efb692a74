"""`robowds verify` with 2 processes (this one and a pool of 1, `export/check/shared_map.py`) against 1
(in-process, the code before `--workers`), on the same synthetic export, in the same run, alternately
(1 then 2, `--repeats` pairs), each pair printed with the load average when it ended. Checking a shard
is reading it, its sha256, parsing the tar and decoding every member: CPU-bound, so 2 workers should
approach 2x on 2 idle cores. The forkserver starts in the first pair (and is reused by the others, as
by any later pool of the same process); each pair starts a fresh pool worker.

    python scripts/bench_verify.py                  # 100 synthetic episodes (~120 MB); ~2 minutes
    python scripts/bench_verify.py --episodes 300

robowds is imported inside `main()`, not at the top: a pool worker (forkserver) re-imports the main
module before its first task, and with robowds' CLI, export and verify modules imported here every
worker spent ~0.55 s of CPU on them, ~0.45 s more than under `robowds verify`, whose main module
(`bin/robowds`) imports only `robowds.export.cli` (~0.08 s in a worker, measured on the 2-core VM).
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import tempfile
from pathlib import Path

import benchlib


def main() -> None:
    from robowds.export.check.verify import verify_export
    from robowds.export.cli.main import main as cli
    from robowds.export.cli.synth import write_synthetic_store

    parser = benchlib.parser(__doc__, repeats=3, quick={"episodes": 12, "repeats": 1})
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_verify", args)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
        store = write_synthetic_store(Path(tmp) / "store", episodes=args.episodes).root
        out = Path(tmp) / "out"
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli(["export", str(store), str(out), "--quiet", "--set", "shard.max_samples=200"]) == 0
        size = sum(p.stat().st_size for p in out.rglob("*.tar"))
        shards = len(list(out.rglob("*.tar")))
        print(f"{args.episodes} episodes: {shards} shards, {size / 1e6:.0f} MB")
        results = {}

        def run(workers: int) -> None:
            results[workers] = verify_export(out, progress=False, workers=workers)

        # interleaved, so load changes hit both alike
        runs: dict[int, list[float]] = {1: [], args.workers: []}
        for pair in range(args.repeats):
            for workers in runs:
                runs[workers].append(benchlib.timed(lambda: run(workers), 1).best)
            one_s, many_s = runs[1][-1], runs[args.workers][-1]
            print(f"pair {pair + 1}: 1 worker {one_s:.2f} s, {args.workers} workers {many_s:.2f} s "
                  f"({one_s / many_s:.2f}x), {benchlib.load()}", flush=True)
        one, many = benchlib.Timing(tuple(runs[1])), benchlib.Timing(tuple(runs[args.workers]))
        assert results[1].to_json() == results[args.workers].to_json() and results[1].ok
        paired = statistics.median(a / b for a, b in zip(runs[1], runs[args.workers]))
        print(f"1 worker {one.best:.2f} s, {args.workers} workers {many.best:.2f} s: {one.best / many.best:.2f}x "
              f"by best; medians {one.median:.2f} / {many.median:.2f} s: {one.median / many.median:.2f}x; median of "
              f"the pairs' ratios {paired:.2f}x (each pair ran back to back: the machine's speed drifts less "
              "within a pair than across the run); same result: yes")
        report.add(f"verify {shards} shards ({size / 1e6:.0f} MB), {args.workers} workers vs 1", many.best, "s",
                   baseline=one.best, ratio=one.best / many.best, target=">= 1.8x faster")
        report.add(f"  the same, medians of {args.repeats}", many.median, "s", baseline=one.median,
                   ratio=one.median / many.median, target=">= 1.8x faster")
        report.add("  the same, median of the pairs' ratios", many.median, "s", baseline=one.median, ratio=paired,
                   target=">= 1.8x faster")
    report.finish()


if __name__ == "__main__":
    main()
