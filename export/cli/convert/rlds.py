"""`robowds convert rlds SRC STORE`: options of the RLDS (TFDS TFRecord, Open X-Embodiment) converter."""

from __future__ import annotations

import argparse
from typing import Any

HELP = ("an RLDS / TFDS TFRecord dataset (Open X-Embodiment) -> a store, without TensorFlow (steps at "
        "--fps, JPEG cameras muxed as MJPEG byte for byte)")
SRC_HELP = "the dataset's version folder (holding features.json and *.tfrecord-* files) or a folder above it"


def what(report: dict[str, Any]) -> str:
    return f"RLDS {report['dataset']} {report['version']} ({'+'.join(report['splits'])}, {report['fps']:g} Hz)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fps", type=float, default=None,
                   help="step rate in Hz (RLDS stores no times; t = step / fps); default: the dataset's known "
                        "rate (bridge 5, droid 15, fractal20220817_data 3), else required")
    p.add_argument("--split", default="train",
                   help="which split's files to convert (<name>-<split>.tfrecord-*), or 'all'")
    p.add_argument("--exclude", action="append", default=[], metavar="FEATURE",
                   help="a feature key (steps/observation/image_3 or observation/image_3) or field name not to "
                        "convert (repeatable)")
    p.add_argument("--image-codec", choices=("ffv1", "mjpeg"), default="ffv1",
                   help="codec for cameras whose images are not JPEG (PNG): ffv1 (lossless) or mjpeg (lossy); "
                        "JPEG images are always muxed as they are")
    p.add_argument("--whole-records", action="store_true",
                   help="take each record whole as one episode, ignoring is_first/is_last")


def plan(args: argparse.Namespace):  # noqa: ANN201 (a Conversion)
    from robowds.export.convert.rlds import plan_rlds

    return plan_rlds(args.src, args.fps, args.split, tuple(args.exclude), args.image_codec, args.whole_records)
