"""The report's resampler check (`robowds report --store`): for a few exported windows, each time
series' exported line (valid steps only) with the store's own samples as dots, on one time axis.

A linear field's line passes through the dots, a held field's steps sit on the dot before them: a
person sees at once whether the export resampled what the store holds, at the right times.

Time alignment: the export resamples each stream on times relative to the episode's extent start
`start` (`job/build.py`), step i of a window with anchor k at `start + k / fps + offset_s + i / rate_hz`,
and writes the anchor time `start + k / fps` as meta `t` in the stream clock the loader gives
(seconds; for `time_unit: ns` stores seconds after the loaded streams' first ns sample, which depends
on which streams were loaded, so there `t_ns`, the anchor in the store's own int64 ns, is used). So a
source sample at stream time s is at `s - t` seconds from the anchor, the exported step i at
`offset_s + i / rate_hz`: the axis of the window pictures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from robowds.export.core.resample import StreamError, clean_stream
from robowds.export.errors import EpisodeError, UserError
from robowds.export.report.parts import Figure
from robowds.export.report.png import dims_text, png_bytes, pyplot, steps_text
from robowds.export.report.window_figure import GROUP, left_out, left_out_alt, left_out_note, without_fields
from robowds.export.store.episodes import EpisodeData, EpisodeLoader
from robowds.export.store.location import StoreLocation
from robowds.export.store.schema import open_store

OVERLAY_DPI = 72  # 10 in wide: 720 px, ~2.2 in (158 px) per group of dimensions


@dataclass(frozen=True)
class StreamOverlay:
    """One time-series field of one window, with the source samples around it."""

    name: str
    interpolation: str
    step_times: np.ndarray  # [T] seconds from the anchor of each exported step
    values: np.ndarray  # [T, N] float64: the exported values, NaN at padded steps
    mask: np.ndarray  # [T] bool: the exported mask
    source_times: np.ndarray  # [k] seconds from the anchor: the window's range and one sample either side
    source_values: np.ndarray  # [k, N] float64: the store's samples (as the export cleaned them)


def anchor_time(meta: dict[str, Any], data: EpisodeData) -> float:
    """The window's anchor in the stream clock of `data` as loaded (seconds), from its meta.json."""
    if meta.get("t_ns") is not None and data.time_origin_ns is not None:
        return (int(meta["t_ns"]) - data.time_origin_ns) * 1e-9  # exact int64 difference, then seconds
    return float(meta["t"])


def stream_overlays(manifest: dict[str, Any], sample: dict[str, Any], data: EpisodeData) -> list[StreamOverlay]:
    """Each time series of the decoded window `sample` that the episode `data` recorded, with the
    source samples (cleaned as the export cleans them: non-finite rows dropped, times sorted, repeated
    times' last row kept) whose times fall in the window's range, plus one either side."""
    schema = manifest["schema"]
    anchor = anchor_time(sample["meta"], data)
    out = []
    for name, spec in schema.items():
        if spec["kind"] != "timeseries" or name not in sample or name not in data.streams:
            continue
        try:
            stream = clean_stream(data.streams[name], spec["interpolation"])
        except StreamError as exc:
            raise UserError(f"episode {data.episode_id!r}, field {name!r}: {exc}: the export read this stream",
                            hint="give `--store` the store the export was made from") from exc
        exported, mask = sample[name], sample[f"{name}_mask"]  # [T, N], [T]
        steps = spec["offset_s"] + np.arange(len(exported)) / spec["rate_hz"]  # [T]
        times = stream.times - anchor  # [S] seconds from the anchor
        lo = max(0, int(np.searchsorted(times, steps[0], side="left")) - 1)
        hi = min(len(times), int(np.searchsorted(times, steps[-1], side="right")) + 1)
        out.append(StreamOverlay(name, spec["interpolation"], steps,
                                 np.where(mask[:, None], exported.astype(np.float64), np.nan), mask,
                                 times[lo:hi], stream.values[lo:hi].astype(np.float64)))
    return out


def load_episodes(store: StoreLocation, manifest: dict[str, Any], episode_ids: list[str]) -> dict[str, EpisodeData]:
    """The named episodes' time-series fields of the manifest, read from the store in one pass of
    its tables (`EpisodeLoader`): O(those episodes' rows), not O(store)."""
    schema = open_store(store)
    fields = [n for n, s in manifest["schema"].items()
              if s["kind"] == "timeseries" and n in schema.fields and schema.fields[n].kind == "timeseries"]
    absent = [ep for ep in episode_ids if ep not in schema.episode_ids]
    if absent:
        raise UserError(f"store {store} has no episode {absent[0]!r}, which the export holds",
                        hint="give `--store` the store the export was made from (its manifest's "
                             "source.fingerprint names it)")
    loaded = {}
    for item in EpisodeLoader(schema, fields).load(episode_ids):
        if isinstance(item, EpisodeError):
            raise UserError(f"store {store}: {item}", hint="give `--store` the store the export was made from")
        loaded[item.episode_id] = item
    return loaded


