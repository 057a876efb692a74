"""One exported window drawn as a picture: `robowds inspect --png` and the report's windows section
draw it with this one function, so the page shows windows exactly as inspect does.

The picture shows the camera frames as a strip (padded frames crossed out in red), every time series
plotted over the window's time axis with the masked (padded) steps shaded, and the task text as title.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from robowds.export.errors import UserError
from robowds.reader.format import mask_field


GROUP = 8  # dimensions per plot: more lines than this are unreadable in one axis, so they get several
MAX_FRAMES = 8  # camera frames drawn per window (evenly spaced when the window has more)
FRAME_INCHES = 2.4  # per frame: ~240 px at the PNG's 100 dpi, enough to see the scene
# time-series plots per report picture. Why a bound: matplotlib's cost is per plot (ticks, legend,
# text: ~0.1-0.2 s each), and the bridge RLDS export's 20 fields make 71 plots: 16 s a window and 21 s
# an overlay (CPU, loaded machine), 4 minutes for the default page. inspect --png draws every field.
MAX_PLOTS = 12


def left_out(manifest: dict[str, Any], sample: dict[str, Any]) -> list[str]:
    """The window's time-series fields a report picture leaves out: in schema order, whole fields are
    drawn while their plots (one per `GROUP` dimensions) fit in `MAX_PLOTS`; the rest are these."""
    left: list[str] = []
    plots = 0
    for name, spec in manifest["schema"].items():
        if spec["kind"] != "timeseries" or name not in sample:
            continue
        need = max(1, -(-sample[name].shape[1] // GROUP))
        if plots + need <= MAX_PLOTS:
            plots += need
        else:
            left.append(name)
    return left


def without_fields(sample: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The sample without these fields' values and masks (what a picture leaves out)."""
    gone = {*names, *(mask_field(n) for n in names)}
    return {k: v for k, v in sample.items() if k not in gone}


def left_out_note(left: list[str]) -> str:
    """The caption's words for fields a report picture leaves out ('' when none)."""
    return (f"; not drawn here: {', '.join(left)} (`robowds inspect OUT --key KEY --png FILE` draws every field)"
            if left else "")


def left_out_alt(left: list[str]) -> str:
    """The alt text's sentence for fields a report picture leaves out ('' when none)."""
    return f" Not drawn here: {', '.join(left)}." if left else ""


def figure(manifest: dict[str, Any], sample: dict[str, Any]) -> Any:
    """The window as a matplotlib Figure: the episode's images, camera frames (padded ones crossed out
    in red), and every time series over seconds from the anchor, in groups of up to `GROUP` dimensions
    labelled with the manifest's `names`. Padded steps are gaps (NaN), never drawn as values, and are
    shaded grey; the y label says how many steps are real."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schema = manifest["schema"]
    cameras = [n for n, s in schema.items() if s["kind"] == "video" and n in sample]
    series = [n for n, s in schema.items() if s["kind"] == "timeseries" and n in sample]
    images = [n for n, s in schema.items() if s["kind"] == "image" and n in sample]  # one per episode
    if not cameras and not series:
        raise UserError("this window has no camera or time-series field to draw",
                        hint="export a camera or time series too (the config's include/exclude) to draw its windows")
    groups = [(name, lo) for name in series for lo in range(0, max(1, sample[name].shape[1]), GROUP)]
    picks = {c: np.unique(np.linspace(0, len(sample[c]) - 1, min(MAX_FRAMES, len(sample[c]))).round().astype(int))
             for c in cameras}
    columns = max([1, len(images), *(len(p) for p in picks.values())])
    frame_rows = len(cameras) + bool(images)
    fig = plt.figure(figsize=(max(10.0, FRAME_INCHES * columns), FRAME_INCHES * frame_rows + 2.2 * len(groups) + 0.8))
    grid = fig.add_gridspec(frame_rows + len(groups), columns,
                            height_ratios=[FRAME_INCHES] * frame_rows + [2.2] * len(groups))
    for c, name in enumerate(images):  # the episode's images first, as they were stored for training
        ax = fig.add_subplot(grid[0, c])
        ax.imshow(sample[name].squeeze(), cmap="gray" if sample[name].shape[-1] == 1 else None)
        ax.set_xticks([]), ax.set_yticks([])
        ax.set_title(f"{name} (episode image)", fontsize=8)
    for r, name in enumerate(cameras, start=bool(images)):
        spec, mask = schema[name], sample[f"{name}_mask"]
        for c, step in enumerate(picks[name]):
            frame = sample[name][step]
            ax = fig.add_subplot(grid[r, c])
            ax.imshow(frame)
            ax.set_xticks([]), ax.set_yticks([])
            when = spec.get("offset_s", 0.0) + step / spec["rate_hz"] if spec.get("rate_hz") else step
            ax.set_title(f"{name} {when:+.2f} s" if c == 0 else f"{when:+.2f} s", fontsize=8)
            if not mask[step]:
                ax.plot([0, frame.shape[1] - 1], [0, frame.shape[0] - 1], color="red", lw=2)
                ax.plot([0, frame.shape[1] - 1], [frame.shape[0] - 1, 0], color="red", lw=2)
    ax = None
    spans = [(schema[n]["offset_s"] - 0.5 / schema[n]["rate_hz"],
              schema[n]["offset_s"] + (len(sample[n]) - 0.5) / schema[n]["rate_hz"]) for n in series]
    xlim = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None  # one time axis for all
    for r, (name, lo) in enumerate(groups, start=frame_rows):
        spec = schema[name]
        values, mask = sample[name], sample[f"{name}_mask"]  # [T, N], [T]
        times = spec["offset_s"] + np.arange(len(values)) / spec["rate_hz"]  # [T] seconds from the anchor
        shown = np.where(mask[:, None], values.astype(np.float64), np.nan)  # [T, N]: padding is a gap
        names = spec.get("names") or [f"{name}[{d}]" for d in range(values.shape[1])]
        ax = fig.add_subplot(grid[r, :])
        for d in range(lo, min(lo + GROUP, values.shape[1])):
            ax.plot(times, shown[:, d], lw=1.2, marker="." if len(times) <= 60 else None, ms=3,
                    label=names[d] if d < len(names) else f"{name}[{d}]")
        for step in np.flatnonzero(~mask):
            ax.axvspan(times[step] - 0.5 / spec["rate_hz"], times[step] + 0.5 / spec["rate_hz"], color="grey",
                       alpha=0.25, lw=0)
        part = f" [{lo}:{min(lo + GROUP, values.shape[1])}]" if values.shape[1] > GROUP else ""
        ax.set_ylabel(f"{name}{part}\n{int(mask.sum())}/{mask.size} real", fontsize=8)
        ax.set_xlim(*xlim)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), borderaxespad=0.2)
    if ax is not None:
        ax.set_xlabel("seconds from the anchor (grey, and gaps in the lines: padded steps)", fontsize=8)
    texts = [v for n, v in sample.items() if isinstance(v, str) and n != "__key__"]
    fig.suptitle(f"{sample['__key__']}: {texts[0] if texts else ''}", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig
