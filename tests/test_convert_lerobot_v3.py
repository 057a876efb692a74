"""`robowds convert lerobot` on the vendored real Reachy2 LeRobot v3.0 tables (3 episodes in one data
file; its mp4 is absent upstream): the state and action windows equal the source rows, and the absent
camera is one clear error until the user leaves it out with --exclude."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.main import main

from exports import export_members, npy
from realdata import real_path

REACHY2 = "lerobot_v30_reachy2_apple_storage_rerun"
LENGTHS = {0: 299, 1: 300, 2: 300}  # meta/episodes: `length`


def test_reachy2_tables_convert_exactly_without_the_absent_camera(tmp_path: Path) -> None:
    src, store, out = real_path(REACHY2), tmp_path / "store", tmp_path / "out"
    assert main(["convert", "lerobot", str(src), str(store), "--quiet", "--workers", "2",
                 "--exclude", "observation.image"]) == 0
    report = json.loads((store / "convert_report.json").read_text())
    assert (report["version"], report["episodes"], report["skipped"], report["excluded"]) == (
        "v3.0", 3, [], ["observation.image"])
    assert set(report["fields"]) == {"observation_state", "action", "task"}
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--fps", "30", "--keep-order",
                 "--set", "window.duration_s=0.0333333333333333", "--set", "window.rate_hz=30",
                 "--set", "shard.min_shards=1"]) == 0
    samples = export_members(out)
    assert len(samples) == sum(LENGTHS.values())  # one window per source row, none lost at an episode's end
    source = pq.read_table(src / "data" / "chunk-000" / "file-000.parquet")
    episodes = source.column("episode_index").to_numpy()
    for index, length in LENGTHS.items():
        rows = source.filter(episodes == index)
        state = np.stack(rows.column("observation.state").to_numpy(zero_copy_only=False))  # [T, 19] float32
        action = np.stack(rows.column("action").to_numpy(zero_copy_only=False))
        assert len(state) == length
        for k in range(length):
            sample = samples[f"episode_{index:06d}_{k:06d}"]
            np.testing.assert_array_equal(npy(sample["observation_state.npy"])[0], state[k])
            np.testing.assert_array_equal(npy(sample["action.npy"])[0], action[k])
        assert sample["task.txt"] == b"place the apple in the plate"


def test_the_absent_mp4_is_one_error_naming_it_and_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", "lerobot", str(real_path(REACHY2)), str(tmp_path / "store"), "--quiet",
                 "--workers", "1"]) == 2
    assert capsys.readouterr().err == (  # every missing file in one message, with the episodes each holds
        f"robowds convert: error: {real_path(REACHY2)}: 1 video file missing (by camera: the file and the episodes "
        "in it):\n    observation.image: videos/observation.image/chunk-000/file-000.mp4 (episodes 0, 1, 2)\n"
        "  fix: download the dataset's videos/ too, convert without the camera(s) with --exclude observation.image, "
        "or pass --skip-bad to convert the other episodes\n")
    assert not (tmp_path / "store").exists()
    # --skip-bad skips each episode; with none left there is no store, and the message says why
    assert main(["convert", "lerobot", str(real_path(REACHY2)), str(tmp_path / "store"), "--quiet",
                 "--skip-bad"]) == 2
    err = capsys.readouterr().err
    assert "every episode failed to convert" in err and "observation.image" in err
    assert not (tmp_path / "store").exists()
