"""`robowds validate`: everything wrong with a store, before an export trips over it.

Structural checks come from `open_store`; this module adds one pass over every episode's data: the
same loading and cleaning code the export runs, so what validate accepts the export accepts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robowds.export.core.extent import ExtentError, episode_extent, segment_span
from robowds.export.core.plausible import MAX_EPISODE_S, extent_problem, period_problem
from robowds.export.core.precision import PrecisionLoss, float32_loss, loss_fix, loss_text, worst
from robowds.export.core.resample import StreamError, clean_stream
from robowds.export.media.frames import MISSING_FRAMES_LIMIT, VideoError, VideoReadError, probe_video
from robowds.export.progress import progress_bar
from robowds.export.store.declarations import Problem
from robowds.export.store.episodes import EpisodeData, EpisodeLoader
from robowds.export.store.location import StoreFile, StoreLocation
from robowds.export.store.media_paths import MediaPathError, media_hint
from robowds.export.store.row_stream import read_order
from robowds.export.store.schema import StoreSchema, open_store

FPS_TOLERANCE = 0.01  # declared vs measured frame rate, relative
RATE_SPREAD = 0.01  # a field's rates over episodes differing by more than this (relative): shown as a spread
PROBLEMS_PER_EPISODE = 20  # listed per episode by `render`; the rest are counted

REPAIR_TEXT = {"nonfinite_time": "rows with a non-finite time (dropped)",
               "nan_rows": "rows with NaN values (treated as missing)",
               "unsorted": "timestamps out of order (will be sorted)",
               "duplicate_time": "duplicated timestamps (last row kept)",
               "zero_quaternion": "zero quaternions (dropped)"}


@dataclass
class StoreReport:
    schema: StoreSchema
    rates: dict[str, dict[str, float]] = field(default_factory=dict)  # field -> episode -> median rate (Hz)
    durations: dict[str, float] = field(default_factory=dict)  # episode -> seconds
    problems: list[Problem] = field(default_factory=list)
    # field -> (worst episode, its loss) and the count of episodes whose values float32 cannot tell apart
    float32_losses: dict[str, tuple[str, PrecisionLoss]] = field(default_factory=dict)
    float32_counts: dict[str, int] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)  # field -> episodes that did not record it

    def add_float32_loss(self, name: str, episode: str, loss: PrecisionLoss) -> None:
        """Keeps the worst episode; of equal ones the first by id, in whatever order episodes come."""
        kept = self.float32_losses.get(name)
        if kept is not None and episode < kept[0]:
            self.float32_losses[name] = worst((episode, loss), kept)  # the earlier id first: it wins a tie
        else:
            self.float32_losses[name] = worst(kept, (episode, loss))
        self.float32_counts[name] = self.float32_counts.get(name, 0) + 1

    @property
    def exportable(self) -> bool:
        return not any(p.severity == "error" for p in self.problems)

    def rate_text(self, name: str) -> str:
        """The rate column: the median over episodes, or min/median/max where the episodes disagree (a
        mean or median alone hides a sensor recorded at 49.65 Hz on one device and 19.7 Hz on another)."""
        rates = np.array(list(self.rates.get(name, {}).values()))  # [E]
        if not len(rates):
            return "-"
        low, mid, high = rates.min(), np.median(rates), rates.max()
        if high - low > RATE_SPREAD * mid:
            return f"{low:.2f}/{mid:.2f}/{high:.2f}"
        return f"{mid:.2f}"

    def to_json(self) -> dict[str, Any]:
        """What `validate --json` prints: the verdict, per field its schema and rates, durations and every
        problem (unbounded: a pipeline filters them itself)."""
        s = self.schema
        fields = {name: {"table": f.table, "kind": f.kind, "dtype": f.value_dtype, "interpolation": f.interpolation,
                         "declared": f.declared,
                         "rate_hz": {ep: round(hz, 6) for ep, hz in sorted(self.rates.get(name, {}).items())}}
                  for name, f in sorted(s.fields.items())}
        return {"store": str(s.root), "exportable": self.exportable, "episodes": len(s.episode_ids),
                "fields": fields, "durations_s": {ep: round(sec, 6) for ep, sec in sorted(self.durations.items())},
                "problems": [{"severity": p.severity, "episode": p.episode, "field": p.field, "message": p.message,
                              "hint": p.hint} for p in self.problems],
                "errors": sum(p.severity == "error" for p in self.problems),
                "warnings": sum(p.severity == "warning" for p in self.problems)}

    def render(self, verbose: bool = False) -> str:
        s = self.schema
        lines = [f"store {s.root}: {len(s.episode_ids)} episodes, {len(s.tables)} tables, {len(s.fields)} fields"]
        rates = {name: self.rate_text(name) for name in s.fields}
        width = max([10, *map(len, rates.values())])
        lines.append(f"  {'field':<16} {'table':<22} {'kind':<10} {'type':<8} {'interp':<8} {'rate (Hz)':>{width}}  source")
        for name, f in sorted(s.fields.items()):
            lines.append(f"  {name:<16} {f.table:<22} {f.kind:<10} {(f.value_dtype or '-'):<8} "
                         f"{(f.interpolation or '-'):<8} {rates[name]:>{width}}  {'declared' if f.declared else 'inferred'}")
        for name in sorted(n for n, text in rates.items() if "/" in text):
            by_episode = self.rates[name]
            low, high = min(by_episode, key=by_episode.get), max(by_episode, key=by_episode.get)
            lines.append(f"  rate of {name!r} differs across episodes (min/median/max above): "
                         f"{by_episode[low]:.2f} Hz in episode {low!r}, {by_episode[high]:.2f} Hz in episode {high!r}")
        if self.durations:
            d = np.array(list(self.durations.values()))
            lines.append(f"  durations: min {d.min():.2f} s, median {np.median(d):.2f} s, max {d.max():.2f} s, "
                         f"total {d.sum():.1f} s")
            if verbose:
                lines += [f"    {ep}: {sec:.3f} s" for ep, sec in sorted(self.durations.items())]
        errors = [p for p in self.problems if p.severity == "error"]
        warnings = [p for p in self.problems if p.severity == "warning"]
        lines += _bounded(errors + warnings)
        verdict = "exportable" if self.exportable else "NOT exportable"
        lines.append(f"{verdict}: {len(errors)} error(s), {len(warnings)} warning(s)")
        return "\n".join(lines)


def _bounded(problems: list[Problem]) -> list[str]:
    """One line per problem, at most `PROBLEMS_PER_EPISODE` per episode (errors come first), then one
    line counting the episode's rest, right after its last listed one."""
    per_episode: dict[str, list[Problem]] = {}
    for p in problems:
        if p.episode is not None:
            per_episode.setdefault(p.episode, []).append(p)
    lines, shown = [], dict.fromkeys(per_episode, 0)
    for p in problems:
        if p.episode is None:
            lines.append(f"  {p}")
            continue
        shown[p.episode] += 1
        if shown[p.episode] <= PROBLEMS_PER_EPISODE:
            lines.append(f"  {p}")
        if shown[p.episode] == PROBLEMS_PER_EPISODE and len(per_episode[p.episode]) > PROBLEMS_PER_EPISODE:
            rest = per_episode[p.episode][PROBLEMS_PER_EPISODE:]
            errors = sum(r.severity == "error" for r in rest)
            lines.append(f"  ... and {len(rest)} more problem(s) of episode {p.episode!r} "
                         f"({errors} error(s), {len(rest) - errors} warning(s))")
    return lines


