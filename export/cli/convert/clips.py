"""`robowds convert clips SRC STORE`: options of the labelled-clips converter."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

HELP = ("a folder of video clips + a labels file (JSON/CSV, Something-Something-v2 style) -> a store: one episode "
        "per clip or labelled segment, videos referenced, text from the label")
SRC_HELP = "the folder holding the video files (labels name them relative to it)"


def what(report: dict[str, Any]) -> str:
    return f"labelled clips ({Path(report['labels']).name})"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--labels", type=Path, default=None, metavar="FILE",
                   help="the labels file, .json or .csv (default: labels.json or labels.csv in SRC)")
    p.add_argument("--time-unit", choices=("s", "frames"), default="s",
                   help="unit of the labels' start/end: seconds in the video's own clock, or 0-based frame "
                        "numbers, end exclusive (default: s)")
    p.add_argument("--fps", type=float, default=None,
                   help="the video fps written to the store (default: each file's average rate, read with PyAV)")
    p.add_argument("--video-field", default="video",
                   help="the store's video field, its links under media/<field>/ (default: video)")
    p.add_argument("--text-field", default="text", help="the store's text field (default: text)")
    p.add_argument("--id-column", default=None, metavar="KEY",
                   help="the label key holding the episode id (default: id; without one, the video's file stem)")
    p.add_argument("--file-column", default=None, metavar="KEY",
                   help="the label key naming the video, relative to SRC (default: file, video or path; without "
                        "one, the video in SRC whose stem is the id)")
    p.add_argument("--text-column", default=None, metavar="KEY",
                   help="the label key holding the text (default: text, label or template, the first present)")


def plan(args: argparse.Namespace):  # noqa: ANN201 (a Conversion)
    from robowds.export.convert.clips import plan_clips
    from robowds.export.convert.clips.labels import LabelOptions

    options = LabelOptions(args.id_column, args.file_column, args.text_column, args.time_unit)
    return plan_clips(args.src, args.labels, options, args.video_field, args.text_field, args.fps, args.skip_bad)
