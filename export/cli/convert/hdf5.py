"""`robowds convert hdf5 SRC STORE`: options of the HDF5 converter (robomimic, ALOHA/ACT, YAML mapping)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

HELP = ("an HDF5 dataset (robomimic, ALOHA/ACT, or any layout through --mapping) -> a store (steps at "
        "k / rate, camera frames as lossless or byte-exact videos)")
SRC_HELP = "a robomimic .hdf5 file, a folder of ALOHA episode_N.hdf5 files, or the file(s) a --mapping describes"
CODECS = ("ffv1", "mpeg4", "libsvtav1", "mjpeg")  # export/media/encode.py: FFV1 lossless, the others lossy


def what(report: dict[str, Any]) -> str:
    return f"HDF5 ({report['layout']}, {report['rate_hz']:g} Hz)" if report.get("rate_hz") else \
        f"HDF5 ({report['layout']}, times from {report['rate_source']})"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layout", choices=("robomimic", "aloha", "mapping"), default=None,
                   help="the file layout (default: detected from the first file; mapping when --mapping is given)")
    p.add_argument("--mapping", type=Path, default=None, metavar="FILE",
                   help="YAML mapping (episode groups, dataset -> field, rate_hz or time) for any other layout")
    p.add_argument("--fps", type=float, default=None, metavar="HZ",
                   help="the control rate in Hz; overrides robomimic's env_args control_freq, ALOHA's 50 Hz and "
                        "the mapping's rate_hz; required when none of them exists")
    p.add_argument("--image-codec", choices=CODECS, default="ffv1",
                   help="codec for raw uint8 frames (default ffv1: lossless; the others are lossy); JPEG frames "
                        "are always muxed as they are")
    p.add_argument("--exclude", action="append", default=[], metavar="KEY",
                   help="a dataset path (obs/agentview_depth), key or field name not to convert (repeatable)")
    masks = p.add_mutually_exclusive_group()
    masks.add_argument("--split-mask", action="append", default=None, metavar="NAME",
                       help="robomimic: a mask/NAME whose demos go to split NAME (repeatable; default: the masks "
                            "named train, valid, val, validation, test, eval that the file has)")
    masks.add_argument("--no-split-masks", action="store_true",
                       help="robomimic: no split column (the export's splits config decides)")


def plan(args: argparse.Namespace):  # noqa: ANN201 (a Conversion)
    from robowds.export.convert.hdf5 import plan_hdf5

    split_masks = () if args.no_split_masks else (tuple(args.split_mask) if args.split_mask else None)
    return plan_hdf5(args.src, layout=args.layout, mapping=args.mapping, fps=args.fps, exclude=tuple(args.exclude),
                     image_codec=args.image_codec, split_masks=split_masks)