def validate_store(root: Path | StoreLocation, progress: bool = False, max_episode_s: float = MAX_EPISODE_S) -> StoreReport:
    """`max_episode_s`: longer episodes are errors, as in the export (config `max_episode_s`).

    Every problem of every episode is collected, not only an episode's first. With structural problems
    (from `open_store`) the data pass still runs over the fields they do not name, so their rates and
    data problems are shown too; the episode extents are then not checked (the clock or `start_s` /
    `end_s` may be among the broken parts)."""
    schema = open_store(root)
    report = StoreReport(schema, problems=list(schema.problems))
    broken_fields = {p.field for p in schema.errors if p.field is not None}
    loader = EpisodeLoader(schema, [name for name in schema.fields if name not in broken_fields])
    # read in the tables' row order (each row group streamed forward once: row_stream.py), reported
    # in episode id order: each episode's problems are set aside until then
    episodes = loader.load_all(read_order(schema, schema.episode_ids))
    found: dict[str, list[Problem]] = {}
    for data, errors in progress_bar(episodes, total=len(schema.episode_ids), desc="validate", unit="ep",
                             disable=not progress):
        before = len(report.problems)
        for error in errors:
            report.problems.append(Problem("error", error.reason, episode=error.episode_id, field=error.field,
                                           hint=error.hint))
        timed = any(schema.fields[e.field].kind in ("timeseries", "video") for e in errors if e.field)
        _check_episode(schema, data, report, max_episode_s, extent=not (timed or schema.errors))
        found[data.episode_id] = report.problems[before:]
        del report.problems[before:]
    for ep in schema.episode_ids:
        report.problems += found.pop(ep, [])
    for name, count in sorted(report.missing.items()):
        if count == len(schema.episode_ids):  # a field recorded nowhere has no samples and no width
            report.problems.append(Problem("error", "not recorded in any episode (every cell is null or empty)",
                                           field=name, hint="record it in at least one episode, or remove the "
                                                            "column (the export can also leave it out with exclude)"))
    for name, (ep, loss) in sorted(report.float32_losses.items()):  # one warning per field, not per episode
        report.problems.append(Problem("warning", "stored as float32 (the export's default float_dtype), "
                                       + loss_text(loss, ep, report.float32_counts[name]),
                                       field=name, hint=loss_fix(name)))
    return report


