"""`robowds convert FORMAT SRC STORE`: a dataset in another format -> a new episode store."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

FORMATS = ("lerobot",)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="convert a dataset (LeRobot v2.0/v2.1/v3.0) into an episode store")
    p.add_argument("format", choices=FORMATS, help="source format")
    p.add_argument("src", type=Path, help="the source dataset's root folder")
    p.add_argument("store", type=Path, help="new store folder (created when the conversion is complete)")
    p.add_argument("--overwrite", action="store_true", help="replace a store that robowds convert wrote")
    p.add_argument("--json", action="store_true", help="print the conversion report as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from robowds.export.convert import convert_lerobot

    report = convert_lerobot(args.src, args.store, overwrite=args.overwrite,
                             progress=not (args.quiet or args.json))
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True))
        return 0
    skipped = report["skipped"]
    print(f"converted {report['episodes']} episodes of LeRobot {report['version']} ({len(report['fields'])} fields) "
          f"-> {args.store}" + (f"; skipped {len(skipped)} listed in meta but absent (see convert_report.json)"
                                if skipped else ""))
    return 0
