"""`robowds convert lerobot SRC STORE`: options of the LeRobot converter."""

from __future__ import annotations

import argparse
from typing import Any

HELP = "a LeRobot v2.0/v2.1/v3.0 dataset -> a store (times from frame_index / fps, videos referenced)"
SRC_HELP = "the LeRobot dataset's root folder (holding meta/, data/, videos/)"


def what(report: dict[str, Any]) -> str:
    return f"LeRobot {report['version']}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--exclude", action="append", default=[], metavar="FEATURE",
                   help="a feature key (observation.images.cam_high) or field name not to convert (repeatable)")


def plan(args: argparse.Namespace):  # noqa: ANN201 (a Conversion)
    from robowds.export.convert.lerobot import plan_lerobot

    return plan_lerobot(args.src, tuple(args.exclude), skip_bad=args.skip_bad)
