"""Shard layouts: bytes per sample and read speed of `shard.layout: members` against `npz`.

    .venv/bin/python scripts/bench_layout.py            # ~1 minute on 2 cores

What it does: the default synthetic store (`robowds synth` defaults: 8 episodes, seed 0) exported with
`robowds export` defaults, once per layout (`--set shard.layout=npz`), plus a "large" pair with the
time series at 1000 Hz (`--set window.rate_hz=1000`: ~200 KB samples). For each export it walks every
shard and counts every byte as one of:
  - tar headers: 512 per member, plus the 1024-byte end-of-archive blocks of each shard;
  - tar padding: the zeros after each member's data up to its 512-byte block;
  - zip structure (npz only): local headers, entry names, alignment pads, central directory, end record;
  - npy headers: the `.npy` header of every array (numpy pads each to 128 bytes);
  - payload: array data, image, text and JSON bytes.
The issue's target: tar headers + tar padding <= 15% of shard bytes for the default synthetic export.
It also prints what two layouts robowds does not write would take, computed by packing each sample
that way: one `.npz` member holding every member (text, JSON and PNG as non-npy entries, which
webdataset's `.npz` handler hands back as raw bytes), and one holding all but the image.

Read speed: `ShardDataset(out, "train", seed=0)` iterated in-process (local shards from the page
cache, samples as the reader hands them out: zero-copy views), whole passes for --min-s, best of
--repeats, both layouts interleaved in the same run; then the same with `fields=["joints"]`, and
with `exclude=["overview"]` (no PNG decode: what the layouts cost), and through
`ShardLoader(batch_size=32)` (the batch path, fixed-shape arrays copied from the mapped shard into the
batch tensors). Printed: samples/s and npz / members ratios.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Callable

from robowds.export.cli.main import main as robowds
from robowds.export.cli.synth import write_synthetic_store
from robowds.reader.decode import IMAGE_EXTS
from robowds.reader.format import BLOCK, END_OF_ARCHIVE, group_samples, iter_members, parse_npy_header
from robowds.reader.npz import PACKED, encode_npz, npz_entries

import benchlib

PARTS = ("tar headers", "tar padding", "zip structure", "npy headers", "payload")


def byte_shares(out: Path) -> tuple[dict[str, int], int, int, list[list[int]]]:
    """(bytes per part over every shard, shard bytes, samples, hypothetical layouts): the last are
    [bytes, of which tar headers + padding] if every member were inside the npz, and if every member
    but images were (text and JSON as non-npy entries), computed by packing each sample that way."""
    manifest = json.loads((out / "manifest.json").read_text())
    parts = dict.fromkeys(PARTS, 0)
    total = samples = 0
    hypothetical = [[0, 0], [0, 0]]
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            data = (out / shard["path"]).read_bytes()
            total += len(data)
            parts["tar headers"] += len(END_OF_ARCHIVE)
            for _, _, members in group_samples(iter_members(data)):
                samples += 1
                loose = {}
                for suffix, blob in members.items():
                    parts["tar headers"] += BLOCK
                    parts["tar padding"] += (-len(blob)) % BLOCK
                    if suffix == PACKED:
                        entries, _ = npz_entries(blob)
                        parts["zip structure"] += len(blob) - sum(e.size for e in entries)
                        for e in entries:
                            header = parse_npy_header(blob[e.data:e.data + e.size]).length
                            parts["npy headers"] += header
                            parts["payload"] += e.size - header
                            loose[e.name] = bytes(blob[e.data:e.data + e.size])
                    elif suffix.endswith(".npy"):
                        header = parse_npy_header(blob).length
                        parts["npy headers"] += header
                        parts["payload"] += len(blob) - header
                        loose[suffix] = bytes(blob)
                    else:
                        parts["payload"] += len(blob)
                        loose[suffix] = bytes(blob)
                for variant, images in enumerate((True, False)):  # images inside the npz, or members
                    inside = {s: d for s, d in loose.items() if images or s.rpartition(".")[2] not in IMAGE_EXTS}
                    stored = [encode_npz(sorted(inside.items())), *(d for s, d in loose.items() if s not in inside)]
                    hypothetical[variant][0] += sum(BLOCK + len(d) + (-len(d)) % BLOCK for d in stored)
                    hypothetical[variant][1] += sum(BLOCK + (-len(d)) % BLOCK for d in stored)
        for variant in hypothetical:
            variant[0] += len(END_OF_ARCHIVE) * len(split["shards"])
            variant[1] += len(END_OF_ARCHIVE) * len(split["shards"])
    assert sum(parts.values()) == total
    return parts, total, samples, hypothetical


def rate(make: Callable[[], Any], min_s: float) -> float:
    """Samples (or batch rows) per second over whole passes of `make()`'s iterable for at least min_s."""
    return benchlib.throughput(lambda: sum(len(item["__key__"]) if isinstance(item.get("__key__"), list) else 1
                                           for item in make()), min_s)


