"""Matplotlib figures to PNG bytes for the page, and the text pieces their alt texts share.

Why one place: every picture of the report is saved the same way (in memory, figure closed even when
saving fails, so a page of 20 pictures never holds 20 figures) and describes its streams the same way.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from robowds.export.errors import UserError

NAMES_LISTED = 8  # dimension names an alt text spells out before "..."


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display), or the UserError that says how to get it."""
    try:
        import matplotlib
    except ImportError as exc:
        raise UserError("the report's pictures need matplotlib", hint="pip install 'robowds[plot]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def png_bytes(fig: Any, dpi: float) -> bytes:
    """The figure as a whole PNG file (`figsize x dpi` pixels, no tight crop, so its width/height ratio
    is the figure's) in 256 colours, then closed.

    Why a palette: a window with camera frames (real photos) and 26-D streams is ~470 KB as RGB PNG at
    72 dpi and ~105 KB quantised (the G1 export), with lines and text that look the same; the page
    holds a dozen such pictures. Quantising (PIL's fast octree) costs ~0.2 s against ~1.8 s drawing.
    The canvas's pixels are taken directly, so the PNG is encoded once."""
    from PIL import Image

    plt = pyplot()
    try:
        fig.set_dpi(dpi)
        fig.canvas.draw()
        rgb = np.asarray(fig.canvas.buffer_rgba())[..., :3]  # [H, W, 3] uint8, a view of the canvas
        palette = Image.fromarray(np.ascontiguousarray(rgb)).quantize(colors=256, method=Image.Quantize.FASTOCTREE)
        buffer = io.BytesIO()
        palette.save(buffer, format="PNG", optimize=True)
        return buffer.getvalue()
    finally:
        plt.close(fig)


def dims_text(spec: dict[str, Any], width: int) -> str:
    """'7 dims (j0, j1, ..., j6)': how many dimensions a field has and their names, shortened."""
    names = [str(n) for n in (spec.get("names") or [])]
    if not names:
        return f"{width} dim{'s' if width != 1 else ''}"
    shown = ", ".join(names if len(names) <= NAMES_LISTED else [*names[:NAMES_LISTED - 1], "...", names[-1]])
    return f"{width} dim{'s' if width != 1 else ''} ({shown})"


def steps_text(mask: Any) -> str:
    """'10 steps: 8 real, 2 padded' (or '10 steps, all real') from a window's mask [T]."""
    real, total = int(mask.sum()), int(mask.size)
    if real == total:
        return f"{total} steps, all real"
    return f"{total} steps: {real} real, {total - real} padded"
