"""`robowds convert lerobot` on the vendored real G1 data (LeRobot v2.1, 2 of the 100 episodes meta
lists): exported windows equal the source read with pyarrow and PyAV at the grid times, the episodes meta
lists without files are reported, and the store is written whole or not at all."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.main import main
from robowds.export.store.validate import validate_store

from exports import export_members, npy
from realdata import G1_EPISODES, G1_LENGTHS, g1, g1_parquet, g1_video
from videos import decode_all


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
        "observation_state": {"source": "observation.state", "kind": "timeseries", "dtype": "float32"},
        "task": {"source": "tasks", "kind": "text", "dtype": "str"}}
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
    samples = export_members(out)
    assert len(samples) == sum(G1_LENGTHS.values())  # one window per source frame, none lost at the end
    for episode in G1_EPISODES:
        table = pq.read_table(g1_parquet(episode))
        state = np.stack(table.column("observation.state").to_numpy(zero_copy_only=False))  # [T, 26] float32
        action = np.stack(table.column("action").to_numpy(zero_copy_only=False))
        for k in range(len(state)):
            sample = samples[f"{episode}_{k:06d}"]
            np.testing.assert_array_equal(npy(sample["observation_state.npy"])[0], state[k])
            np.testing.assert_array_equal(npy(sample["action.npy"])[0], action[k])
        assert sample["task.txt"] == b"Pick up the yellow bottle on the table."
    assert main(["verify", str(out), "--store", str(store), "--quiet"]) == 0


def test_camera_frames_equal_the_source_frames(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--fps", "30", "--stride", "97",
                 "--keep-order", "--set", "exclude=[action, observation_state]",
                 "--set", "streams.observation_images_cam_high.duration_s=0.0333333333333333",
                 "--set", "streams.observation_images_cam_high.rate_hz=30",
                 "--set", "streams.observation_images_cam_high.encoding=raw"]) == 0
    samples = export_members(out)
    for episode in G1_EPISODES:
        source = decode_all(g1_video(episode))  # [F, 480, 640, 3] through PyAV
        for k in range(0, G1_LENGTHS[episode], 97):
            frame = npy(samples[f"{episode}_{k:06d}"]["observation_images_cam_high.npy"])[0]
            np.testing.assert_array_equal(frame, source[k])


def test_progress_goes_to_stderr_and_quiet_or_json_silence_it(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", "lerobot", str(g1()), str(tmp_path / "a")]) == 0
    assert "convert: 100%" in capsys.readouterr().err
    assert main(["convert", "lerobot", str(g1()), str(tmp_path / "b"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["convert", "lerobot", str(g1()), str(tmp_path / "c"), "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and json.loads(captured.out)["episodes"] == 2


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
    ("v9", "LeRobot codebase_version 'v9.0' is not supported by this converter"),
    ("no_video", "video"),
])
def test_bad_sources_are_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str,
                                         message: str) -> None:
    src = tmp_path / "src"
    shutil.copytree(g1(), src)
    if damage == "no_meta":
        (src / "meta" / "info.json").unlink()
    elif damage == "v9":
        info = json.loads((src / "meta" / "info.json").read_text())
        (src / "meta" / "info.json").write_text(json.dumps({**info, "codebase_version": "v9.0"}))
    else:
        next((src / "videos").rglob("episode_000002.mp4")).unlink()
    assert main(["convert", "lerobot", str(src), str(tmp_path / "store"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("robowds convert: error: ") and message in err and "Traceback" not in err, err
    assert "fix: " in err
    assert not (tmp_path / "store").exists()


def _v3_dataset(root: Path) -> Path:
    """The two vendored v2.1 episodes laid out as LeRobot v3.0 writes them: one data file, one mp4 of both
    episodes (packets copied), meta/episodes with each episode's [from_timestamp, to_timestamp)."""
    import pyarrow as pa

    from test_segments import _concatenate

    key = "observation.images.cam_high"
    info = json.loads(g1("meta", "info.json").read_text())
    info.update(codebase_version="v3.0", data_path="data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
                video_path="videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4")
    (root / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps(info))
    (root / "data" / "chunk-000").mkdir(parents=True)
    pq.write_table(pa.concat_tables([pq.read_table(g1_parquet(e)) for e in G1_EPISODES]),
                   root / "data" / "chunk-000" / "file-000.parquet")
    video = root / "videos" / key / "chunk-000" / "file-000.mp4"
    video.parent.mkdir(parents=True)
    counts = _concatenate([g1_video(e) for e in G1_EPISODES], video)
    bounds = np.cumsum([0] + counts) / 30.0
    rows = [{"episode_index": int(e[-6:]), "tasks": ["Pick up the yellow bottle on the table."], "length": n,
             "data/chunk_index": 0, "data/file_index": 0, f"videos/{key}/chunk_index": 0,
             f"videos/{key}/file_index": 0, f"videos/{key}/from_timestamp": float(bounds[i]),
             f"videos/{key}/to_timestamp": float(bounds[i + 1])} for i, (e, n) in enumerate(zip(G1_EPISODES, counts))]
    pq.write_table(pa.Table.from_pylist(rows), root / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    return root


def test_v3_multi_episode_files_convert_to_the_same_windows_as_v2(store: Path, tmp_path: Path) -> None:
    """v3.0 (one Parquet file and one mp4 for both episodes, segments from meta/episodes) gives the same
    windows as the v2.1 layout of the same data, camera frames included."""
    src = _v3_dataset(tmp_path / "v3")
    assert main(["convert", "lerobot", str(src), str(tmp_path / "store3")]) == 0
    report = json.loads((tmp_path / "store3" / "convert_report.json").read_text())
    assert (report["version"], report["episodes"], report["skipped"]) == ("v3.0", 2, [])
    assert validate_store(tmp_path / "store3").exportable
    settings = ["--quiet", "--workers", "1", "--fps", "30", "--stride", "41", "--keep-order",
                "--set", "streams.observation_images_cam_high.encoding=raw",
                "--set", "streams.observation_images_cam_high.resize=[64,48]"]
    assert main(["export", str(tmp_path / "store3"), str(tmp_path / "out3"), *settings]) == 0
    assert main(["export", str(store), str(tmp_path / "out2"), *settings]) == 0
    v3, v2 = export_members(tmp_path / "out3"), export_members(tmp_path / "out2")
    assert sorted(v3) == sorted(v2) and len(v3) == sum(-(-n // 41) for n in G1_LENGTHS.values())
    for key in v2:
        for member in v2[key]:
            assert v3[key][member] == v2[key][member], (key, member)
