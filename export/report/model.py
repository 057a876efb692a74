"""What the report page says, as plain data: gathered from the manifest, the merged statistics'
state (`stats-state.msgpack`), the episodes table (`episodes.msgpack`) and the per-episode facts.
Pure (no I/O, no HTML): `inputs.py` reads the files, `page.py` writes the HTML.

Scale: everything here is bounded by the fields, their dimensions and their buckets, except the
episode table, which keeps at most `FIRST_ROWS` + `FLAGGED_ROWS` rows whatever the number of
episodes and summarises the rest (counts, duration quantiles): at 100k episodes the page stays
~0.5 MB of rows. Selecting the rows is vectorised over the facts' columns (O(episodes) numpy).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from robowds.export.core.stats import FieldStats
from robowds.export.job.episode_facts import EpisodeFacts
from robowds.export.job.side_files import EpisodeEntry
from robowds.export.report.histogram import Histogram, field_histograms

FIRST_ROWS = 1000  # episodes shown in full, the first by id
FLAGGED_ROWS = 1000  # more rows at most: rejected or warned episodes past the first ones
FACT_COLUMNS = ("episode duration", "warnings", "source rate", "gaps")  # what only the facts record


@dataclass(frozen=True)
class Rejected:
    episode_id: str
    field: str | None
    message: str
    hint: str | None


@dataclass(frozen=True)
class SplitRow:
    name: str
    episodes: int
    windows: int
    shards: int
    bytes: int


@dataclass(frozen=True)
class Summary:
    out: str
    store: str | None  # the --store given; the manifest records the store's fingerprint, not its path
    fingerprint: str
    tool_version: str
    generation: int
    written_at: str | None  # the manifest's modification time (UTC), None when the storage does not say
    config_json: str  # the resolved config, indented
    episodes_total: int
    episodes_exported: int
    rejected: list[Rejected]
    splits: list[SplitRow]
    windows: dict[str, int]  # candidates, emitted, dropped_min_valid
    output_bytes: int
    source_bytes: int | None
    source_duration_s: float | None  # summed extent of the exported episodes
    repairs: dict[str, dict[str, int]]  # field -> repair -> count


@dataclass(frozen=True)
class DimRow:
    name: str
    count: int
    mean: float
    std: float
    min: float
    max: float
    q01: float
    q99: float
    histogram: Histogram | None  # None: the export has no statistics state (made before it)


@dataclass(frozen=True)
class StatsTable:
    key: str  # the statistics key: the field, or e.g. `actions.relative`
    dims: list[DimRow]


@dataclass(frozen=True)
class Spread:
    """A per-episode quantity over the episodes that have it."""
    min: float
    median: float
    max: float
    episodes: int


@dataclass(frozen=True)
class FieldSection:
    name: str
    kind: str
    dtype: str
    shape: list[int] | None
    names: list[str]
    units: str | None
    settings: dict[str, Any]  # the schema's other keys (rate_hz, interpolation, encoding, ...)
    source_rate: Spread | None  # None: not recorded (no facts) or no episode has the stream
    stats: list[StatsTable]  # the report's split; empty for fields without statistics (images, text)
    masked_fraction: float | None
    gaps: int | None  # source intervals longer than the max gap, over all episodes; None: not recorded
    episodes_with_gaps: int | None
    missing: int | None  # exported episodes that lack the stream; None: not recorded
    missing_ids: list[str]  # the first of them


@dataclass(frozen=True)
class EpisodeRow:
    episode_id: str
    split: str
    exported: bool
    windows: int | None
    duration_s: float | None
    warnings: list[str]
    reason: str | None  # why it was rejected


@dataclass(frozen=True)
class EpisodeTable:
    rows: list[EpisodeRow]  # in episode-id order
    total: int
    exported: int
    rejected: int
    warned: int | None  # None: warnings not recorded
    omitted: int  # episodes not in `rows`
    durations: dict[str, float] | None  # min / q25 / median / q75 / max over all exported episodes
    omitted_windows: int | None  # windows of the omitted episodes
    unrecorded: list[str] = field(default_factory=list)  # columns this export did not record


@dataclass(frozen=True)
class ReportModel:
    summary: Summary
    split: str  # the split the statistics, windows and cameras are of
    fields: list[FieldSection]
    episodes: EpisodeTable


def build_model(manifest: dict[str, Any], split: str, *, out: str, stats_state: dict[str, dict[str, dict]] | None,
                episodes: dict[str, EpisodeEntry] | None, facts: EpisodeFacts | None, store: str | None = None,
                written_at: str | None = None) -> ReportModel:
    """The whole model. `stats_state`: split -> key -> staged state (None: the export predates it;
    the histograms are then left out); `episodes`: the decoded `episodes.msgpack` (None: predates
    it); `facts`: None when the export did not record them (the columns they hold are named as
    unrecorded)."""
    report = manifest.get("report", {})
    rejected = [Rejected(r["episode_id"], r.get("field"), r.get("message", ""), r.get("hint"))
                for r in report.get("episodes", {}).get("rejected", [])]
    return ReportModel(_summary(manifest, out, store, written_at, rejected), split,
                       _fields(manifest, split, stats_state, facts),
                       episode_table(manifest, episodes, facts, {r.episode_id: r for r in rejected}))


def _summary(manifest: dict[str, Any], out: str, store: str | None, written_at: str | None,
             rejected: list[Rejected]) -> Summary:
    report = manifest.get("report", {})
    counts = report.get("splits", {})
    splits = [SplitRow(name, int(counts.get(name, {}).get("episodes", len(entry.get("episodes", [])))),
                       int(entry.get("samples", 0)), len(entry.get("shards", [])), int(entry.get("bytes", 0)))
              for name, entry in manifest["splits"].items()]
    storage = report.get("storage", {})
    episodes = report.get("episodes", {})
    return Summary(out=out, store=store, fingerprint=manifest.get("source", {}).get("fingerprint", ""),
                   tool_version=str(manifest.get("tool_version", "")), generation=int(manifest.get("generation", 1)),
                   written_at=written_at, config_json=json.dumps(manifest.get("config", {}), indent=1, sort_keys=True),
                   episodes_total=int(episodes.get("total", sum(s.episodes for s in splits) + len(rejected))),
                   episodes_exported=int(episodes.get("exported", sum(s.episodes for s in splits))),
                   rejected=rejected, splits=splits, windows=dict(report.get("windows", {})),
                   output_bytes=int(storage.get("output_bytes", sum(s.bytes for s in splits))),
                   source_bytes=storage.get("source_bytes"), source_duration_s=report.get("duration_s"),
                   repairs=dict(report.get("repairs", {})))


def _fields(manifest: dict[str, Any], split: str, stats_state: dict[str, dict[str, dict]] | None,
            facts: EpisodeFacts | None) -> list[FieldSection]:
    report = manifest.get("report", {})
    stats = manifest.get("stats", {}).get(split, {})
    states = (stats_state or {}).get(split, {})
    missing_report = report.get("missing_streams", {})
    out = []
    for name, schema in manifest["schema"].items():
        if schema.get("kind") == "meta":
            continue
        keys = [k for k in stats if k == name or k.startswith(name + ".")]
        names = list(schema.get("names") or [])
        tables = [StatsTable(k, _dims(stats[k], states.get(k), names if k == name else [])) for k in keys]
        column = facts.fields.index(name) if facts is not None and name in facts.fields else None
        rate = gaps = with_gaps = missing = None
        missing_ids: list[str] = []
        if column is not None:
            exported = facts.exported  # [E]
            rate = _spread(facts.rate_hz[exported, column])
            gaps = int(facts.gaps[exported, column].sum())
            with_gaps = int((facts.gaps[exported, column] > 0).sum())
            lacking = np.flatnonzero(exported & facts.missing[:, column])  # [M]
            missing, missing_ids = len(lacking), [facts.episode_id[i] for i in lacking[:20]]
        elif schema.get("kind") in ("timeseries", "video") and ("missing_streams" in report or name in missing_report):
            entry = missing_report.get(name, {})
            missing, missing_ids = int(entry.get("episodes", 0)), list(entry.get("episode_ids", []))
        settings = {k: v for k, v in schema.items()
                    if k not in ("kind", "dtype", "shape", "names", "units", "member", "mask_member")}
        out.append(FieldSection(name, str(schema.get("kind", "")), str(schema.get("dtype", "")), schema.get("shape"),
                                names, schema.get("units"), settings, rate, tables,
                                report.get("masked_fraction", {}).get(name), gaps, with_gaps, missing, missing_ids))
    return out


def _dims(summary: dict[str, Any], state: dict | None, names: list[str]) -> list[DimRow]:
    """One row per dimension of a statistics key, with its histogram when the state is there."""
    histograms = field_histograms(FieldStats.from_state(state), summary) if state is not None else None
    dims = len(summary["mean"])
    return [DimRow(names[d] if d < len(names) else str(d), int(summary["count"]),
                   *(float(summary[k][d]) for k in ("mean", "std", "min", "max", "q01", "q99")),
                   histograms[d] if histograms is not None else None) for d in range(dims)]


def _spread(values: np.ndarray) -> Spread | None:
    """min / median / max of the finite values (NaN: the episode lacks the stream)."""
    finite = values[np.isfinite(values)]
    if not len(finite):
        return None
    return Spread(float(finite.min()), float(np.median(finite)), float(finite.max()), len(finite))


def _quantiles(values: np.ndarray) -> dict[str, float] | None:
    finite = values[np.isfinite(values)]
    if not len(finite):
        return None
    q = np.quantile(finite, [0.0, 0.25, 0.5, 0.75, 1.0])
    return dict(zip(("min", "q25", "median", "q75", "max"), (float(v) for v in q)))


def episode_table(manifest: dict[str, Any], episodes: dict[str, EpisodeEntry] | None, facts: EpisodeFacts | None,
                  rejected: dict[str, Rejected]) -> EpisodeTable:
    """The first `FIRST_ROWS` episodes by id, then rejected or warned ones up to `FLAGGED_ROWS` more;
    counts and quantiles over all of them."""
    if facts is not None:
        return _facts_table(facts)
    if episodes is not None:
        entries = sorted(episodes.values(), key=lambda e: e.episode_id)
    else:  # an export made before episodes.msgpack: the manifest's split lists and its rejected ones
        entries = sorted([EpisodeEntry(ep, split, None, -1, True) for split, entry in manifest["splits"].items()
                          for ep in entry.get("episodes", [])] +
                         [EpisodeEntry(ep, "", None, 0, False) for ep in rejected], key=lambda e: e.episode_id)
    flagged = [i for i, e in enumerate(entries) if not e.exported]
    chosen = _choose(len(entries), np.asarray(flagged, np.int64))
    rows = [EpisodeRow(e.episode_id, e.split, e.exported, None if e.windows < 0 else e.windows, None, [],
                       None if e.exported else _reason(rejected.get(e.episode_id)))
            for e in (entries[i] for i in chosen)]
    kept = set(chosen.tolist())
    omitted_windows = None if episodes is None else sum(e.windows for i, e in enumerate(entries) if i not in kept)
    unrecorded = list(FACT_COLUMNS) + ([] if episodes is not None else ["windows per episode"])
    return EpisodeTable(rows, len(entries), sum(e.exported for e in entries), len(flagged), None,
                        len(entries) - len(rows), None, omitted_windows, unrecorded)


def _facts_table(facts: EpisodeFacts) -> EpisodeTable:
    warned = np.array([bool(w) for w in facts.warnings], bool)  # [E]
    flagged = np.flatnonzero(~facts.exported | warned)  # [K]
    chosen = _choose(len(facts.episode_id), flagged)
    rows = [EpisodeRow(facts.episode_id[i], facts.split[i], bool(facts.exported[i]), int(facts.windows[i]),
                       None if not np.isfinite(facts.duration_s[i]) else float(facts.duration_s[i]),
                       list(facts.warnings[i]), facts.reason[i]) for i in chosen.tolist()]
    omitted = np.ones(len(facts.episode_id), bool)
    omitted[chosen] = False
    return EpisodeTable(rows, len(facts.episode_id), int(facts.exported.sum()), int((~facts.exported).sum()),
                        int(warned.sum()), int(omitted.sum()), _quantiles(facts.duration_s[facts.exported]),
                        int(facts.windows[omitted].sum()))


def _choose(total: int, flagged: np.ndarray) -> np.ndarray:
    """Row indices to show, ascending: the first FIRST_ROWS, then flagged ones past them up to FLAGGED_ROWS."""
    first = np.arange(min(total, FIRST_ROWS))
    later = flagged[flagged >= FIRST_ROWS][:FLAGGED_ROWS]
    return np.concatenate([first, later]).astype(np.int64)


def _reason(rejected: Rejected | None) -> str | None:
    if rejected is None:
        return None
    return f"{rejected.field}: {rejected.message}" if rejected.field else rejected.message
