"""LeRobot data as it is downloaded (issue 22, items 1 and 2): the Hugging Face cache layout (links into
`blobs/`) converts to a store that validates and exports the same bytes as a plain copy; GR00T-style
v2.0 tables (no frame_index, `annotation.*` label columns, `{episode_index}` in the chunk folder of the
path template) convert exactly, each task whole and alone."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.main import main
from robowds.export.store.validate import validate_store

from exports import export_members, npy
from lerobot_layouts import GR00T_TASKS, ROWS, g1_with_a_shared_video, gr00t_like, hf_cache, hf_local_dir
from realdata import g1

CAMERA = "observation_images_cam_high"
SETTINGS = ["--quiet", "--workers", "1", "--fps", "30", "--stride", "400", "--keep-order",
            "--set", f"streams.{CAMERA}.encoding=raw", "--set", f"streams.{CAMERA}.resize=[64,48]"]


def test_the_hugging_face_cache_layout_converts_validates_and_exports_like_a_copy(tmp_path: Path) -> None:
    plain = g1_with_a_shared_video(tmp_path / "g1")
    snapshot = hf_cache(plain, tmp_path / "hub")
    blobs = snapshot.parents[1] / "blobs"
    videos = snapshot / "videos" / "chunk-000" / "observation.images.cam_high"
    sha = hashlib.sha256(g1("videos", "chunk-000", "observation.images.cam_high", "episode_000001.mp4").read_bytes())
    assert os.readlink(videos / "episode_000001.mp4") == f"../../../../../blobs/{sha.hexdigest()}"
    assert (videos / "episode_000003.mp4").resolve() == (videos / "episode_000001.mp4").resolve()  # one blob

    store = tmp_path / "store"
    assert main(["convert", "lerobot", str(snapshot), str(store), "--quiet", "--workers", "1"]) == 0
    validation = validate_store(store)  # the links end in blobs/, which store.yaml now lists
    assert validation.exportable, validation.render()
    report = json.loads((store / "convert_report.json").read_text())
    assert (report["episodes"], report["warnings"]) == (3, [])
    assert f"media_roots: [{json.dumps(str(snapshot))}, {json.dumps(str(blobs))}]" in (store / "store.yaml").read_text()
    link = store / "media" / CAMERA / "observation.images.cam_high_episode_000001.mp4"
    assert os.readlink(link) == str(videos / "episode_000001.mp4")  # the chain: store -> snapshot -> blob
    assert link.resolve() == blobs / sha.hexdigest()  # a blob name: no .mp4, probed by content

    assert main(["convert", "lerobot", str(plain), str(tmp_path / "plain_store"), "--quiet", "--workers", "1"]) == 0
    assert main(["export", str(store), str(tmp_path / "out"), *SETTINGS]) == 0
    assert main(["export", str(tmp_path / "plain_store"), str(tmp_path / "plain_out"), *SETTINGS]) == 0
    cached, copied = export_members(tmp_path / "out"), export_members(tmp_path / "plain_out")
    assert sorted(cached) == sorted(copied) and len(cached) == 3  # frame 0 of each episode (stride 400)
    for key in copied:
        assert cached[key] == copied[key], key
    one, three = cached["episode_000001_000000"], cached["episode_000003_000000"]  # episode 3: 1's rows and video
    assert npy(three[f"{CAMERA}.npy"]).any() and three[f"{CAMERA}.npy"] == one[f"{CAMERA}.npy"]
    assert main(["verify", str(tmp_path / "out"), "--store", str(store), "--quiet"]) == 0


def test_a_local_dir_download_linking_into_the_cache_validates(tmp_path: Path) -> None:
    """`snapshot_download(local_dir=...)` with links: videos are absolute links into the cache's blobs/,
    which store.yaml then lists (and only it) beside the dataset folder."""
    snapshot = hf_cache(g1(), tmp_path / "hub")
    local = hf_local_dir(snapshot, tmp_path / "local")
    store = tmp_path / "store"
    assert main(["convert", "lerobot", str(local), str(store), "--quiet", "--workers", "1"]) == 0
    validation = validate_store(store)
    assert validation.exportable, validation.render()
    blobs = snapshot.parents[1] / "blobs"
    assert f"media_roots: [{json.dumps(str(local))}, {json.dumps(str(blobs))}]" in (store / "store.yaml").read_text()


def test_a_cache_link_that_leaves_the_repo_is_refused_at_convert(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Only the repo's own blobs/ is opened up: a snapshot link to anywhere else is one error naming it,
    before any store is written (it would not validate)."""
    snapshot = hf_cache(g1(), tmp_path / "hub")
    elsewhere = tmp_path / "elsewhere.mp4"
    shutil.copyfile(g1("videos", "chunk-000", "observation.images.cam_high", "episode_000002.mp4"), elsewhere)
    video = snapshot / "videos" / "chunk-000" / "observation.images.cam_high" / "episode_000002.mp4"
    video.unlink()
    video.symlink_to(os.path.relpath(elsewhere, video.parent))
    assert main(["convert", "lerobot", str(snapshot), str(tmp_path / "store"), "--quiet", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err == (f"robowds convert: error: episode 2: video videos/chunk-000/observation.images.cam_high/"
                   f"episode_000002.mp4 of feature 'observation.images.cam_high' is a link to {elsewhere}, outside "
                   "the dataset folder (a store only opens files in the folders its store.yaml lists)\n"
                   "  fix: copy the dataset with its files in place of the links (`cp -rL`) and convert the copy\n")
    assert not (tmp_path / "store").exists()


def test_gr00t_style_tables_convert_with_row_order_and_each_task_whole(tmp_path: Path) -> None:
    src, store, out = gr00t_like(tmp_path / "gr00t"), tmp_path / "store", tmp_path / "out"
    assert main(["convert", "lerobot", str(src), str(store), "--quiet", "--workers", "1"]) == 0
    report = json.loads((store / "convert_report.json").read_text())
    assert (report["version"], report["episodes"], report["skipped"]) == ("v2.0", 2, [])  # chunk-{episode_index}
    assert report["notes"] == [f"episode {e}: no frame_index column; the row order is the frame index (timestamps "
                               "regular at 1/fps)" for e in (1, 2)]
    assert report["fields"]["human_action_task_description"]["source"] == "annotation.human.action.task_description"
    assert set(report["fields"]) == {"task", "action", "observation_state", "human_action_task_description",
                                     "annotation_human_validity"}
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--fps", "30", "--keep-order",
                 "--set", "window.duration_s=0.0333333333333333", "--set", "window.rate_hz=30",
                 "--set", "shard.min_shards=1"]) == 0
    samples = export_members(out)
    assert len(samples) == 2 * ROWS  # one window per row: row k at k / fps
    for episode, described in (("episode_000001", 0), ("episode_000002", 2)):
        rows = pq.read_table(src / "data" / "chunk-000" / f"{episode}.parquet")
        state = np.stack(rows.column("observation.state").to_numpy(zero_copy_only=False))  # [ROWS, 26]
        for k in range(ROWS):
            sample = samples[f"{episode}_{k:06d}"]
            np.testing.assert_array_equal(npy(sample["observation_state.npy"])[0], state[k])
            assert npy(sample["human_action_task_description.npy"]).tolist() == [[described]]
            assert sample["task.txt"] == GR00T_TASKS[described].encode()  # whole, without "| valid"


def test_gr00t_style_times_equal_those_from_frame_index(tmp_path: Path) -> None:
    """Row order stands for the frame index exactly: the same tables with frame_index give the same
    episodes table, times included."""
    for name, with_index in (("without", False), ("with", True)):
        assert main(["convert", "lerobot", str(gr00t_like(tmp_path / name, frame_index=with_index)),
                     str(tmp_path / f"{name}_store"), "--quiet", "--workers", "1"]) == 0
    without, with_ = (pq.read_table(tmp_path / f"{n}_store" / "episodes.parquet") for n in ("without", "with"))
    assert without.equals(with_)
