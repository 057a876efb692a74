"""Small HTML builders the report's sections share: escaping, number formats, tables, the page's
inline style and script. Every text that comes from the data goes through `esc` (html.escape with
quotes), so an episode id or a rejection message like `<b>` shows as text.

The style and script are inline (a `<style>` and a `<script>` in the page) because the page must
open from a file:// URL or a mail attachment with no network: no external stylesheet, font, script
or CSS url(). The script only sorts and filters the episode table; everything is readable without it.
"""

from __future__ import annotations

import base64
import html
import math
from typing import Iterable, Sequence

from robowds.export.report.parts import Figure


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def num(value: float | int | None, digits: int = 6) -> str:
    """A number as the page shows it: integers in full with thousands separators, floats to `digits`
    significant digits; None / NaN as an en dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "\u2013"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return f"{value:.{digits}g}"


def size(n: int | None) -> str:
    if n is None:
        return "\u2013"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n:,} bytes)"
    return f"{n:,} bytes"


def table(header: Sequence[str], rows: Iterable[Sequence[str]], *, caption: str | None = None,
          row_headers: bool = True, attrs: str = "") -> str:
    """A table whose cells are already HTML; the header row's cells are `<th scope="col">`, each row's
    first cell `<th scope="row">` when `row_headers`."""
    head = "".join(f'<th scope="col">{h}</th>' for h in header)
    body = []
    for row in rows:
        cells = [f'<th scope="row">{row[0]}</th>' if row_headers else f"<td>{row[0]}</td>"]
        cells += [f"<td>{c}</td>" for c in row[1:]]
        body.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption>{caption}</caption>" if caption else ""
    return f"<table{attrs}>{cap}<thead><tr>{head}</tr></thead><tbody>\n" + "\n".join(body) + "\n</tbody></table>"


def key_values(pairs: Iterable[tuple[str, str]]) -> str:
    """A two-column table of labels (row headers) and values (already HTML)."""
    rows = "".join(f'<tr><th scope="row">{k}</th><td>{v}</td></tr>' for k, v in pairs)
    return f'<table class="kv"><tbody>{rows}</tbody></table>'


def figure(fig: Figure) -> str:
    """One PNG picture, inline as a data: URL, with its alt text and its title as caption."""
    data = base64.b64encode(fig.png).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{esc(fig.alt)}" title="{esc(fig.title)}">'
            f"<figcaption>{esc(fig.title)}</figcaption></figure>")


STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1200px;
padding:0 1.2em 3em;color:#1b1f24;background:#fff}
h1{font-size:1.6em;margin:.8em 0 .2em}h2{font-size:1.3em;margin-top:2em;border-bottom:1px solid #d0d7de}
h3{font-size:1.08em;margin:1.6em 0 .4em}
nav ul{display:flex;flex-wrap:wrap;gap:.3em 1.2em;padding:0;list-style:none}
table{border-collapse:collapse;margin:.4em 0 .8em;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d0d7de;padding:.15em .5em;text-align:left;vertical-align:top}
thead th{background:#f6f8fa}td.n,th.n,.stats td{text-align:right}
caption{text-align:left;font-weight:600;padding:.2em 0}
details{margin:.4em 0}summary{cursor:pointer}
pre{background:#f6f8fa;padding:.6em;overflow:auto;max-height:30em;font-size:12px}
figure{display:inline-block;margin:.4em .6em .8em 0;vertical-align:top}
figure img{max-width:100%;border:1px solid #d0d7de}figcaption{font-size:12px;color:#57606a}
svg.h{display:block}svg.h rect{fill:#4c78a8}
.note{color:#57606a}.bad{color:#b42318}.warn{color:#9a6700}
#episodes-controls{margin:.4em 0}#episodes-controls input{margin-right:1em}
th button{font:inherit;border:0;background:none;padding:0;cursor:pointer;text-align:left}
"""

# Sorts the episode table by a clicked column (numbers by `data-v`, the rest as text; empty cells last
# either way) and filters its rows by a text box and a status choice. The controls are created here,
# so a reader without JavaScript sees no dead ones. Strict mode; no console output.
SCRIPT = """
"use strict";
(function () {
  var table = document.getElementById("episode-table");
  if (!table) { return; }
  var body = table.tBodies[0];
  var rows = Array.prototype.slice.call(body.rows);
  var box = document.createElement("div");
  box.id = "episodes-controls";
  box.innerHTML = '<label>Filter <input type="search" id="ep-filter" placeholder="id, split, reason"></label>' +
    '<label>Show <select id="ep-status"><option value="">all</option><option value="exported">exported</option>' +
    '<option value="rejected">rejected</option><option value="warned">with warnings</option></select></label>' +
    ' <span id="ep-count" class="note"></span>';
  table.parentNode.insertBefore(box, table);
  var text = document.getElementById("ep-filter");
  var status = document.getElementById("ep-status");
  var count = document.getElementById("ep-count");
  function apply() {
    var q = text.value.toLowerCase();
    var s = status.value;
    var shown = 0;
    rows.forEach(function (r) {
      var ok = (!q || r.textContent.toLowerCase().indexOf(q) >= 0) &&
        (!s || (r.getAttribute("data-status") || "").split(" ").indexOf(s) >= 0);
      r.hidden = !ok;
      if (ok) { shown += 1; }
    });
    count.textContent = shown + " of " + rows.length + " rows shown";
  }
  text.addEventListener("input", apply);
  status.addEventListener("change", apply);
  var heads = table.tHead.rows[0].cells;
  Array.prototype.forEach.call(heads, function (th, col) {
    var button = document.createElement("button");
    button.type = "button";
    button.textContent = th.textContent;
    th.textContent = "";
    th.appendChild(button);
    button.addEventListener("click", function () {
      var up = th.getAttribute("aria-sort") !== "ascending";
      Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", up ? "ascending" : "descending");
      function key(r) {
        var c = r.cells[col];
        var v = c.getAttribute("data-v");
        if (v === null) { return c.textContent; }
        var n = parseFloat(v);
        return isNaN(n) ? null : n;
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        if (x === null || y === null) { return (x === null ? 1 : 0) - (y === null ? 1 : 0); }  // empty: last
        var d = (typeof x === "number" && typeof y === "number") ? (x < y ? -1 : (x > y ? 1 : 0))
          : String(x).localeCompare(String(y));
        return up ? d : -d;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
  apply();
})();
"""
