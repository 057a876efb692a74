"""The benchmark harness (scripts/benchlib.py) and the benchmarks page: every bench script takes its common
options from the harness and prints its table; docs/benchmarks.md stays a short page whose links and
anchors resolve (README and docs link into it)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "scripts").glob("bench_*.py"))


@pytest.fixture(scope="module")
def benchlib():
    """scripts/ is not a package: the scripts import benchlib by path, and so does this test."""
    spec = importlib.util.spec_from_file_location("benchlib", ROOT / "scripts" / "benchlib.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["benchlib"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("benchlib", None)


def test_parse_common_options_and_quick_overrides(benchlib, tmp_path):
    parser = benchlib.parser("First line.\n\nMore.", repeats=3, quick={"episodes": 4, "repeats": 1})
    parser.add_argument("--episodes", type=int, default=300)
    args = benchlib.parse(parser, ["--episodes", "50", "--json", str(tmp_path / "x.json")])
    assert (args.episodes, args.repeats, args.quick, args.json) == (50, 3, False, tmp_path / "x.json")
    # --quick wins over values given explicitly: run_benchmarks.sh --quick shrinks the documented commands
    args = benchlib.parse(parser, ["--episodes", "300", "--repeats", "3", "--quick"])
    assert (args.episodes, args.repeats, args.quick) == (4, 1, True)
    assert parser.description == "First line."


def test_timed_runs_repeats_and_reports_best_and_median(benchlib):
    calls = []
    timing = benchlib.timed(lambda: calls.append(1), 5)
    assert len(calls) == 5 and len(timing.runs) == 5
    assert timing.best == min(timing.runs) and timing.best <= timing.median
    assert benchlib.Timing((3.0, 1.0, 2.0)).best == 1.0 and benchlib.Timing((3.0, 1.0, 2.0)).median == 2.0
    assert benchlib.Timing((3.0, 1.0, 2.0)).first == 3.0
    results = iter(range(3))
    traced = benchlib.timed(lambda: (bytearray(4_000_000), next(results))[1], 3, traced=True)
    assert traced.result == 2 and 4.0 <= traced.peak_mb < 5.0  # the last run's result; the 4 MB allocation
    assert benchlib.timed(lambda: bytearray(4_000_000), 1).peak_bytes == 0  # untraced


def test_throughput_counts_whole_passes_for_at_least_min_s(benchlib):
    passes = []

    def one_pass() -> int:
        passes.append(1)
        time.sleep(0.01)
        return 7

    rate = benchlib.throughput(one_pass, 0.05)
    assert len(passes) >= 5 and rate <= 7 * len(passes) / 0.05  # whole passes until >= min_s
    assert abs(rate - 7 / 0.01) < 7 / 0.01  # ~700 items/s, sleep-bound


def test_report_table_ratios_and_json(benchlib, tmp_path, capsys):
    args = benchlib.parse(benchlib.parser(None, repeats=2), ["--json", str(tmp_path / "out" / "r.json")])
    report = benchlib.Report("bench_x", args)
    report.add("ours (vs theirs)", 250.0, "samples/s", baseline=100.0, target=">= 2x")
    report.add("faster (vs old)", 0.5, "s", baseline=2.0, ratio=4.0, target="ratio = x faster")
    report.add("alone", 12345.6, "B")
    report.finish()
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"# bench_x: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ, load \d+\.\d \(\d+ CPUs\), best of 2", out[0])
    table = out[out.index("== bench_x") + 1:]
    assert table[0].split() == ["figure", "ours", "baseline", "ratio", "target"]
    assert table[1].split() == ["ours", "(vs", "theirs)", "250", "samples/s", "100", "samples/s", "2.50x", ">=", "2x"]
    assert table[2].split() == ["faster", "(vs", "old)", "0.5", "s", "2", "s", "4.00x", "ratio", "=", "x", "faster"]
    assert table[3].split() == ["alone", "12,346", "B"]
    assert re.fullmatch(r"# bench_x: done, load \d+\.\d \(\d+ CPUs\)", table[4])
    run = json.loads((tmp_path / "out" / "r.json").read_text())
    assert (run["script"], run["repeats"], run["quick"]) == ("bench_x", 2, False)
    assert run["figures"] == [
        {"name": "ours (vs theirs)", "value": 250.0, "unit": "samples/s", "baseline": 100.0, "ratio": 2.5,
         "target": ">= 2x"},
        {"name": "faster (vs old)", "value": 0.5, "unit": "s", "baseline": 2.0, "ratio": 4.0,
         "target": "ratio = x faster"},
        {"name": "alone", "value": 12345.6, "unit": "B", "baseline": None, "ratio": None, "target": ""}]
    other = dict(run, script="bench_y", quick=True, figures=run["figures"][2:])
    (tmp_path / "y.json").write_text(json.dumps(other))
    benchlib.summary([tmp_path / "out" / "r.json", tmp_path / "y.json"])
    summary = capsys.readouterr().out.splitlines()
    assert summary[0] == f"# bench_x: {run['started']}, {run['load_start']} -> {run['load_end']}, best of 2"
    assert summary[1] == f"# bench_y: {run['started']}, {run['load_start']} -> {run['load_end']}, best of 2, --quick"
    assert summary[2:4] == ["== summary", table[0]]
    assert [line.split()[:2] for line in summary[4:]] == [["x:", "ours"], ["x:", "faster"], ["x:", "alone"],
                                                         ["y:", "alone"]]
    assert summary[6].split() == ["x:", *table[3].split()]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_bench_script_uses_the_harness(script):
    """One harness, not 18 loops: common options from benchlib, no load print or parser of its own, and
    the figures end in benchlib's table (run_benchmarks.sh passes --json to every one)."""
    source = script.read_text()
    assert "benchlib.parser(__doc__" in source and "benchlib.parse(" in source
    assert "benchlib.Report(" in source and "report.finish()" in source
    assert "argparse.ArgumentParser(" not in source and "getloadavg" not in source
    assert f"run {script.stem} " in (ROOT / "scripts" / "run_benchmarks.sh").read_text()


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", markdown, flags=re.M)}


def test_benchmarks_page_is_short_and_its_links_resolve():
    page = ROOT / "docs" / "benchmarks.md"
    assert page.stat().st_size <= 30_000
    text = page.read_text()
    for script in SCRIPTS:  # every benchmark has its row on the page
        assert f"scripts/{script.name}" in text, script.name
    anchors = _anchors(text)
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for anchor in re.findall(r"benchmarks\.md#([\w-]+)", doc.read_text()):
            assert anchor in anchors, (doc.name, anchor)
    for doc in [page, *sorted((ROOT / "docs" / "benchmark-runs").glob("*.md"))]:
        for target in re.findall(r"\]\((?!https?:)([^)#]+)(?:#[^)]*)?\)", doc.read_text()):
            assert (doc.parent / target).exists(), (doc.name, target)
