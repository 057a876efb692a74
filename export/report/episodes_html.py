"""The page's per-episode section: a plain table (sortable and filterable by the page's inline
script, readable without it) of a bounded set of rows, and a summary of every episode.

Each row's `data-status` lists what the status filter matches (exported / rejected / warned); numeric
cells carry `data-v` so the script sorts them as numbers (an empty one sorts last).
"""

from __future__ import annotations

from robowds.export.report.html import esc, num
from robowds.export.report.model import FIRST_ROWS, FLAGGED_ROWS, EpisodeRow, EpisodeTable


def _row(r: EpisodeRow) -> str:
    status = ["exported" if r.exported else "rejected"] + (["warned"] if r.warnings else [])
    notes = ([f'<span class="bad">{esc(r.reason)}</span>'] if r.reason else []) + [esc(w) for w in r.warnings]
    windows = "" if r.windows is None else str(r.windows)
    duration = "" if r.duration_s is None else f"{r.duration_s:.6g}"
    return (f'<tr data-status="{" ".join(status)}"><th scope="row">{esc(r.episode_id)}</th><td>{esc(r.split)}</td>'
            f'<td>{status[0]}</td><td class="n" data-v="{windows}">{num(r.windows)}</td>'
            f'<td class="n" data-v="{duration}">{num(r.duration_s, 4)}</td><td>{"<br>".join(notes)}</td></tr>')


def episodes_html(t: EpisodeTable) -> str:
    """The section's body (its h2 is the page's)."""
    parts = [f"<p>{t.total:,} episodes considered: {t.exported:,} exported, {t.rejected:,} rejected"
             + ("" if t.warned is None else f", {t.warned:,} with warnings") + ".</p>"]
    if t.durations is not None:
        d = t.durations
        parts.append("<p>Duration of the exported episodes (s): "
                     + ", ".join(f"{k} {num(v, 4)}" for k, v in d.items()) + ".</p>")
    if t.omitted:
        windows = "" if t.omitted_windows is None else f" ({t.omitted_windows:,} windows)"
        parts.append(f'<p class="note">The table lists {len(t.rows):,} of the {t.total:,} episodes: the first '
                     f"{FIRST_ROWS:,} by id, then rejected or warned ones up to {FLAGGED_ROWS:,} more, to keep the "
                     f"page small. The other {t.omitted:,} episodes{windows} are counted above but not listed; "
                     "the export's episodes.msgpack has them all.</p>")
    if t.unrecorded:
        parts.append('<p class="note">Not recorded by this export (made before robowds kept per-episode facts), '
                     "so left empty here and in the fields: " + esc(", ".join(t.unrecorded)) + ".</p>")
    head = "".join(f'<th scope="col">{h}</th>' for h in ("episode", "split", "status", "windows", "duration (s)",
                                                           "reason / warnings"))
    body = "\n".join(_row(r) for r in t.rows)
    parts.append(f'<table id="episode-table"><caption>episodes, in id order (the column headers sort when scripts '
                 f"run)</caption><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>")
    return "".join(parts)
