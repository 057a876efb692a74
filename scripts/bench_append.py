"""`robowds export --append` against a full export of the grown store: time and bytes written, in one run.

    .venv/bin/python scripts/bench_append.py --episodes 2000 --added 100

A synthetic store of `--episodes` + `--added` episodes (`write_synthetic_store`), and the same store
cut to its first `--episodes` (its tables filtered, its media hard-linked: the same episodes, byte for
byte). Then, each a `robowds export` process (start-up included, as a user waits for it):

1. a full export of the small store into OUT (the export that will grow);
2. `--append` of the grown store into OUT: the `--added` episodes;
3. a full export of the grown store into another folder: the baseline.

Reported: the append's time against the full export's (target: at most 10%), and the bytes the append
wrote, found by walking OUT before and after it (every file that is new or whose size, mtime or inode
changed), against what it must write: the new shards and their `.tar.idx`, `manifest.json`, the side
files (`episodes.msgpack`, `stats-state.msgpack`), the `<split>.wids.json` indexes and Energon's
`.nv-meta/` files (target: equal, nothing else touched). Also what the append spends outside
exporting the new episodes: the fingerprint pass over the old ones (their rows and media listing,
read by the export's own loader, `job/append.py`), timed alone in this process.

Episodes are kept small so that 2,100 of them run in a few minutes on 2 cores: the overview camera
is left out (`exclude=[overview]`) and windows start every 16 steps (`stride=16`). `--camera` keeps
the camera (a PNG per episode, resized and stored in every window): each episode costs the export
more while the fingerprint pass stays the same (it lists media, never decodes them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import benchlib

SETS = ["exclude=[overview]", "stride=16"]
CAMERA_SETS = ["stride=16"]
TARGET = 0.10  # append time / full export time


def cut_store(grown: Path, small: Path, episodes: int) -> None:
    """`small`: `grown`'s first `episodes` episodes (every table filtered, their media hard-linked),
    so the small store's episodes are the grown store's, row for row."""
    small.mkdir()
    shutil.copy2(grown / "store.yaml", small / "store.yaml")
    ids = None
    for table_path in sorted(grown.glob("*.parquet")):
        table = pq.read_table(table_path)
        ids = ids if ids is not None else table.column("episode_id").slice(0, episodes)
        kept = table.filter(pc.is_in(table.column("episode_id"), value_set=ids))
        pq.write_table(kept, small / table_path.name, compression="zstd", use_dictionary=False, row_group_size=64)
        for name in kept.column_names:  # media paths the kept rows name: linked, not copied
            if name != "episode_id" and pa.types.is_string(kept.schema.field(name).type):
                for rel in kept.column(name).to_pylist():
                    if isinstance(rel, str) and (grown / rel).is_file():
                        (small / rel).parent.mkdir(parents=True, exist_ok=True)
                        os.link(grown / rel, small / rel)


def export(store: Path, out: Path, workers: int, sets: list[str], *extra: str) -> dict[str, Any]:
    """One `robowds export` process: its `--json` summary plus `wall_s` (start-up included)."""
    cmd = [sys.executable, "-m", "robowds.export", str(store), str(out), "--quiet", "--json", "--workers",
           str(workers), *extra]
    if "--append" not in extra:
        cmd += [a for s in sets for a in ("--set", s)]
    began = time.perf_counter()
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - began
    return {**json.loads(done.stdout), "wall_s": wall}


def snapshot(out: Path) -> dict[str, tuple[int, int, int]]:
    """Every file under OUT: relative path -> (size, mtime_ns, inode)."""
    found = {}
    for folder, _, names in os.walk(out):
        for name in names:
            st = os.stat(os.path.join(folder, name))
            found[os.path.relpath(os.path.join(folder, name), out)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return found


def expected_writes(out: Path, before: dict[str, tuple[int, int, int]]) -> set[str]:
    """What an append must write: its new shards and their indexes, the manifest, the side files, the
    wids indexes and Energon's metadata."""
    manifest = json.loads((out / "manifest.json").read_bytes())
    shards = {s["path"] for e in manifest["splits"].values() for s in e["shards"]} - set(before)
    side = {entry["path"] for entry in manifest.get("files", {}).values()}
    wids = {f"{split}.wids.json" for split in manifest["splits"]}
    nv = {str(p.relative_to(out)) for p in (out / ".nv-meta").rglob("*") if p.is_file()}
    return {*shards, *(f"{s}.idx" for s in shards), "manifest.json", *side, *wids, *nv}


