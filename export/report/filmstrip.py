"""A camera's filmstrip for the report's cameras section: the frames of one window in a row, small.

Frames are picked as inspect's picture picks them (up to `MAX_FRAMES`, evenly spaced) and padded
ones are crossed out in red the same way, so the strip reads like the window pictures above it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from robowds.export.report.parts import Figure
from robowds.export.report.png import png_bytes, pyplot
from robowds.export.report.window_figure import MAX_FRAMES

THUMB_INCHES = 1.2  # a frame's width: 86 px at FILM_DPI, a thumbnail
FILM_DPI = 72
TITLE_INCHES = 0.25  # the row of "+0.30 s" labels above the frames


def frame_picks(steps: int) -> np.ndarray:
    """The steps of a `steps`-frame window drawn: up to MAX_FRAMES, evenly spaced ([k] int)."""
    return np.unique(np.linspace(0, steps - 1, min(MAX_FRAMES, steps)).round().astype(int))


def filmstrip(manifest: dict[str, Any], split: str, sample: dict[str, Any], name: str) -> Figure:
    """The frames of camera `name` in the decoded window `sample`, left to right, with their seconds
    from the anchor; padded frames crossed out. The figure is sized to the frames' aspect ratio."""
    plt = pyplot()
    spec = manifest["schema"][name]
    frames, mask = sample[name], sample[f"{name}_mask"]  # [T, H, W, 3], [T]
    picks = frame_picks(len(frames))
    height, width = frames.shape[1:3]
    thumb_h = THUMB_INCHES * height / width
    fig = plt.figure(figsize=(THUMB_INCHES * len(picks), thumb_h + TITLE_INCHES))
    times = spec.get("offset_s", 0.0) + picks / spec["rate_hz"]  # [k] seconds from the anchor
    for c, (step, when) in enumerate(zip(picks.tolist(), times.tolist())):
        # axes in figure fractions: one frame per column, the labels' strip above
        ax = fig.add_axes((c / len(picks), 0.0, 1.0 / len(picks), thumb_h / (thumb_h + TITLE_INCHES)))
        ax.imshow(frames[step])
        ax.set_xticks([]), ax.set_yticks([])
        ax.set_title(f"{when:+.2f} s", fontsize=7, pad=2)
        if not mask[step]:
            ax.plot([0, width - 1], [0, height - 1], color="red", lw=1.5)
            ax.plot([0, width - 1], [height - 1, 0], color="red", lw=1.5)
    padded = [f"{t:+.2f} s" for s, t in zip(picks.tolist(), times.tolist()) if not mask[s]]
    alt = (f"Camera {name}: {len(picks)} of the {len(frames)} frames of window {sample['__key__']} (split {split}), "
           f"{width} x {height} px, from {times[0]:+.2f} s to {times[-1]:+.2f} s after the anchor"
           + (f"; padded (crossed out): {', '.join(padded)}." if padded else "; every frame real."))
    return Figure(title=f"{name}: {sample['__key__']} ({split})", alt=alt, png=png_bytes(fig, FILM_DPI))