def main() -> None:
    parser = benchlib.parser(__doc__, repeats=3, quick={"min_s": 0.1, "repeats": 1})
    parser.add_argument("--min-s", type=float, default=1.5)
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_layout", args)
    from robowds.reader import ShardDataset, ShardLoader
    from robowds.reader.collation import collate

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_synthetic_store(root / "store", episodes=8, seed=0)
        outs: dict[tuple[str, str], Path] = {}
        for size, extra in (("default", []), ("large", ["--set", "window.rate_hz=1000"])):
            for layout in ("members", "npz"):
                out = outs[size, layout] = root / f"{size}-{layout}"
                assert robowds(["export", str(root / "store"), str(out), "--quiet", "--workers", "1", *extra,
                                "--set", f"shard.layout={layout}"]) == 0

        print("bytes (share of shard bytes)")
        per_sample: dict[tuple[str, str], float] = {}
        for (size, layout), out in outs.items():
            parts, total, samples, hypothetical = byte_shares(out)
            shares = "  ".join(f"{name} {100 * value / total:5.1f}%" for name, value in parts.items())
            overhead = parts["tar headers"] + parts["tar padding"]
            per_sample[size, layout] = total / samples
            print(f"  {size:7s} {layout:7s}: {total / samples:9.0f} B/sample  {shares}  "
                  f"-> tar headers + padding {100 * overhead / total:.1f}%, all non-payload "
                  f"{100 * (total - parts['payload']) / total:.1f}%")
            if layout == "npz":
                for (whole, overhead), what in zip(hypothetical, ("every member", "all but the image")):
                    print(f"  {size:7s} (not written) npz holding {what:17s}: {whole / samples:9.0f} B/sample, "
                          f"tar headers + padding {100 * overhead / whole:.1f}%")

        for size in ("default", "large"):
            report.add(f"{size} samples: bytes, npz (vs members)", per_sample[size, "npz"], "B/sample",
                       baseline=per_sample[size, "members"])
        print(f"\nread (in-process, samples/s, best of {args.repeats}; the machine may be loaded: compare ratios)")
        rows: dict[str, Callable[[Path], Callable[[], Any]]] = {
            "whole": lambda out: lambda: ShardDataset(out, "train", seed=0),
            "exclude=[overview]": lambda out: lambda: ShardDataset(out, "train", seed=0, exclude=["overview"]),
            "fields=[joints]": lambda out: lambda: ShardDataset(out, "train", seed=0, fields=["joints"]),
            "ShardLoader b=32": lambda out: lambda: ShardLoader(ShardDataset(out, "train", seed=0), batch_size=32,
                                                                collate_fn=collate),
        }
        for size in ("default", "large"):
            for row, make in rows.items():
                best = {"members": 0.0, "npz": 0.0}
                for layout in best:  # warm the page cache and the decoders' imports
                    rate(make(outs[size, layout]), 0.0)
                for _ in range(args.repeats):
                    for layout in best:
                        best[layout] = max(best[layout], rate(make(outs[size, layout]), args.min_s))
                print(f"  {size:7s} {row:18s}: members {best['members']:9.0f}  npz {best['npz']:9.0f}  "
                      f"npz/members {best['npz'] / best['members']:.2f}x")
                report.add(f"{size} samples, {row}: npz (vs members)", best["npz"], "samples/s",
                           baseline=best["members"])
    report.finish()


if __name__ == "__main__":
    main()
