"""Matplotlib figures to PNG bytes for the page, and the text pieces their alt texts share.

Why one place: every picture of the report is saved the same way (in memory, figure closed even when
saving fails, so a page of 20 pictures never holds 20 figures) and describes its streams the same way.
"""

from __future__ import annotations

import io
from typing import Any

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
    is the figure's), then closed."""
    plt = pyplot()
    try:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=dpi)
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
