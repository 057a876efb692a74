"""`robowds convert FORMAT SRC STORE`: a dataset in another format -> a new episode store.

One sub-command per format; each format's own options live in this package's `<format>.py` (`HELP`, `SRC_HELP`,
`what(report)`, `add_arguments(parser)`, `plan(args) -> Conversion`); the options every format shares are here.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from robowds.export.cli.export_cmd import add_executor_arguments, executor_choice
from robowds.export.errors import UserError

FORMATS = ("lerobot", "hdf5", "rlds", "rosbag", "clips")  # each has robowds.export.cli.convert.<format>


def _format_module(name: str):  # noqa: ANN202 (a module)
    return importlib.import_module(f"robowds.export.cli.convert.{name}")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help=f"convert a dataset ({', '.join(FORMATS)}) into an episode store")
    formats = p.add_subparsers(dest="format", required=True, metavar="FORMAT",
                               help="the source format; `robowds convert FORMAT --help` lists its options")
    for name in FORMATS:
        module = _format_module(name)
        f = formats.add_parser(name, help=module.HELP, description=module.HELP)
        f.add_argument("src", type=Path, help=module.SRC_HELP)
        f.add_argument("store", type=Path, help="new store folder (created when the conversion is complete)")
        module.add_arguments(f)
        f.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1),
                       help="worker processes (1 = in-process); the store is identical for any count")
        add_executor_arguments(f)
        f.add_argument("--skip-bad", action="store_true",
                       help="skip episodes that cannot be converted, list them in the report, and go on")
        f.add_argument("--overwrite", action="store_true", help="replace a store that robowds convert wrote")
        f.add_argument("--json", action="store_true", help="print the conversion report as JSON on stdout")
        f.add_argument("--quiet", action="store_true", help="no progress bar")
        f.set_defaults(fn=run, plan=module.plan, what=module.what)
    p.set_defaults(fn=lambda args: p.error("choose a FORMAT"))


def run(args: argparse.Namespace) -> int:
    from robowds.export.convert.run import run_conversion, summary

    if args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}", hint="--workers 1 runs in-process")
    choice = executor_choice(args)
    report = run_conversion(args.plan(args), args.store, overwrite=args.overwrite, workers=args.workers,
                            skip_bad=args.skip_bad, progress=not (args.quiet or args.json), executor=choice)
    for warning in report.get("warnings", ()):  # also in the report; stderr, so --json's stdout stays JSON
        print(f"robowds convert: warning: {warning['message']}\n  fix: {warning['fix']}", file=sys.stderr)
    print(json.dumps(report, indent=1, sort_keys=True) if args.json else summary(report, args.store, args.what(report)))
    return 0
