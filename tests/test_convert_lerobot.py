"""`robowds convert lerobot` on the vendored real G1 data (LeRobot v2.1, 2 of the 100 episodes meta
lists): exported windows equal the source read with pyarrow and PyAV at the grid times, the episodes meta
lists without files are reported, and the store is written whole or not at all."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.main import main
from robowds.export.store.validate import validate_store
from robowds.reader.format import group_samples, iter_members

from realdata import G1_EPISODES, G1_LENGTHS, g1, g1_parquet, g1_video
from videos import decode_all


def _samples(out: Path) -> dict[str, dict[str, bytes]]:
    manifest = json.loads((out / "manifest.json").read_text())
    found = {}
    for shard in manifest["splits"]["train"]["shards"]:
        data = (out / shard["path"]).read_bytes()
        found.update({k: {n: bytes(v) for n, v in m.items()} for k, _, m in group_samples(iter_members(data))})
    return found


def _npy(blob: bytes) -> np.ndarray:
    return np.load(io.BytesIO(blob), allow_pickle=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("convert")
    assert main(["convert", "lerobot", str(g1()), str(root / "store")]) == 0
    return root / "store"


def test_the_report_lists_the_mapping_and_the_absent_episodes(store: Path) -> None:
    report = json.loads((store / "convert_report.json").read_text())
    assert (report["format"], report["version"], report["fps"], report["episodes"]) == ("lerobot", "v2.1", 30.0, 2)
    assert report["fields"] == {
        "action": {"source": "action", "kind": "timeseries", "dtype": "float32"},
        "observation_images_cam_high": {"source": "observation.images.cam_high", "kind": "video", "dtype": "uint8"},
        "observation_state": {"source": "observation.state", "kind": "timeseries", "dtype": "float32"}}
    listed = {int(s["episode_index"]) for s in report["skipped"]}
    assert listed == set(range(100)) - {1, 2}
    assert report["skipped"][0] == {"episode_index": 0, "reason": "data/chunk-000/episode_000000.parquet is missing"}
    links = sorted((store / "media" / "observation_images_cam_high").iterdir())
    assert [p.resolve() for p in links] == [g1_video(e).resolve() for e in G1_EPISODES]  # referenced, not copied


def test_state_and_action_windows_equal_the_source_rows(store: Path, tmp_path: Path) -> None:
    report = validate_store(store)
    assert report.exportable, report.render()
    assert report.schema.fields["observation_state"].names[0] == "kLeftShoulderPitch"
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "2", "--fps", "30", "--keep-order",
                 "--set", "exclude=[observation_images_cam_high]", "--set", "window.duration_s=0.0333333333333333",
                 "--set", "window.rate_hz=30", "--set", "shard.min_shards=1"]) == 0
    samples = _samples(out)
    assert len(samples) == sum(G1_LENGTHS.values())  # one window per source frame, none lost at the end
    for episode in G1_EPISODES:
        table = pq.read_table(g1_parquet(episode))
        state = np.stack(table.column("observation.state").to_numpy(zero_copy_only=False))  # [T, 26] float32
        action = np.stack(table.column("action").to_numpy(zero_copy_only=False))
        for k in range(len(state)):
            sample = samples[f"{episode}_{k:06d}"]
            np.testing.assert_array_equal(_npy(sample["observation_state.npy"])[0], state[k])
            np.testing.assert_array_equal(_npy(sample["action.npy"])[0], action[k])
        assert sample["task.txt"] == b"Pick up the yellow bottle on the table."
    assert main(["verify", str(out), "--store", str(store), "--quiet"]) == 0


def test_camera_frames_equal_the_source_frames(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--fps", "30", "--stride", "97",
                 "--keep-order", "--set", "exclude=[action, observation_state]",
                 "--set", "streams.observation_images_cam_high.duration_s=0.0333333333333333",
                 "--set", "streams.observation_images_cam_high.rate_hz=30",
                 "--set", "streams.observation_images_cam_high.encoding=raw"]) == 0
    samples = _samples(out)
    for episode in G1_EPISODES:
        source = decode_all(g1_video(episode))  # [F, 480, 640, 3] through PyAV
        for k in range(0, G1_LENGTHS[episode], 97):
            frame = _npy(samples[f"{episode}_{k:06d}"]["observation_images_cam_high.npy"])[0]
            np.testing.assert_array_equal(frame, source[k])


def test_an_existing_store_is_refused_then_replaced_only_when_robowds_wrote_it(tmp_path: Path,
                                                                              capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "store"
    assert main(["convert", "lerobot", str(g1()), str(target)]) == 0
    capsys.readouterr()
    assert main(["convert", "lerobot", str(g1()), str(target)]) == 2
    assert "store " + str(target) + " already exists" in capsys.readouterr().err
    (target / "mine.txt").write_text("kept?")
    assert main(["convert", "lerobot", str(g1()), str(target), "--overwrite"]) == 0
    assert not (target / "mine.txt").exists() and (target / "episodes.parquet").is_file()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not robowds")
    assert main(["convert", "lerobot", str(g1()), str(foreign), "--overwrite"]) == 2
    assert "was not written by robowds convert" in capsys.readouterr().err
    assert (foreign / "notes.txt").read_text() == "not robowds"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no work folder left behind


@pytest.mark.parametrize("damage,message", [
    ("no_meta", "is not a LeRobot dataset"),
    ("v3", "LeRobot codebase_version 'v3.0' is not supported by this converter"),
    ("no_video", "video"),
])
def test_bad_sources_are_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str,
                                         message: str) -> None:
    src = tmp_path / "src"
    shutil.copytree(g1(), src)
    if damage == "no_meta":
        (src / "meta" / "info.json").unlink()
    elif damage == "v3":
        info = json.loads((src / "meta" / "info.json").read_text())
        (src / "meta" / "info.json").write_text(json.dumps({**info, "codebase_version": "v3.0"}))
    else:
        next((src / "videos").rglob("episode_000002.mp4")).unlink()
    assert main(["convert", "lerobot", str(src), str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("robowds convert: error: ") and message in err and "Traceback" not in err, err
    assert "fix: " in err
    assert not (tmp_path / "store").exists()
