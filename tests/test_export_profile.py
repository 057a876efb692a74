"""The export's phase profile (export/executors/profile.py): what `scripts/bench_export.py` reads to tell the
serial parent's CPU time from the tasks' and the pool's overhead. Real exports, in-process and with a
real process pool."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from robowds.export.cli.synth import write_synthetic_store
from robowds.export.executors.profile import amdahl_bound
from robowds.export.job.config import load_config
from robowds.export.job.run import run_export

SETS = ["splits.val=0.25", "shard.max_samples=100", "streams.joints.rate_hz=50"]
PHASES = ["plan", "map", "records", "shard plan", "reduce", "pool close", "store check", "manifest"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synth") / "store"
    write_synthetic_store(root, episodes=12, seed=5)
    return root


@pytest.mark.parametrize("workers, map_tasks", [(1, 4), (2, 12)])  # 3 episodes a task, then 1 (12 // (4 x 2))
def test_profile_accounts_for_every_task_and_phase(store: Path, tmp_path: Path, workers: int, map_tasks: int) -> None:
    summary = run_export(store, tmp_path / "out", load_config(None, SETS), workers=workers, progress=False)
    profile = json.loads(json.dumps(summary.profile))  # JSON as it is
    phases = profile["phases"]
    assert list(phases) == PHASES
    assert [phases[p]["tasks"] for p in PHASES] == [0, map_tasks, 0, 0, summary.shards, 0, 0, 0]
    for name, phase in phases.items():
        assert len(phase["task_cpu_each"]) == phase["tasks"], name
        assert math.isclose(sum(phase["task_cpu_each"]), phase["task_cpu_s"], abs_tol=1e-3 * (1 + phase["tasks"]))
        assert phase["parent_cpu_s"] >= 0 and phase["wall_s"] >= 0, name
    assert phases["map"]["task_cpu_s"] > 0 and phases["reduce"]["task_cpu_s"] > 0
    assert math.isclose(profile["parent_cpu_s"], sum(p["parent_cpu_s"] for p in phases.values()), abs_tol=1e-3)
    if workers == 1:  # tasks ran in this process: none of their CPU time is counted as the parent's
        assert profile["worker_overhead_cpu_s"] == 0.0
        assert phases["map"]["parent_cpu_s"] < phases["map"]["task_cpu_s"]
    else:  # two fresh interpreters imported the job's modules before their first task
        assert profile["worker_overhead_cpu_s"] > 0


def test_up_to_date_export_has_no_profile(store: Path, tmp_path: Path) -> None:
    config = load_config(None, SETS)
    run_export(store, tmp_path / "out", config, progress=False)
    assert run_export(store, tmp_path / "out", config, progress=False).profile is None


def test_amdahl_bound() -> None:
    assert amdahl_bound(1.0, 3.0, 2) == 4.0 / 2.5
    assert amdahl_bound(0.0, 5.0, 2) == 2.0
    assert amdahl_bound(2.0, 0.0, 4) == 1.0
    assert amdahl_bound(0.0, 0.0, 2) == 1.0
