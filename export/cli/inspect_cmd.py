"""`robowds inspect OUT`: print one window's fields, or draw it (--png)."""

from __future__ import annotations

import argparse
from pathlib import Path

from robowds.export.cli.storage import add_storage_options_argument, storage_options
from robowds.export.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="print one window, or draw it (--png)")
    p.add_argument("out", help="export folder or fsspec URL, e.g. s3://bucket/out (holds manifest.json)")
    p.add_argument("--split", default="train", help="split to take the window from")
    p.add_argument("--key", help="sample key, e.g. ep_0003_000042")
    p.add_argument("--index", type=int, help="the N-th sample of the split in shard order (default 0)")
    p.add_argument("--png", type=Path, help="draw the window into this PNG file")
    p.add_argument("--out-dir", type=Path, help="draw --count random windows into this folder (<key>.png each)")
    p.add_argument("--count", type=int, default=8, help="windows to draw with --out-dir")
    p.add_argument("--seed", type=int, default=0, help="which random windows --out-dir draws")
    add_storage_options_argument(p)
    p.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from robowds.export.cli.inspect_window import load_window, render_png, summary
    from robowds.export.output.publish import load_finished_manifest
    from robowds.export.report.window_samples import random_windows, read_windows
    from robowds.export.store.location import store_location

    args.out = store_location(args.out, storage_options(args))

    if args.out_dir is not None:
        if args.count < 1:
            raise UserError(f"--count must be >= 1, got {args.count}", hint="e.g. --count 8 (one PNG per window)")
        manifest = load_finished_manifest(args.out)
        indices = random_windows(manifest, args.split, args.count, args.seed)
        args.out_dir.mkdir(parents=True, exist_ok=True)
        # each shard holding a drawn window is read once, and only those windows' bytes
        for sample in read_windows(args.out, manifest, args.split, indices):
            path = args.out_dir / f"{sample['__key__']}.png"
            render_png(manifest, sample, path)
            print(f"wrote {path}")
        return 0
    if args.key is None and args.index is None:
        args.index = 0
    manifest, sample = load_window(args.out, args.split, args.key, args.index)
    print(summary(manifest, sample))
    if args.png is not None:
        render_png(manifest, sample, args.png)
        print(f"wrote {args.png}")
    return 0
