"""Bounds on an episode's clock and planned output, so a unit mistake is one clear error, not a runaway.

`end_s: 1e7`, or microsecond/nanosecond times stored as float seconds, give extents of months or
centuries; exported on a 10 fps grid they fill the disk with padding. `validate` and the export's map
task run these same checks (one rule), before any window is allocated:

* an episode lasting more than `max_episode_s` (default 24 h) is refused;
* a stream whose median sample period lies outside [1 us, 1 h] is refused (a µs or ns clock read as
  seconds has periods of hours to years);
* an extent far beyond its data (more than `RUNAWAY_FACTOR` x the time its streams cover, plus
  `RUNAWAY_SLACK_S`) is refused: a declared `end_s` off by orders of magnitude;
* at export, an episode whose planned windows (count x bytes per window, from the field schema) would
  take more than `RUNAWAY_BYTES` and `RUNAWAY_RATIO` x its source data is refused with the estimate
  (an episode error); one that would take more than the output disk's free space stops the export
  (`DiskSpaceError`: not an episode error, since `on_bad_episode: skip` must not drop episodes for
  want of disk, and not recorded, so the re-run after freeing space builds it).
"""

from __future__ import annotations

from dataclasses import dataclass

from robowds.export.errors import UserError

MAX_EPISODE_S = 86_400.0  # default bound on one episode's duration (config `max_episode_s`)
MIN_PERIOD_S, MAX_PERIOD_S = 1e-6, 3_600.0  # plausible median sample period of a time series
RUNAWAY_FACTOR = 100.0  # extent vs the time the episode's data covers
RUNAWAY_SLACK_S = 60.0
RUNAWAY_BYTES = 1 << 30  # below this an episode's output is never called a runaway
RUNAWAY_RATIO = 10_000  # planned output bytes vs the episode's source bytes

UNIT_HINT = "check the time unit (ns or us values stored as float seconds?)"


class DiskSpaceError(UserError):
    """The output disk cannot take what the export is about to write; raised in a map task and
    re-raised in the parent (UserError pickles with its hint)."""


@dataclass(frozen=True)
class Implausible:
    """One refused episode property: what is wrong and how to fix it."""

    message: str
    hint: str


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} PB"  # unreachable


def period_problem(median_period: float) -> Implausible | None:
    """A median sample period (s) outside [1 us, 1 h], or None."""
    if MIN_PERIOD_S <= median_period <= MAX_PERIOD_S:
        return None
    return Implausible(f"median sample period is {median_period:.6g} s, outside [{MIN_PERIOD_S:g} s, "
                       f"{MAX_PERIOD_S:g} s]", f"{UNIT_HINT}; store times in seconds, or int64 ns with "
                       "time_unit: ns in store.yaml")


def extent_problem(start: float, end: float, spans: list[tuple[float, float]],
                   max_episode_s: float) -> Implausible | None:
    """An extent [start, end] longer than `max_episode_s`, or far beyond the `spans` ((first, last) of
    each time-series stream, or of each camera segment) its data covers; None if plausible."""
    duration = end - start
    if duration > max_episode_s:
        return Implausible(f"the episode lasts {duration:.6g} s ({start:.6g} .. {end:.6g}), more than "
                           f"max_episode_s = {max_episode_s:g} s",
                           f"check start_s / end_s and {UNIT_HINT}; if episodes really are this long, "
                           "raise max_episode_s")
    if spans:
        covered = max(b for _, b in spans) - min(a for a, _ in spans)
        if duration > RUNAWAY_FACTOR * covered + RUNAWAY_SLACK_S:
            return Implausible(f"the episode's extent is {duration:.6g} s ({start:.6g} .. {end:.6g}) but its "
                               f"data covers only {covered:.6g} s",
                               "fix start_s / end_s (in the same clock and unit as the time series)")
    return None


def _planned(windows: int, bytes_per_window: int) -> str:
    return (f"{windows} windows of at least {human_bytes(bytes_per_window)} each = "
            f"{human_bytes(windows * bytes_per_window)}")


SHRINK = "lower fps, raise stride, or shorten rate_hz / duration_s in the export config"


def size_problem(windows: int, bytes_per_window: int, source_bytes: int) -> Implausible | None:
    """Planned output of one episode (`windows` x at least `bytes_per_window`) far beyond its source
    data (a runaway config or clock), or None."""
    planned = windows * bytes_per_window
    if planned > RUNAWAY_BYTES and planned > RUNAWAY_RATIO * max(1, source_bytes):
        return Implausible(f"would write {_planned(windows, bytes_per_window)} from {human_bytes(source_bytes)} "
                           f"of source data ({planned / max(1, source_bytes):.3g} x its size)",
                           f"{SHRINK}; {UNIT_HINT}")
    return None


def space_problem(windows: int, bytes_per_window: int, free_bytes: int | None) -> Implausible | None:
    """Planned output of one episode against the output disk's free space (None: not checked)."""
    if free_bytes is None or windows * bytes_per_window <= free_bytes:
        return None
    return Implausible(f"would write {_planned(windows, bytes_per_window)}, but the output disk has "
                       f"{human_bytes(free_bytes)} free",
                       f"free disk space and re-run the same command, or choose an output folder on a larger "
                       f"disk; or {SHRINK}")
