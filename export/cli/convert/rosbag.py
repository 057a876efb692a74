"""`robowds convert rosbag SRC STORE`: options of the ROS bag converter (docs/convert-rosbag.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HELP = ("ROS 1 bags, ROS 2 bags / MCAP -> a store (topics to typed time series, images to video; header or "
        "receive times; one episode per bag, or split)")
SRC_HELP = "a ROS 1 .bag, a ROS 2 bag folder (metadata.yaml), an .mcap/.db3 file, or a folder of bags"


def what(report: dict[str, Any]) -> str:
    n = report["bags"]
    return f"{n} {' + '.join(report['ros'])} bag{'s' if n != 1 else ''}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mapping", type=Path, default=None, metavar="FILE",
                   help="YAML: the topics to convert, their fields and names (default: every topic of a supported "
                        "type with its default fields)")
    p.add_argument("--time", choices=("header", "receive"), default="header",
                   help="sample times: the message's header stamp, or the bag's receive time (a type without a "
                        "header always uses receive time)")
    split = p.add_mutually_exclusive_group()
    split.add_argument("--split-topic", default=None, metavar="TOPIC",
                       help="a message on TOPIC starts a new episode (default: one episode per bag)")
    split.add_argument("--split-gap", type=float, default=None, metavar="SECONDS",
                       help="a gap longer than SECONDS in the receive times of every converted topic starts a new "
                            "episode")
    p.add_argument("--typestore", default="latest",
                   help="rosbags type store for ROS 2 bags that embed no message definitions (ros2_humble, "
                        "ros2_jazzy, ...)")


def plan(args: argparse.Namespace):  # noqa: ANN201 (a Conversion)
    """The conversion; its plan notes (fields left out: an IMU without orientation...) also go to
    stderr, before the episodes are read, so a user sees what the store will lack without opening the
    report."""
    from robowds.export.convert.rosbag import plan_rosbag

    conversion = plan_rosbag(args.src, args.mapping, args.time, args.split_topic, args.split_gap, args.typestore,
                             args.skip_bad)
    for note in conversion.report.get("plan_notes", ()):
        print(f"robowds convert: note: {note}", file=sys.stderr)
    return conversion
