"""`robowds verify --workers N` (issue 26, item 5): shards are checked by a process pool and the result
is the serial one, message for message and in the same order; `scripts/bench_verify.py` measures it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from robowds.export.check import verify
from robowds.export.check.result import VerifyResult
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
    real = verify.make_executor

    def recorded(workers: int):  # type: ignore[no-untyped-def]
        pools.append(workers)
        return real(workers)

    monkeypatch.setattr(verify, "make_executor", recorded)
    monkeypatch.setattr(verify, "PARALLEL_MIN_BYTES", 0)  # this export is small: use the pool anyway
    parallel = verify.verify_export(damaged, progress=False, workers=2)
    assert pools == [2]
    assert parallel.to_json() == serial.to_json() and parallel.render() == serial.render()
    monkeypatch.setattr(verify, "PARALLEL_MIN_BYTES", 1 << 40)
    assert verify.verify_export(damaged, progress=False, workers=2).to_json() == serial.to_json()
    assert pools == [2, 1]  # under the threshold: in-process


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
