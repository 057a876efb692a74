"""A store whose tables are one large row group (what `pyarrow.parquet.write_table` makes by default,
up to 1M rows per group) against the same store in row groups of 64 episodes: export time, in one run.

Each export task reads the episodes of its batch (8 by default) from whole row groups. Without the
per-worker row-group memo (`export/store/episodes.py`), every task decoded the whole large group
again: the cost grows with the table times the number of tasks, quadratic in the store. With it, a
worker decodes each row group once per job. `--before REV` also times git revision REV's code
(`git archive` of `export/` and `reader/` as the `robowds` package) on both stores, interleaved.

    python scripts/bench_row_groups.py [--episodes 400] [--repeats 2] [--before REV]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from robowds.export.cli.synth import write_synthetic_store

ROOT = Path(__file__).resolve().parents[1]


def stores(root: Path, episodes: int) -> dict[str, Path]:
    small = write_synthetic_store(root / "groups-of-64", episodes=episodes, seed=1).root  # row groups of 64
    large = root / "one-group"
    shutil.copytree(small, large)
    for path in large.glob("*.parquet"):
        pq.write_table(pq.read_table(path), path, row_group_size=1 << 20)
    return {"row groups of 64": small, "one row group": large}


def export_s(store: Path, out: Path, env: dict[str, str]) -> float:
    shutil.rmtree(out, ignore_errors=True)
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "robowds.export", str(store), str(out), "--quiet", "--workers", "1",
                    "--set", "exclude=[overview]"], check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - began


def archived(rev: str, folder: Path) -> dict[str, str]:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "export", "reader"], capture_output=True,
                             check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder / "robowds")
    (folder / "robowds" / "__init__.py").touch()
    return {**os.environ, "PYTHONPATH": str(folder)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--before", help="also time this git revision's code")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        layouts = stores(root, args.episodes)
        codes = {"this code": dict(os.environ)}
        if args.before:
            codes[f"before ({args.before})"] = archived(args.before, root / "before")
        best: dict[tuple[str, str], float] = {}
        for _ in range(args.repeats):
            for code, env in codes.items():
                for layout, store in layouts.items():
                    took = export_s(store, root / "out", env)
                    best[code, layout] = min(best.get((code, layout), float("inf")), took)
    print(f"{args.episodes} synthetic episodes, 1 worker, best of {args.repeats}, seconds per export (job + start-up)")
    for code in codes:
        small, large = best[code, "row groups of 64"], best[code, "one row group"]
        print(f"  {code:24s}: row groups of 64 {small:6.2f} s   one row group {large:6.2f} s   -> {large / small:.2f}x")


if __name__ == "__main__":
    main()
