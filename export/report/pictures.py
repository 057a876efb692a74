"""The report's pictures: sampled windows drawn as `inspect --png` draws them, source samples over
the exported lines (with `--store`, `overlay.py`), and each camera's filmstrip (`filmstrip.py`).

Cost: each picture reads only its window's bytes (`window_samples.read_windows`: one open per shard
holding a drawn window), so it does not grow with the export; drawing dominates (one core: ~1 s per
synthetic window figure, ~2.5 s per G1 one, mostly matplotlib's text layout; an overlay about half
that), so the page's pictures cost O(count), not O(export).
"""

from __future__ import annotations

from typing import Any

from robowds.export.report.filmstrip import filmstrip
from robowds.export.report.overlay import overlay_pictures
from robowds.export.report.parts import CameraRow, Figure
from robowds.export.report.png import dims_text, png_bytes, steps_text
from robowds.export.report.window_figure import (MAX_FRAMES, figure, left_out, left_out_alt, left_out_note,
                                                 without_fields)
from robowds.export.report.window_samples import pick_windows, read_windows, sampled_windows
from robowds.export.store.location import StoreLocation

# 72 dpi, 256 colours (png.png_bytes): the synthetic export's window (5 streams and its image, 10 x 14.2
# in) is 720 x 1022 px and ~25 KB; a G1 window (8 camera frames, 2 x 26-D streams, 19.2 x 20.8 in) is
# 1382 x 1497 px and ~100 KB (as RGB PNG: 470 KB; inspect's 100 dpi RGB: 760 KB)
WINDOW_DPI = 72


def window_figures(out: StoreLocation, manifest: dict[str, Any], split: str, count: int, seed: int) -> list[Figure]:
    """`count` windows of `split` drawn with `seed` (all when it has fewer), in sample-index order."""
    return [window_figure(manifest, split, sample) for sample in sampled_windows(out, manifest, split, count, seed)]


def window_figure(manifest: dict[str, Any], split: str, sample: dict[str, Any]) -> Figure:
    """One decoded window as the page shows it: inspect's picture, titled with its key and split."""
    left = left_out(manifest, sample)
    shown = without_fields(sample, left)
    png = png_bytes(figure(manifest, shown), WINDOW_DPI)
    return Figure(title=f"{sample['__key__']} ({split}){left_out_note(left)}",
                  alt=window_alt(manifest, split, shown) + left_out_alt(left), png=png)


def window_alt(manifest: dict[str, Any], split: str, sample: dict[str, Any]) -> str:
    """What the window picture shows, for a reader without images: the key, the task text, and per
    field its dimensions and how many of its steps are real and padded."""
    schema = manifest["schema"]
    texts = [v for n, v in sample.items() if isinstance(v, str) and n != "__key__"]
    parts = [f"Window {sample['__key__']} of split {split}" + (f", task: {texts[0]!r}." if texts else ".")]
    images = [n for n, s in schema.items() if s["kind"] == "image" and n in sample]
    if images:
        parts.append(f"Episode image: {', '.join(images)}.")
    for name, spec in schema.items():
        if name not in sample or spec["kind"] != "video":
            continue
        mask = sample[f"{name}_mask"]  # [T]
        drawn = min(MAX_FRAMES, len(mask))
        parts.append(f"Camera {name}: {steps_text(mask)}, {drawn} frames drawn"
                     + (", padded ones crossed out." if not mask.all() else "."))
    series = [f"{name} {dims_text(spec, sample[name].shape[1])}, {steps_text(sample[f'{name}_mask'])}"
              for name, spec in schema.items() if spec["kind"] == "timeseries" and name in sample]
    if series:
        parts.append("Time series over seconds from the anchor (padded steps are gaps, shaded grey): "
                     + "; ".join(series) + ".")
    return " ".join(parts)


def overlay_figures(out: StoreLocation, manifest: dict[str, Any], store: StoreLocation, split: str, count: int,
                    seed: int) -> list[Figure]:
    """For `count` windows drawn with `seed`: each stream's source samples as dots over its exported line.

    The same draw as `window_figures` with the same seed. The store is not fingerprinted here (that
    reads all of its tables): the caller checks it against the manifest's `source.fingerprint`."""
    return overlay_pictures(manifest, store, split, sampled_windows(out, manifest, split, count, seed))


def camera_rows(out: StoreLocation, manifest: dict[str, Any], split: str, seed: int) -> list[CameraRow]:
    """One row per camera field of the schema, with a filmstrip of one window drawn with `seed`."""
    cameras = [(n, s) for n, s in manifest["schema"].items() if s["kind"] == "video"]
    if not cameras:
        return []
    picked = pick_windows(manifest, split, 1, seed) if split in manifest["splits"] else []
    sample = read_windows(out, manifest, split, picked)[0] if picked else None
    video = manifest.get("report", {}).get("video", {})
    rows = []
    for name, spec in cameras:
        _, height, width = (spec.get("shape") or [None, None, None])[:3]
        measured = video.get(name, {})
        strip = filmstrip(manifest, split, sample, name) if sample is not None and name in sample else None
        rows.append(CameraRow(name=name, encoding=str(spec.get("encoding", "")),
                              resolution=f"{width} x {height}" if width and height else "source",
                              rate_hz=float(spec["rate_hz"]), psnr_db_min=measured.get("psnr_db_min"),
                              psnr_frames=int(measured.get("psnr_frames", 0)), filmstrip=strip))
    return rows

