"""The page's per-field section: what the schema says, source rates, masking, gaps, missing streams,
and the statistics table with one histogram per dimension.

Histograms are tiny inline SVGs of hand-written rects (~1 KB each) rather than matplotlib PNGs:
a page shows dozens to hundreds of dimensions, and a PNG each (~15-25 KB base64) would weigh MBs
and take seconds to draw; an SVG also scales and carries its own <title> for screen readers.
"""

from __future__ import annotations

from robowds.export.report.histogram import Histogram
from robowds.export.report.html import esc, key_values, num, table
from robowds.export.report.model import DimRow, FieldSection, StatsTable

FOLD_DIMS = 12  # dimensions shown before the rest is folded into a <details>
SVG_W, SVG_H = 150, 36
STAT_COLUMNS = ("count", "mean", "std", "min", "max", "q01", "q99")


def histogram_svg(h: Histogram, label: str) -> str:
    """One histogram as an inline SVG: a rect per non-empty bin, heights relative to the fullest bin."""
    top = int(h.counts.max()) if len(h.counts) else 0
    width = SVG_W / len(h.counts)
    rects = []
    for i, c in enumerate(h.counts.tolist()):
        if c:
            height = max(1.0, SVG_H * c / top)
            rects.append(f'<rect x="{i * width:.1f}" y="{SVG_H - height:.1f}" width="{width:.1f}" '
                         f'height="{height:.1f}"/>')
    clipped = [side for side, cut in (("below", h.clipped_low), ("above", h.clipped_high)) if cut]
    note = f"; values {' and '.join(clipped)} the range counted in the end bins" if clipped else ""
    text = (f"histogram of {label}: {len(h.counts)} bins from {num(float(h.edges[0]))} to {num(float(h.edges[-1]))}, "
            f"fullest bin {top:,}{note}")
    return (f'<svg class="h" role="img" aria-label="{esc(text)}" '
            f'width="{SVG_W}" height="{SVG_H}" viewBox="0 0 {SVG_W} {SVG_H}"><title>{esc(text)}</title>'
            + "".join(rects) + "</svg>")


def _stats_rows(key: str, dims: list[DimRow]) -> list[list[str]]:
    rows = []
    for d in dims:
        cells = [esc(d.name)] + [num(getattr(d, c)) for c in STAT_COLUMNS]
        cells.append(histogram_svg(d.histogram, f"{key} {d.name}") if d.histogram is not None else "\u2013")
        rows.append(cells)
    return rows


def stats_html(stats: StatsTable) -> str:
    """The statistics of one key; past FOLD_DIMS dimensions the rest is folded."""
    header = ["dimension", *STAT_COLUMNS, "histogram"]
    rows = _stats_rows(stats.key, stats.dims)
    caption = f"statistics of {esc(stats.key)} over valid steps"
    head = table(header, rows[:FOLD_DIMS], caption=caption, attrs=' class="stats"')
    if len(rows) <= FOLD_DIMS:
        return head
    rest = table(header, rows[FOLD_DIMS:], caption=caption + f", dimensions {FOLD_DIMS + 1} to {len(rows)}",
                 attrs=' class="stats"')
    return head + f"<details><summary>{len(rows) - FOLD_DIMS} more dimensions</summary>{rest}</details>"


def field_html(f: FieldSection, split: str, facts_recorded: bool) -> str:
    """One field's h3 block."""
    unrecorded = "not recorded by this export"
    pairs = [("kind", esc(f.kind)), ("dtype", esc(f.dtype)),
             ("shape", esc(" x ".join(str(s) for s in f.shape)) if f.shape else "\u2013")]
    if f.names:
        pairs.append(("names", esc(", ".join(f.names))))
    if f.units:
        pairs.append(("units", esc(f.units)))
    pairs += [(esc(k), esc(v)) for k, v in f.settings.items() if v is not None and not isinstance(v, (dict, list))]
    if f.kind in ("timeseries", "video"):
        if f.source_rate is not None:
            r = f.source_rate
            rate = f"{num(r.min, 4)} / {num(r.median, 4)} / {num(r.max, 4)} Hz over {r.episodes:,} episodes"
        else:
            rate = unrecorded if not facts_recorded else "no episode has the stream"
        pairs.append(("source rate min / median / max", rate))
        pairs.append(("masked fraction", num(f.masked_fraction, 4) if f.masked_fraction is not None else "\u2013"))
        pairs.append(("gaps", unrecorded if f.gaps is None else
                      f"{f.gaps:,} intervals longer than the max gap, in {f.episodes_with_gaps:,} episodes"))
        if f.missing is None:
            missing = unrecorded
        else:
            missing = f"{f.missing:,}"
            if f.missing_ids:
                more = ", ..." if f.missing > len(f.missing_ids) else ""
                missing += " (" + esc(", ".join(f.missing_ids)) + more + ")"
        pairs.append(("episodes missing the stream", missing))
    body = key_values(pairs)
    for stats in f.stats:
        body += stats_html(stats)
    if not f.stats and f.kind == "timeseries":
        body += f'<p class="note">No statistics for split {esc(split)} (it has no valid step of this field).</p>'
    return f'<section id="field-{esc(f.name)}"><h3>{esc(f.name)}</h3>{body}</section>'
