"""The report's pictures: sampled windows drawn as `inspect --png` draws them, source samples over
the exported lines (with `--store`), and each camera's filmstrip.

Scaffold: the signatures the page is built against; the drawing lands in the next commits.
"""

from __future__ import annotations

from typing import Any

from robowds.export.report.parts import CameraRow, Figure
from robowds.export.store.location import StoreLocation


def window_figures(out: StoreLocation, manifest: dict[str, Any], split: str, count: int, seed: int) -> list[Figure]:
    """`count` windows of `split` drawn with `seed` (all when it has fewer), in sample-index order."""
    return []


def overlay_figures(out: StoreLocation, manifest: dict[str, Any], store: StoreLocation, split: str, count: int,
                    seed: int) -> list[Figure]:
    """For `count` windows drawn with `seed`: each stream's source samples as dots over its exported line."""
    return []


def camera_rows(out: StoreLocation, manifest: dict[str, Any], split: str, seed: int) -> list[CameraRow]:
    """One row per camera field of the schema, with a filmstrip of one window drawn with `seed`."""
    return []