def _check_episode(schema: StoreSchema, data: EpisodeData, report: StoreReport,
                   max_episode_s: float = MAX_EPISODE_S, extent: bool = True) -> None:
    """`extent`: check the episode's extent (False when a stream or camera it depends on failed to load)."""
    ep = data.episode_id
    series: dict[str, tuple[float, float]] = {}  # field -> first and last cleaned sample time
    broken = not extent
    for name in sorted(data.missing):
        if name == schema.clock:
            report.problems.append(Problem("error", "the declared clock stream is missing in this episode", ep, name,
                                           hint="record it, give the episode start_s/end_s, or remove `clock` "
                                                "from store.yaml"))
            broken = True
        else:
            report.problems.append(Problem("warning", "not recorded in this episode (a null or empty cell): its "
                                           "windows carry the field as zeros with an all-false mask", ep, name))
        report.missing[name] = report.missing.get(name, 0) + 1
    for name, raw in data.streams.items():
        spec = schema.fields[name]
        try:
            stream = clean_stream(raw, spec.interpolation or "linear")
        except StreamError as exc:
            report.problems.append(Problem("error", str(exc), ep, name, hint=exc.hint))
            broken = True
            continue
        for kind, count in stream.repairs.as_dict().items():
            if count:
                report.problems.append(Problem("warning", f"{count} {REPAIR_TEXT[kind]}", ep, name))
        report.rates.setdefault(name, {})[ep] = 1.0 / stream.median_period
        if spec.interpolation in ("linear", "slerp") or np.dtype(spec.value_dtype or "float64").kind == "f":
            loss = float32_loss(stream.values)  # [T, N]: the export writes these as float32 by default
            if loss is not None:
                report.add_float32_loss(name, ep, loss)
        period = period_problem(stream.median_period)
        if period is not None:
            report.problems.append(Problem("error", period.message, ep, name, hint=period.hint))
        series[name] = (float(stream.times[0]), float(stream.times[-1]))
    cameras = []
    for name, video in data.videos.items():
        try:
            path = schema.media_path(str(video.get("path")))
        except MediaPathError as exc:
            report.problems.append(Problem("error", str(exc), ep, name, hint=exc.hint))
            continue
        try:
            found = path.is_file()
        except OSError as exc:  # a store in object storage: access denied, connection lost
            report.problems.append(Problem("error", f"video file {video.get('path')!r} cannot be read: {exc}", ep,
                                           name, hint=getattr(exc, "hint", None)))
            continue
        if not found:
            report.problems.append(Problem("error", f"video file {video.get('path')!r} is missing", ep, name,
                                           hint=media_hint(schema.fields[name])))
            continue
        span = _check_video(path, video, ep, name, report)
        if span is not None:
            cameras.append(span)
    if broken:
        return  # the extent would be taken from the streams that happen to be readable
    try:
        start, end = episode_extent(data.start_s, data.end_s, series, schema.clock, cameras)
    except ExtentError as exc:
        report.problems.append(Problem("error", str(exc), ep))
        return
    report.durations[ep] = end - start
    implausible = extent_problem(start, end, list(series.values()) or cameras, max_episode_s)
    if implausible is not None:
        report.problems.append(Problem("error", implausible.message, ep, hint=implausible.hint))


