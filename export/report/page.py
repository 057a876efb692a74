"""The report page: one self-contained HTML5 document from the model and the pictures.

Self-contained: the style and script are inline, pictures are `data:` PNGs or inline SVG, and a
Content-Security-Policy meta tag lets the browser load nothing else (no network, no font, no
external script), so the page opens the same from a file:// URL, a mail attachment or a CI artifact.
Structure: h1, then one h2 per section in a fixed order, h3 inside; tables with header cells.
"""

from __future__ import annotations

from robowds.export.report.episodes_html import episodes_html
from robowds.export.report.fields_html import field_html
from robowds.export.report.html import SCRIPT, STYLE, esc, figure, key_values, num, size, table
from robowds.export.report.model import ReportModel, Summary
from robowds.export.report.parts import CameraRow, Figure

REJECTED_ROWS = 200  # rejected episodes listed with their reasons in the summary (all are in the episode table)
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
SECTIONS = (("summary", "Summary"), ("fields", "Fields"), ("episodes", "Episodes"), ("windows", "Windows"),
            ("overlays", "Source samples over the exported lines"), ("cameras", "Cameras"))


def _summary_html(s: Summary, split: str) -> str:
    rejected = len(s.rejected)
    pairs = [("output", esc(s.out)),
             ("store", esc(s.store) if s.store else "not recorded (the manifest keeps its fingerprint; pass --store)"),
             ("store fingerprint", f"<code>{esc(s.fingerprint)}</code>"), ("tool version", esc(s.tool_version)),
             ("generation", num(s.generation)), ("written", esc(s.written_at or "not known")),
             ("episodes", f"{s.episodes_total:,} considered, {s.episodes_exported:,} exported, "
                          + (f'<span class="bad">{rejected:,} rejected</span>' if rejected else "0 rejected")),
             ("windows", _windows_text(s.windows)),
             ("source duration", "\u2013" if s.source_duration_s is None else f"{num(s.source_duration_s)} s"),
             ("output bytes", esc(size(s.output_bytes))), ("source bytes", esc(size(s.source_bytes))),
             ("statistics, windows and cameras of split", esc(split))]
    parts = [key_values(pairs)]
    parts.append(table(["split", "episodes", "windows", "shards", "bytes"],
                       ([esc(r.name), num(r.episodes), num(r.windows), num(r.shards), esc(size(r.bytes))]
                        for r in s.splits), caption="splits"))
    if s.rejected:
        listed = s.rejected[:REJECTED_ROWS]
        parts.append(table(["episode", "field", "reason", "fix"],
                           ([esc(r.episode_id), esc(r.field or "\u2013"), esc(r.message), esc(r.hint or "")]
                            for r in listed), caption="rejected episodes"))
        if len(s.rejected) > len(listed):
            parts.append(f'<p class="note">{len(listed)} of {len(s.rejected):,} rejected episodes listed; the '
                         "manifest's report lists them all.</p>")
    if s.repairs:
        rows = ([esc(field), esc(kind), num(count)] for field, kinds in sorted(s.repairs.items())
                for kind, count in sorted(kinds.items()))
        parts.append(table(["field", "repair", "episodes"], rows, caption="timestamp repairs"))
    parts.append(f"<details><summary>config (resolved, as the manifest records it)</summary>"
                 f"<pre>{esc(s.config_json)}</pre></details>")
    return "".join(parts)


def _windows_text(w: dict[str, int]) -> str:
    """The report's window counts in words (an older manifest may lack some of them)."""
    if "emitted" not in w:
        return "\u2013"
    text = f"{num(w['emitted'])} emitted"
    if "candidates" in w:
        text += f" of {num(w['candidates'])} candidates"
    if w.get("dropped_min_valid"):
        text += f" ({num(w['dropped_min_valid'])} dropped: fewer valid steps than min_valid_fraction)"
    return text


def _figures_html(figs: list[Figure], empty: str) -> str:
    return "".join(figure(f) for f in figs) if figs else f'<p class="note">{esc(empty)}</p>'


def _cameras_html(cameras: list[CameraRow], split: str) -> str:
    if not cameras:
        return '<p class="note">This export has no camera field.</p>'
    rows = []
    for c in cameras:
        psnr = ("not measured" if c.psnr_db_min is None
                else f"{c.psnr_db_min:.2f} dB worst over {c.psnr_frames:,} frames")
        strip = figure(c.filmstrip) if c.filmstrip is not None else f"no window in split {esc(split)}"
        rows.append([esc(c.name), esc(c.encoding), esc(c.resolution), f"{num(c.rate_hz, 4)} Hz", psnr, strip])
    return table(["camera", "encoding", "resolution", "rate", "PSNR against the source", "filmstrip"], rows,
                 caption="cameras")


def render(model: ReportModel, windows: list[Figure], overlays: list[Figure] | None,
           cameras: list[CameraRow]) -> str:
    """The page's text. `overlays` None: no --store was given (the section says how to get it)."""
    s = model.summary
    title = f"robowds report: {s.out}"
    nav = "".join(f'<li><a href="#{key}">{name}</a></li>' for key, name in SECTIONS)
    facts = "episode duration" not in model.episodes.unrecorded
    fields = "".join(field_html(f, model.split, facts) for f in model.fields)
    overlay = ('<p class="note">Run <code>robowds report OUT --store STORE</code> to draw the source samples '
               "of a few windows over their exported lines.</p>" if overlays is None else
               _figures_html(overlays, "No window to draw."))
    bodies = {"summary": _summary_html(s, model.split),
              "fields": f"<p>Statistics of split {esc(model.split)}; histograms from the export's statistics "
                        f"state (no shard read).</p>{fields}",
              "episodes": episodes_html(model.episodes),
              "windows": _figures_html(windows, f"No window drawn from split {model.split} (none asked for with "
                                                f"--windows 0, or the split has none)."),
              "overlays": overlay, "cameras": _cameras_html(cameras, model.split)}
    sections = "\n".join(f'<section id="{key}"><h2>{name}</h2>{bodies[key]}</section>' for key, name in SECTIONS)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{esc(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
            f'<header><h1>{esc(title)}</h1><nav aria-label="sections"><ul>{nav}</ul></nav></header>\n'
            f"<main>\n{sections}\n</main>\n<script>{SCRIPT}</script>\n</body>\n</html>\n")
