"""Converters: the formats robot data comes in (LeRobot, ...) -> episode stores that export/store reads.
Each converter maps its source exactly (times, names, media referenced, not copied) and reports what it skipped."""

from robowds.export.convert.lerobot import convert_lerobot

__all__ = ["convert_lerobot"]
