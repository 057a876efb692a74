"""`robowds validate STORE`: sanity-check an episode store before export; exit 0 iff exportable."""

from __future__ import annotations

import argparse
import json
import sys
from robowds.export.cli.storage import add_storage_options_argument, storage_options
from robowds.export.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="sanity-check an episode store before export")
    p.add_argument("store", help="episode store: a folder, or an fsspec URL (s3://bucket/store)")
    p.add_argument("-v", "--verbose", action="store_true", help="list every episode's durations")
    p.add_argument("--json", action="store_true",
                   help="print the report as one JSON document on stdout (exit code as without it)")
    p.add_argument("--quiet", action="store_true", help="no progress bar (there is none when stderr is not a terminal)")
    p.add_argument("--max-episode-s", type=float, default=86400.0, metavar="SECONDS",
                   help="longer episodes are errors (default 86400 = 24 h; export config max_episode_s)")
    add_storage_options_argument(p)
    p.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from robowds.export.store.location import store_location
    from robowds.export.store.validate import validate_store

    if not args.max_episode_s > 0:
        raise UserError(f"--max-episode-s must be a positive number of seconds, got {args.max_episode_s:g}",
                        hint="e.g. --max-episode-s 86400 (24 h, the default)")
    store = store_location(args.store, storage_options(args))
    report = validate_store(store, progress=sys.stderr.isatty() and not (args.quiet or args.json),
                            max_episode_s=args.max_episode_s)
    print(json.dumps(report.to_json(), indent=1) if args.json else report.render(verbose=args.verbose))
    return 0 if report.exportable else 1
