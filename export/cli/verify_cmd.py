"""`robowds verify OUT [--store STORE] [--since GENERATION]`: check shards against the manifest, and windows
against the store; with --since only the shards the appends after that generation added."""

from __future__ import annotations

import argparse
import json
import os

from robowds.export.cli.storage import add_storage_options_argument, storage_options
from robowds.export.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="check shards against the manifest (and windows against the store)")
    p.add_argument("out", help="export folder or fsspec URL, e.g. s3://bucket/out (holds manifest.json)")
    p.add_argument("--store", help="recompute a random subset of windows from this store (folder or URL)")
    p.add_argument("--check-windows", type=int, default=32, help="how many windows to recompute (with --store)")
    p.add_argument("--seed", type=int, default=0, help="which random windows to recompute")
    p.add_argument("--since", metavar="GENERATION",
                   help="read only the shards the appends after this generation added (1: the first export; "
                        "the manifest's `generations` lists them); the manifest, side files, wids and Energon "
                        "files are checked in full, as without it")
    p.add_argument("--json", action="store_true",
                   help="print the result as one JSON document on stdout (exit code as without it)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="processes that check shards at once (default: all cores; exports under 64 MB are "
                        "checked in-process); the output is the same for any number")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_storage_options_argument(p)
    p.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from robowds.export.check.since import check_since
    from robowds.export.check.verify import verify_export
    from robowds.export.store.location import store_location

    if args.check_windows < 0:
        raise UserError(f"--check-windows must be >= 0, got {args.check_windows}",
                        hint="how many windows to recompute from the store, e.g. --check-windows 32")
    if args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}", hint="--workers 1 checks in-process")
    since = None if args.since is None else check_since(_integer(args.since))
    options = storage_options(args)
    store = None if args.store is None else store_location(args.store, options)
    if store is not None and store.local and not store.path.is_dir():
        raise UserError(f"store {args.store} is not a folder", hint="pass the store the export was made from")
    result = verify_export(store_location(args.out, options), store=store, check_windows=args.check_windows,
                           seed=args.seed, progress=not (args.quiet or args.json), since=since,
                           workers=args.workers)
    print(json.dumps(result.to_json(), indent=1) if args.json else result.render())
    return 0 if result.ok else 1


def _integer(text: str) -> int | str:
    """`--since`'s text as an int where it is one (`check_since` refuses the rest, naming the text)."""
    try:
        return int(text)
    except ValueError:
        return text