def overlay_pictures(manifest: dict[str, Any], store: StoreLocation, split: str,
                     samples: list[dict[str, Any]]) -> list[Figure]:
    """One overlay picture per decoded window, its source episodes read once for all of them."""
    if not samples:
        return []
    episodes = load_episodes(store, manifest, sorted({s["meta"]["episode_id"] for s in samples}))
    pictures = []
    for s in samples:
        left = left_out(manifest, s)
        overlays = stream_overlays(manifest, without_fields(s, left), episodes[s["meta"]["episode_id"]])
        pictures.append(overlay_figure(manifest, split, s, overlays, left))
    return pictures


def overlay_figure(manifest: dict[str, Any], split: str, sample: dict[str, Any],
                   overlays: list[StreamOverlay], left: list[str]) -> Figure:
    """The picture: one axis per field and group of up to GROUP dimensions, each dimension in one
    colour: the exported line (gaps at padded steps, shaded grey) and the source samples as circles."""
    plt = pyplot()
    schema, key = manifest["schema"], sample["__key__"]
    groups = [(o, lo) for o in overlays for lo in range(0, max(1, o.values.shape[1]), GROUP)]
    height = 2.2 * max(1, len(groups)) + 0.8
    fig = plt.figure(figsize=(10.0, height))
    # fixed margins rather than tight_layout (a third of the drawing time): the y labels' 1 in on the
    # left, the legends' 1.4 in on the right, the title's 0.5 in and the x label's 0.45 in, whatever
    # the number of plots
    fig.subplots_adjust(left=0.1, right=0.86, top=1 - 0.5 / height, bottom=0.45 / height, hspace=0.35)
    times = [t for o in overlays for t in (o.step_times[[0, -1]], o.source_times) if len(t)]
    span = (min(t.min() for t in times), max(t.max() for t in times)) if times else (0.0, 1.0)
    pad = 0.03 * (span[1] - span[0] or 1.0)
    ax = None
    for r, (o, lo) in enumerate(groups):
        ax = fig.add_subplot(len(groups), 1, r + 1)
        names = schema[o.name].get("names") or []
        hi = min(lo + GROUP, o.values.shape[1])
        for k, d in enumerate(range(lo, hi)):
            colour = f"C{k % 10}"
            ax.plot(o.step_times, o.values[:, d], color=colour, lw=1.2, marker=".", ms=3,
                    label=names[d] if d < len(names) else f"{o.name}[{d}]")
            ax.plot(o.source_times, o.source_values[:, d], color=colour, ls="none", marker="o", ms=4, mfc="none",
                    mew=0.9)
        rate = schema[o.name]["rate_hz"]
        for step in np.flatnonzero(~o.mask):
            ax.axvspan(o.step_times[step] - 0.5 / rate, o.step_times[step] + 0.5 / rate, color="grey", alpha=0.25, lw=0)
        part = f" [{lo}:{hi}]" if o.values.shape[1] > GROUP else ""
        ax.set_ylabel(f"{o.name}{part}\n{o.interpolation}, {len(o.source_times)} source", fontsize=8)
        ax.set_xlim(span[0] - pad, span[1] + pad)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), borderaxespad=0.2)
    if ax is not None:
        ax.set_xlabel("seconds from the anchor (lines: exported steps; circles: the store's samples)", fontsize=8)
    episode, t = sample["meta"]["episode_id"], sample["meta"]["t"]
    fig.suptitle(f"{key}: exported vs source ({episode}, anchor t = {t} s)", fontsize=10, y=1 - 0.12 / height)
    described = [f"{o.name} {dims_text(schema[o.name], o.values.shape[1])}, {o.interpolation}, "
                 f"{steps_text(o.mask)}, {len(o.source_times)} source samples" for o in overlays]
    alt = (f"Window {key} of split {split} over its source episode {episode} (anchor at {t} s in the store's "
           "clock): per time series, the exported values as lines (valid steps only) and the store's samples "
           "in and around the window as circles of the same colour, over seconds from the anchor: "
           + ("; ".join(described) if described else "no time series of this window is in the store") + "."
           + left_out_alt(left))
    return Figure(title=f"{key} ({split}): exported vs source{left_out_note(left)}", alt=alt,
                  png=png_bytes(fig, OVERLAY_DPI))
