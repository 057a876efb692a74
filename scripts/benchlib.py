"""The harness every `scripts/bench_*.py` uses, so that each prints its figures the same way and
`make bench-all` ends with one table of all of them.

What it owns (and the scripts do not): the common options (`--repeats`, `--json FILE`, `--quick`), the
load-average line at the start and end of a run (figures from a loaded machine are read as ratios),
best/median timing over repeats, ratio rows (ours against a baseline measured in the same run), the
table printer, and the JSON of every figure. What each script measures, and against which baseline,
stays in the script.

A script imports it by path: `python scripts/bench_x.py` puts scripts/ first on `sys.path`.
`python scripts/benchlib.py summary FILE...` prints one table of the JSON files scripts wrote.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import tracemalloc
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

TABLE = "{name:<60} {value:>18} {baseline:>18} {ratio:>8}  {target}"


def load() -> str:
    """The 1-minute load average and CPU count: on a shared machine, what every figure is read against."""
    return f"load {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)"


def parser(doc: str | None, *, repeats: int, quick: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    """An ArgumentParser with the common options; `quick` maps the script's own options to the smallest
    values that still run every code path (`--quick`: proves the script works, not a figure)."""
    described = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0],
                                        formatter_class=argparse.RawDescriptionHelpFormatter)
    described.add_argument("--repeats", type=int, default=repeats, help=f"measured repeats (default {repeats})")
    described.add_argument("--json", type=Path, metavar="FILE", help="also write every figure to FILE as JSON")
    described.add_argument("--quick", action="store_true",
                           help="smallest sizes" + (f" ({_quick_text(quick)})" if quick else "")
                           + ", over any given: checks the script runs; its figures mean nothing")
    described.set_defaults(quick_overrides=dict(quick or {}))
    return described


def _quick_text(quick: dict[str, Any]) -> str:
    return ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in quick.items())


def parse(described: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse; with `--quick`, the quick values replace whatever was given, so that `run_benchmarks.sh
    --quick` shrinks the documented commands too (`--episodes 300 --quick` runs the quick size)."""
    args = described.parse_args(argv)
    if args.quick:
        for name, value in args.quick_overrides.items():
            setattr(args, name, value)
    return args


@dataclass(frozen=True)
class Timing:
    """Seconds of `repeats` runs of one thing: best (what the tables report), median (how noisy) and
    first (a cold start); with `traced`, the highest tracemalloc peak of a run; `result`: the last run's."""

    runs: tuple[float, ...]
    peak_bytes: int = 0
    result: Any = None

    @property
    def best(self) -> float:
        return min(self.runs)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def first(self) -> float:
        return self.runs[0]

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / 1e6


def timed(fn: Callable[[], Any], repeats: int, *, traced: bool = False) -> Timing:
    """Wall seconds of `repeats` calls of `fn` (perf_counter around the call alone). `traced`: a
    `gc.collect()` before each call (outside the timing) and tracemalloc's peak during it, which counts
    what Python and numpy allocate and slows allocation-heavy code alike for ours and the baseline."""
    runs, peak, result = [], 0, None
    for _ in range(max(1, repeats)):
        if traced:
            gc.collect()
            tracemalloc.start()
        began = time.perf_counter()
        value = fn()
        runs.append(time.perf_counter() - began)
        result = value  # the previous run's result is released here, outside the timing
        if traced:
            peak = max(peak, tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
    return Timing(tuple(runs), peak, result)


def throughput(one_pass: Callable[[], int], min_s: float) -> float:
    """Items per second over whole passes for at least `min_s` seconds; `one_pass()` runs one pass
    (an epoch) and returns how many items it delivered. Whole passes, so that a pass's start-up (worker
    processes, opening shards) is in the figure as a training loop pays it."""
    count, began = 0, time.perf_counter()
    while True:
        count += one_pass()
        elapsed = time.perf_counter() - began
        if elapsed >= min_s:
            return count / elapsed


@dataclass
class Figure:
    """One published number: `value` of ours, `baseline` (if any) measured in the same run, and
    `ratio` = value / baseline unless the script states its own (e.g. "x faster" = baseline / value)."""

    name: str
    value: float
    unit: str
    baseline: float | None = None
    ratio: float | None = None
    target: str = ""


@dataclass
class Report:
    """The figures of one script run: printed as one table and written to `--json`."""

    script: str
    args: argparse.Namespace
    figures: list[Figure] = field(default_factory=list)
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    load_start: str = field(default_factory=load)

    def __post_init__(self) -> None:
        quick = " (--quick: sizes too small for a figure)" if getattr(self.args, "quick", False) else ""
        print(f"# {self.script}: {self.started}, {self.load_start}, best of {self.args.repeats}{quick}")

    def add(self, name: str, value: float, unit: str, *, baseline: float | None = None,
            ratio: float | None = None, target: str = "") -> Figure:
        """Record one figure; with a baseline and no explicit ratio, ratio = value / baseline."""
        if ratio is None and baseline:
            ratio = value / baseline
        figure = Figure(name, float(value), unit, None if baseline is None else float(baseline),
                        None if ratio is None else float(ratio), target)
        self.figures.append(figure)
        return figure

    def finish(self) -> None:
        """Print the table and the load at the end; write the JSON if asked for."""
        print()
        print_table(self.script, [asdict(f) for f in self.figures])
        load_end = load()
        print(f"# {self.script}: done, {load_end}")
        if self.args.json:
            self.args.json.parent.mkdir(parents=True, exist_ok=True)
            self.args.json.write_text(json.dumps({
                "script": self.script, "started": self.started, "load_start": self.load_start,
                "load_end": load_end, "repeats": self.args.repeats, "quick": bool(getattr(self.args, "quick", False)),
                "figures": [asdict(f) for f in self.figures]}, indent=1) + "\n")


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return ""
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}".rstrip()


def print_table(title: str, figures: list[dict[str, Any]]) -> None:
    """The one table format: figure, ours, baseline (same unit), ratio, target."""
    print(f"== {title}")
    print(TABLE.format(name="figure", value="ours", baseline="baseline", ratio="ratio", target="target"))
    for f in figures:
        ratio = "" if f["ratio"] is None else f"{f['ratio']:.2f}x"
        print(TABLE.format(name=f["name"], value=_number(f["value"], f["unit"]),
                           baseline=_number(f["baseline"], f["unit"]), ratio=ratio, target=f["target"]))


def summary(paths: Sequence[Path]) -> None:
    """One table of every figure in these JSON files (what `make bench-all` ends with): a line per run
    (when, the load), then every figure named by its script."""
    runs = [json.loads(Path(path).read_text()) for path in paths]
    for run in runs:
        quick = ", --quick" if run["quick"] else ""
        print(f"# {run['script']}: {run['started']}, {run['load_start']} -> {run['load_end']}, "
              f"best of {run['repeats']}{quick}")
    print_table("summary", [{**f, "name": f"{run['script'].removeprefix('bench_')}: {f['name']}"}
                            for run in runs for f in run["figures"]])


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "summary":
        raise SystemExit("usage: python scripts/benchlib.py summary FILE.json...")
    summary([Path(p) for p in sys.argv[2:]])