def _check_video(path: Path | StoreFile, video: dict, ep: str, name: str, report: StoreReport) -> tuple[float, float] | None:
    """Declared fps against the container's real timestamps, and the segment against the file.

    Returns the episode times of the segment's first and last frame (None if unreadable or empty)."""
    try:
        info = probe_video(path)
    except VideoError as exc:
        hint = exc.hint if isinstance(exc, VideoReadError) else "re-encode it or fix the path"
        report.problems.append(Problem("error", f"video file {video.get('path')!r}: {exc}", ep, name, hint=hint))
        return None
    declared, measured = video.get("fps"), info.measured_fps
    if measured:
        report.rates.setdefault(name, {})[ep] = measured
    if declared and measured and abs(measured - float(declared)) > FPS_TOLERANCE * float(declared):
        report.problems.append(Problem(
            "warning", f"declared fps {float(declared):g}, but the timestamps of {video.get('path')!r} give "
            f"{measured:.3f} fps; frames are chosen by their real timestamps", ep, name,
            hint="fix fps in the store if it is wrong"))
    if info.unreadable_frames:
        share = info.unreadable_frames / info.listed_frames
        report.problems.append(Problem(
            "error" if share > MISSING_FRAMES_LIMIT else "warning",
            f"{video.get('path')!r} lists {info.listed_frames} frames but {info.unreadable_frames} "
            f"({100 * share:.0f}%) cannot be read (a truncated file?); steps that need them are masked", ep, name,
            hint="re-encode or re-download the video"))
    start, end = video.get("start_s"), video.get("end_s")
    first, last = float(info.pts[0]), float(info.pts[-1])
    span = segment_span(info.pts, start, end, video.get("clock_offset_s"))
    if span is None:
        report.problems.append(Problem(
            "error", f"segment [{start}, {end}) s holds no frame of {video.get('path')!r} "
            f"(frames at {first:.6f}-{last:.6f} s)", ep, name, hint="fix start_s / end_s of this video"))
        return None
    # half a frame of slack: the segment of a file's last episode ends one frame after its last frame
    slack = 0.5 / measured if measured else 0.0
    period = 1.0 / measured if measured else 0.0
    if (start is not None and start < first - slack) or (end is not None and end > last + period + slack):
        report.problems.append(Problem(
            "warning", f"segment [{start}, {end}) s reaches outside the frames of {video.get('path')!r} "
            f"({first:.3f}-{last:.3f} s); those steps will be masked", ep, name))
    return span
