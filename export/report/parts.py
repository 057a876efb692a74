"""The pieces the report page is assembled from, shared by the modules that compute them (pictures,
the per-episode table) and the one that writes the HTML (`page.py`).

Why a module of its own: the pictures (matplotlib, the store) and the page (plain HTML) are made
by different modules that must agree on these shapes and on nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """One picture of the page: inline PNG bytes (a `data:` URL in the HTML) with its alt text."""

    title: str  # shown above the picture, e.g. "ep_0003_000120 (train)"
    alt: str  # what the picture shows, for a reader without images: fields, steps, padding
    png: bytes  # a whole PNG file


@dataclass(frozen=True)
class CameraRow:
    """One camera of the export, as the cameras section lists it."""

    name: str
    encoding: str  # the schema's `encoding` (mp4, mp4-intra, av1, jpg, raw)
    resolution: str  # "W x H", or "source" when not resized
    rate_hz: float
    psnr_db_min: float | None  # the manifest report's worst PSNR against the source (None: not measured)
    psnr_frames: int  # frames the PSNR was measured on
    filmstrip: Figure | None  # frames of one sampled window, None when the split has no window
