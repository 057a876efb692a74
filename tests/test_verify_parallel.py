"""`robowds verify --workers N` (issue 26, item 5): shards are checked by a process pool and the result
is the serial one, message for message and in the same order; `scripts/bench_verify.py` measures it."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from robowds.export.check import verify
from robowds.export.check.result import VerifyResult
from robowds.export.check.shared_map import map_shared
from robowds.export.cli.main import main

from exports import export_synthetic
from test_verify_messages import damage_npy_header


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An export of 8 shards with faults in four of them: a member that does not decode, a flipped
    byte, a missing index, a missing shard."""
    out = export_synthetic(tmp_path_factory.mktemp("verify_par"), 3, 0, "--keep-order")
    shards = json.loads((out / "manifest.json").read_text())["splits"]["train"]["shards"]
    assert len(shards) >= 6
    damage_npy_header(out, 2, "joints.npy", b"'<f4'", b"'|O' ")
    flipped = out / shards[2]["path"]
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF
    flipped.write_bytes(bytes(data))
    (out / (shards[4]["path"] + ".idx")).unlink()
    (out / shards[5]["path"]).unlink()
    return out


def test_a_pool_of_two_reports_what_one_process_does(damaged: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    serial = verify.verify_export(damaged, progress=False, workers=1)
    assert len(serial.failures) >= 4 and serial.shards == 7  # the missing one is not counted as read
    pools: list[int] = []
    real = verify.map_shared

    def recorded(fn, tasks, processes, cost):  # type: ignore[no-untyped-def]
        pools.append(processes)
        return real(fn, tasks, processes, cost)

    monkeypatch.setattr(verify, "map_shared", recorded)
    monkeypatch.setattr(verify, "PARALLEL_MIN_BYTES", 0)  # this export is small: use the pool anyway
    parallel = verify.verify_export(damaged, progress=False, workers=2)
    assert pools == [2]
    assert parallel.to_json() == serial.to_json() and parallel.render() == serial.render()
    monkeypatch.setattr(verify, "PARALLEL_MIN_BYTES", 1 << 40)
    assert verify.verify_export(damaged, progress=False, workers=2).to_json() == serial.to_json()
    assert pools == [2]  # under the threshold: in-process, no pool


def _run_where(task: tuple[int, str, int]) -> tuple[int, int, float]:
    """A map_shared task: (its number, the pid that ran it, when it started). A task run in the pool
    creates `marker`; one run in the test's process (`here`) first waits (up to 20 s) for the pool to
    have run one, so both take part whatever the pool's start takes."""
    number, marker, here = task
    began = time.monotonic()
    if os.getpid() == here:
        for _ in range(2000):
            if os.path.exists(marker):
                break
            time.sleep(0.01)
    else:
        Path(marker).touch()
    return number, os.getpid(), began


def _fail_in_pool(task: tuple[int, str, int]) -> int:
    """A map_shared task that fails in a pool worker only (after `_run_where`'s waiting here)."""
    number, pid, _ = _run_where(task)
    if pid != task[2]:
        raise ValueError(f"task {number} failed in the pool")
    return number


def test_map_shared_runs_here_and_in_the_pool_largest_first_results_in_order(tmp_path: Path) -> None:
    """This process checks shards too (it starts on the largest at once, while the pool starts), the
    pool takes the others from the same queue, and the results come back in task order."""
    tasks = [(i, str(tmp_path / "pool-ran"), os.getpid()) for i in range(8)]
    results = list(map_shared(_run_where, tasks, 2, cost=lambda task: task[0]))
    assert [number for number, _, _ in results] == list(range(8))
    assert {pid for _, pid, _ in results} - {os.getpid()}  # the pool ran some
    assert os.getpid() in {pid for _, pid, _ in results}  # and so did this process
    first = min(results, key=lambda r: r[2])
    assert first[:2] == (7, os.getpid())  # the largest task, here, before anything else started


def test_map_shared_raises_a_pool_tasks_error_here(tmp_path: Path) -> None:
    """An error in a pool worker's task is raised here, as the serial check would raise it."""
    tasks = [(i, str(tmp_path / "pool-ran"), os.getpid()) for i in range(6)]
    with pytest.raises(ValueError, match=r"task \d+ failed in the pool"):
        list(map_shared(_fail_in_pool, tasks, 2, cost=lambda task: 0))


def test_keys_are_unique_across_shards_in_shard_order() -> None:
    """The keys a pool's workers saw are judged in shard order: the second shard holding a key is the
    one named, whichever worker finished first."""
    result = VerifyResult()
    replay = verify.ShardReplay(result)
    replay.add("train/shard-000000.tar", verify.ShardCheck([("a", 0), ("b", 512)], 2, True))
    replay.add("train/shard-000001.tar", verify.ShardCheck(["shard train/shard-000001.tar: sha256 does not match "
                                                            "the manifest", ("b", 0), ("c", 512)], 2, True))
    assert result.failures == ["shard train/shard-000001.tar: sha256 does not match the manifest",
                               "shard train/shard-000001.tar: key b at byte 0 is not unique in the dataset"]
    assert (result.shards, result.samples) == (2, 4)


def test_the_cli_passes_workers_and_refuses_zero(damaged: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "copy"
    shutil.copytree(damaged, out)
    assert main(["verify", str(out), "--quiet", "--workers", "0"]) == 2
    assert "--workers must be >= 1, got 0" in capsys.readouterr().err
    assert main(["verify", str(out), "--quiet", "--workers", "2", "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == verify.verify_export(out, progress=False).to_json()


HEAVY = ("pyarrow", "yaml", "tqdm", "fsspec", "msgpack", "torch", "av", "matplotlib")


def test_a_pool_worker_checks_a_shard_without_the_export_side_imports(damaged: Path) -> None:
    """A `verify --workers` pool worker imports only what checking a shard needs (numpy, Pillow, the
    reader's format modules): that start-up is paid once per worker before its first shard, and was
    what kept 2 workers from 2x (~0.6 s of CPU with pyarrow, yaml and tqdm, ~0.3 s without). A real
    pool worker runs the task as `map_shared` sends it, then reports the modules it holds."""
    from robowds.export.check.shard_check import ShardTask, check_shard
    from robowds.export.check.shared_map import _indexed
    from robowds.export.executors.executor import ProcessExecutor
    from robowds.export.store.location import store_location
    from robowds.reader.manifest import parse_manifest, shards_of

    manifest = parse_manifest((damaged / "manifest.json").read_bytes())
    shard = shards_of(manifest, "train")[0]  # with a member that does not decode
    task = ShardTask(store_location(damaged), "train", shard, manifest["schema"])
    pool = ProcessExecutor(1)
    try:
        [(index, check)] = list(pool.map_unordered(_indexed, [(check_shard, 0, task)]))
        [modules] = list(pool.map_unordered(eval, ["sorted(__import__('sys').modules)"]))
    finally:
        pool.close()
    assert index == 0 and check == check_shard(task) and check.samples == shard.samples > 0
    assert sum(isinstance(event, str) for event in check.events) >= 1  # the damage, found in the worker
    assert "numpy" in modules and "robowds.export.check.shard_check" in modules
    assert [m for m in modules if m.split(".")[0] in HEAVY] == []
    assert "robowds.export.check.verify" not in modules and "robowds.export.store.schema" not in modules