def fingerprint_pass(store: Path, out: Path, old: list[str], media: bool = True) -> tuple[float, int]:
    """Seconds of the append's proof that the `old` episodes are unchanged (their fingerprints through
    the export's loader, as `append._refuse_changes` takes them), alone; and how many episodes.
    `media=False`: the same pass without the image and video fields (rows only: what the pass would
    cost if it listed media by size instead of reading them as the loader does)."""
    from robowds.export.job.append_config import out_config
    from robowds.export.store.episodes import EpisodeLoader
    from robowds.export.store.location import store_location
    from robowds.export.store.row_stream import drop_row_groups, read_order

    doc = json.loads((out / "manifest.json").read_bytes())
    job, _ = out_config(store_location(store), doc["config"], str(out))
    fields = [f for f in job.load_fields if media or job.schema.fields[f].kind not in ("image", "video")]
    began = time.perf_counter()
    loader = EpisodeLoader(job.schema, fields)
    count = sum(1 for _ in loader.load(read_order(job.schema, old)))
    drop_row_groups()
    return time.perf_counter() - began, count


def main() -> None:
    parser = benchlib.parser(__doc__, repeats=1, quick={"episodes": 20, "added": 2})
    parser.add_argument("--episodes", type=int, default=2000, help="episodes of the export that grows")
    parser.add_argument("--added", type=int, default=100, help="episodes the store grows by")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--camera", action="store_true", help="keep the overview camera (slower episodes)")
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_append", args)
    from robowds.export.cli.synth import write_synthetic_store

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        began = time.perf_counter()
        write_synthetic_store(root / "grown", episodes=args.episodes + args.added)
        cut_store(root / "grown", root / "small", args.episodes)
        print(f"stores of {args.episodes} and {args.episodes + args.added} episodes written in "
              f"{time.perf_counter() - began:.1f} s")
        appends, fulls, checks, rows_only = [], [], [], []
        for _ in range(max(1, args.repeats)):
            out, full = root / "out", root / "full"
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(full, ignore_errors=True)
            sets = CAMERA_SETS if args.camera else SETS
            first = export(root / "small", out, args.workers, sets)
            before = snapshot(out)
            old = [ep for e in json.loads((out / "manifest.json").read_bytes())["splits"].values()
                   for ep in e["episodes"]]
            appends.append(export(root / "grown", out, args.workers, sets, "--append"))
            after = snapshot(out)
            fulls.append(export(root / "grown", full, args.workers, sets))
            checks.append(fingerprint_pass(root / "grown", out, old))
            rows_only.append(fingerprint_pass(root / "grown", out, old, media=False)[0])
        written = {rel for rel, meta in after.items() if before.get(rel) != meta}
        expected = expected_writes(out, before)
        written_bytes = sum(after[rel][0] for rel in written)
        expected_bytes = sum(after[rel][0] for rel in expected if rel in after)
        out_bytes = sum(meta[0] for meta in after.values())
        full_bytes = sum(meta[0] for meta in snapshot(full).values())
        unexpected = sorted(written - expected)
    append_s = min(a["wall_s"] for a in appends)
    full_s = min(f["wall_s"] for f in fulls)
    append_job = min(a["seconds"] for a in appends)
    full_job = min(f["seconds"] for f in fulls)
    check_s = min(c[0] for c in checks)
    print(f"full export of {args.episodes}: {first['wall_s']:.1f} s ({first['seconds']:.1f} s of job), "
          f"{first['windows']} windows in {first['shards']} shards")
    print(f"append of {args.added}: {append_s:.1f} s ({append_job:.1f} s of job); full export of "
          f"{args.episodes + args.added}: {full_s:.1f} s ({full_job:.1f} s of job); ratio {append_s / full_s:.3f} "
          f"(job {append_job / full_job:.3f}), target <= {TARGET:.2f}")
    print(f"  of which the fingerprint pass over the {checks[-1][1]} old episodes: {check_s:.1f} s (timed alone; "
          f"{min(rows_only):.1f} s without reading the media)")
    print(f"bytes written by the append: {written_bytes:,} in {len(written)} files; expected (new shards + "
          f".idx, manifest, side files, wids and .nv-meta): {expected_bytes:,} in {len(expected)} files; "
          f"OUT after: {out_bytes:,}; a full export of the grown store: {full_bytes:,}")
    if unexpected:
        print(f"  written besides those: {', '.join(unexpected[:10])}")
    camera = ", camera" if args.camera else ""
    grown = args.episodes + args.added
    report.add(f"append {args.added} to {args.episodes} episodes{camera} (vs full export of {grown})",
               append_s, "s", baseline=full_s, target=f"<= {TARGET:.2f}x")
    report.add("  job time alone (no interpreter start-up)", append_job, "s", baseline=full_job,
               target=f"<= {TARGET:.2f}x")
    report.add(f"  fingerprint pass over {checks[-1][1]} old episodes (vs the append's job)", check_s, "s",
               baseline=append_job)
    report.add("  the same pass without reading media (rows only; vs the append's job)", min(rows_only), "s",
               baseline=append_job)
    report.add("bytes written by the append (vs new shards + manifest + side + index files)", written_bytes / 1e6,
               "MB", baseline=expected_bytes / 1e6, target="1.00x")
    report.add("  bytes written by the append (vs a full export of the grown store)", written_bytes / 1e6, "MB",
               baseline=full_bytes / 1e6)
    report.finish()


if __name__ == "__main__":
    main()
