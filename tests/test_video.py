"""Video groundwork: real pts from containers, frame selection by pts (never index arithmetic), and
validate's fps / segment / unreadable-file checks on real mp4 files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.media.frames import probe_video, select_frames

from realdata import G1_LENGTHS, g1_video
from videos import to_rgb, write_video


def test_probe_constant_and_variable_frame_rate(tmp_path: Path) -> None:
    write_video(tmp_path / "cfr.mp4", [k * 100 for k in range(20)])
    cfr = probe_video(tmp_path / "cfr.mp4")
    np.testing.assert_allclose(cfr.pts, np.arange(20) / 10, atol=1e-9)
    assert (cfr.declared_fps, cfr.width, cfr.height) == (10.0, 64, 48)
    write_video(tmp_path / "vfr.mp4", [0, 100, 200, 350, 400, 700])
    vfr = probe_video(tmp_path / "vfr.mp4")
    np.testing.assert_allclose(vfr.pts, [0.0, 0.1, 0.2, 0.35, 0.4, 0.7], atol=1e-9)
    assert vfr.measured_fps == pytest.approx(10.0)  # median interval 0.1 s


def test_measured_fps_of_millisecond_pts_is_the_real_rate(tmp_path: Path) -> None:
    """Matroska stores ms: 30 Hz frames are 33 or 34 ms apart (median 33 ms, 30.303 fps, which gave a
    false fps warning on every converted camera); the regular steps' mean is the real 30 fps."""
    from robowds.export.media.encode import encode_frames

    encode_frames(np.zeros((31, 16, 16, 3), np.uint8), np.arange(31) / 30.0, tmp_path / "a.mkv")
    info = probe_video(tmp_path / "a.mkv")
    assert info.time_base == 0.001 and set(np.round(np.diff(info.pts), 6)) == {0.033, 0.034}
    assert info.measured_fps == pytest.approx(30.0, rel=1e-9)


def test_probe_real_av1_lerobot_video() -> None:
    info = probe_video(g1_video("episode_000001"))
    assert len(info.pts) == G1_LENGTHS["episode_000001"] == 393 and (info.width, info.height) == (640, 480)  # parquet has 393 rows
    np.testing.assert_allclose(info.pts, np.arange(393) / 30, atol=1e-6)


PTS = np.array([0.0, 0.1, 0.2, 0.35, 0.4, 0.7])  # median interval 0.1


def test_nearest_selection_by_real_pts() -> None:
    q = np.array([-0.1, -0.04, 0.0, 0.04, 0.05, 0.26, 0.3, 0.53, 0.66, 0.75, 0.76])
    index, valid = select_frames(PTS, q, "nearest")
    assert index.tolist() == [0, 0, 0, 0, 0, 2, 3, 4, 5, 5, 5]  # 0.05: tie -> earlier; 0.53: 0.4 nearer
    # valid within half the median interval (0.05 s): 0.26 is 0.06 from 0.2 (and 0.09 from 0.35)
    assert valid.tolist() == [False, True, True, True, True, False, True, False, True, True, False]


def test_causal_selection_and_explicit_tolerance() -> None:
    q = np.array([-0.01, 0.0, 0.09, 0.1, 0.34, 0.5, 0.79, 0.8])
    index, valid = select_frames(PTS, q, "causal")
    assert index.tolist() == [0, 0, 0, 1, 2, 4, 5, 5]
    assert valid.tolist() == [False, True, True, True, False, False, True, False]  # < 0.1 s old
    index, valid = select_frames(PTS, np.array([0.3]), "nearest", tolerance=0.06)
    assert (index.tolist(), valid.tolist()) == ([3], [True])
    with pytest.raises(ValueError, match="frame selection"):
        select_frames(PTS, q, "round")


def _store_with_video(tmp_path: Path, fps: float, make: bool = True) -> Path:
    store = tmp_path / "s"
    write_synthetic_store(store, episodes=2, seed=0)
    for i in range(2):
        if make:
            write_video(store / "media" / "cam" / f"ep_{i:04d}.mp4", [k * 100 for k in range(40)])
    video = pa.array([{"path": f"media/cam/ep_{i:04d}.mp4", "fps": fps, "start_s": 0.0, "end_s": 4.0}
                      for i in range(2)])
    pq.write_table(pa.table({"episode_id": ["ep_0000", "ep_0001"], "cam_high": video}), store / "videos.parquet")
    return store


def test_validate_accepts_real_videos_and_export_carries_them(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    import json

    store = _store_with_video(tmp_path, fps=10.0)
    assert main(["validate", str(store)]) == 0
    out = capsys.readouterr().out
    assert "exportable: 0 error(s), 0 warning(s)" in out and "cam_high" in out
    assert main(["export", str(store), str(tmp_path / "out"), "--quiet", "--workers", "1"]) == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["schema"]["cam_high"] == {
        "codec": "jpeg", "dtype": "uint8", "duration_s": 1.0, "encoding": "jpg", "kind": "video", "layout": "THWC",
        "mask_member": "cam_high_mask.npy", "member": "cam_high.jpgs.msgpack", "offset_s": 0.0, "pad": "zero",
        "rate_hz": 10.0, "selection": "nearest", "shape": [10, None, None, 3]}
    assert main(["verify", str(tmp_path / "out"), "--store", str(store), "--quiet"]) == 0


def test_validate_reports_fps_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _store_with_video(tmp_path, fps=30.0)
    assert main(["validate", str(store)]) == 0  # a warning: frames are chosen by real pts anyway
    out = capsys.readouterr().out
    assert ("warning: episode 'ep_0001', field 'cam_high': declared fps 30, but the timestamps of "
            "'media/cam/ep_0001.mp4' give 10.000 fps") in out
    import json
    assert main(["export", str(store), str(tmp_path / "out"), "--quiet", "--workers", "1"]) == 0
    video = json.loads((tmp_path / "out" / "manifest.json").read_text())["report"]["video"]["cam_high"]
    assert video["fps_mismatch"] == [{"episode_id": "ep_0000", "declared": 30.0, "measured": 10.0},
                                     {"episode_id": "ep_0001", "declared": 30.0, "measured": 10.0}]


def test_validate_reports_missing_and_corrupt_videos(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _store_with_video(tmp_path, fps=10.0)
    (store / "media" / "cam" / "ep_0001.mp4").unlink()
    (store / "media" / "cam" / "ep_0000.mp4").write_bytes(b"\0" * 4096)
    assert main(["validate", str(store)]) == 1
    out = capsys.readouterr().out
    assert "episode 'ep_0001', field 'cam_high': video file 'media/cam/ep_0001.mp4' is missing" in out
    assert "episode 'ep_0000', field 'cam_high': video file 'media/cam/ep_0000.mp4': ep_0000.mp4 cannot be read" in out


def _decoded_source(path: Path) -> np.ndarray:
    import av
    with av.open(str(path)) as container:
        return to_rgb(container.decode(video=0))  # [F, H, W, 3]


def _samples(out: Path) -> dict[str, dict]:
    from robowds.reader import ShardDataset
    return {s["__key__"]: s for s in ShardDataset(out, "train", shuffle=False)}


def test_raw_frames_are_the_source_frames_chosen_by_pts(tmp_path: Path) -> None:
    store = _store_with_video(tmp_path, fps=10.0)
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--set", "streams.cam_high.encoding=raw",
                 "--set", "streams.cam_high.duration_s=0.5", "--set", "streams.cam_high.offset_s=-0.2"]) == 0
    source = _decoded_source(store / "media" / "cam" / "ep_0000.mp4")  # 40 frames at k * 0.1 s
    samples = _samples(out)
    for anchor in (0, 1, 17, 37, 39, 41):
        sample = samples[f"ep_0000_{anchor:06d}"]
        frames, mask = sample["cam_high"], sample["cam_high_mask"]  # [5, 48, 64, 3], [5]
        wanted = anchor - 2 + np.arange(5)  # grid 10 Hz = video rate: frame k sits at k / 10 s
        real = (wanted >= 0) & (wanted <= 39)
        assert mask.tolist() == real.tolist(), anchor
        np.testing.assert_array_equal(frames[real], source[wanted[real]])
        assert not frames[~real].any()  # zero padding


def test_jpg_frames_psnr_and_determinism_across_workers(tmp_path: Path) -> None:
    store = _store_with_video(tmp_path, fps=10.0)
    outs = []
    for workers in ("1", "2"):
        out = tmp_path / f"out{workers}"
        assert main(["export", str(store), str(out), "--quiet", "--workers", workers,
                     "--set", "streams.cam_high.duration_s=0.3"]) == 0
        outs.append({p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()})
    assert outs[0] == outs[1]
    source = _decoded_source(store / "media" / "cam" / "ep_0001.mp4").astype(np.float64)
    sample = _samples(tmp_path / "out1")["ep_0001_000010"]
    frames = sample["cam_high"].astype(np.float64)  # [3, 48, 64, 3]
    mse = ((frames - source[10:13]) ** 2).mean()
    assert frames.shape == (3, 48, 64, 3) and 10 * np.log10(255 ** 2 / max(mse, 1e-12)) > 35


def test_resize_and_unreadable_video_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _store_with_video(tmp_path, fps=10.0)
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--set", "streams.cam_high.resize=[32, 24]",
                 "--set", "streams.cam_high.encoding=raw"]) == 0
    assert next(iter(_samples(out).values()))["cam_high"].shape == (10, 24, 32, 3)
    (store / "media" / "cam" / "ep_0001.mp4").write_bytes(b"\0" * 2048)
    assert main(["export", str(store), str(tmp_path / "out2"), "--quiet", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "episode 'ep_0001', field 'cam_high': video file 'media/cam/ep_0001.mp4'" in err and "Traceback" not in err


def test_real_av1_video_exports_and_reads_back(tmp_path: Path) -> None:
    import shutil
    store = tmp_path / "g1"
    (store / "media").mkdir(parents=True)
    shutil.copy(g1_video("episode_000001"), store / "media" / "cam.mp4")
    t = np.arange(393) / 30.0
    table = pa.table({"episode_id": ["ep1"], "frame": pa.array([np.column_stack([t, np.arange(393.0)]).tolist()]),
                      "cam_high": pa.array([{"path": "media/cam.mp4", "fps": 30.0}])})
    pq.write_table(table, store / "episodes.parquet")
    out = tmp_path / "out"
    assert main(["validate", str(store)]) == 0
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--fps", "30", "--stride", "30",
                 "--set", "window.duration_s=0.2", "--set", "window.rate_hz=10", "--set", "streams.cam_high.encoding=raw",
                 "--set", "streams.cam_high.resize=[160, 120]", "--set", "streams.frame.interpolation=nearest"]) == 0
    samples = _samples(out)
    assert len(samples) == 14  # anchors every 30 frames over 393 frames
    sample = samples["ep1_000060"]  # t = 2.0 s: camera steps at 2.0 and 2.1 s = frames 60 and 63
    assert sample["frame"].ravel().tolist() == [60.0, 63.0] and sample["cam_high"].shape == (2, 120, 160, 3)
    assert sample["cam_high_mask"].all() and sample["cam_high"].std() > 5  # a real picture, not padding


def test_mp4_clips_are_deterministic_keyframed_and_decode(tmp_path: Path) -> None:
    import json

    store = _store_with_video(tmp_path, fps=10.0)
    trees = []
    for workers in ("1", "2"):
        out = tmp_path / f"mp4_{workers}"
        assert main(["export", str(store), str(out), "--quiet", "--workers", workers, "--set",
                     "streams.cam_high.encoding=mp4", "--set", "streams.cam_high.duration_s=0.5"]) == 0
        trees.append({p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()})
    assert trees[0] == trees[1]  # mpeg4 with bitexact flags: same bytes whatever the worker count
    out = tmp_path / "mp4_1"
    assert main(["verify", str(out), "--store", str(store), "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["schema"]["cam_high"]["codec"] == "mpeg4"
    report = manifest["report"]["video"]["cam_high"]
    assert report["psnr_db_min"] > 30 and 0 < report["bytes_per_frame"] < 64 * 48 * 3
    sample = _samples(out)["ep_0000_000010"]
    source = _decoded_source(store / "media" / "cam" / "ep_0000.mp4")
    frames = sample["cam_high"]  # [5, 48, 64, 3], decoded from the clip's own keyframe
    assert frames.shape == (5, 48, 64, 3) and sample["cam_high_mask"].all()
    mse = ((frames.astype(np.float64) - source[10:15]) ** 2).mean()
    assert 10 * np.log10(255 ** 2 / max(mse, 1e-12)) > 30


def test_inspect_text_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _store_with_video(tmp_path, fps=10.0)
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--keep-order",
                 "--set", "streams.cam_high.duration_s=0.5"]) == 0
    png = tmp_path / "w.png"
    assert main(["inspect", str(out), "--key", "ep_0000_000037", "--png", str(png)]) == 0
    text = capsys.readouterr().out
    assert "key ep_0000_000037" in text and "cam_high_mask          bool[5]  3/5 real" in text
    from PIL import Image
    with Image.open(png) as img:  # a real picture: frames strip plus one plot per stream
        assert img.format == "PNG" and img.size[0] >= 600 and img.size[1] >= 600
        rgb = np.asarray(img.convert("RGB")).astype(int)
        red = (rgb[..., 0] > 200) & (rgb[..., 1] < 60) & (rgb[..., 2] < 60)
        assert red.sum() > 100  # the two padded frames are crossed out in red
    assert main(["inspect", str(out), "--key", "nope_000001"]) == 2
    assert "no sample with key 'nope_000001'" in capsys.readouterr().err


def test_segments_of_one_long_file_lerobot_v3_style(tmp_path: Path) -> None:
    store = tmp_path / "s"
    write_synthetic_store(store, episodes=2, seed=0)
    write_video(store / "media" / "all.mp4", [k * 100 for k in range(60)])  # 6 s, frame k at k / 10 s
    # half-open [start_s, end_s), as LeRobot v3's [from_timestamp, to_timestamp): 3.0 is ep_0001's first frame
    video = pa.array([{"path": "media/all.mp4", "fps": 10.0, "start_s": 0.0, "end_s": 3.0},
                      {"path": "media/all.mp4", "fps": 10.0, "start_s": 3.0, "end_s": 6.0}])
    pq.write_table(pa.table({"episode_id": ["ep_0000", "ep_0001"], "cam_high": video}), store / "videos.parquet")
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--set", "streams.cam_high.encoding=raw",
                 "--set", "streams.cam_high.duration_s=0.4"]) == 0
    source = _decoded_source(store / "media" / "all.mp4")
    samples = _samples(out)
    b = samples["ep_0001_000000"]  # episode time 0..0.3 s = file time 3.0..3.3 s = frames 30..33
    np.testing.assert_array_equal(b["cam_high"], source[30:34])
    assert b["cam_high_mask"].all()
    a = samples["ep_0000_000027"]  # 2.7..3.0 s: 3.0 is this segment's end_s, the next one's frame: masked
    assert a["cam_high_mask"].tolist() == [True, True, True, False]
    np.testing.assert_array_equal(a["cam_high"][:3], source[27:30])
    assert not a["cam_high"][3].any()


def test_reader_video_layout_channels_first(tmp_path: Path) -> None:
    from robowds.reader import ShardDataset, ShardLoader

    store = _store_with_video(tmp_path, fps=10.0)
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--set", "streams.cam_high.encoding=mp4",
                 "--set", "streams.cam_high.duration_s=0.3"]) == 0
    hwc = next(iter(ShardDataset(out, "train", shuffle=False)))["cam_high"]
    chw = next(iter(ShardDataset(out, "train", shuffle=False, video_layout="TCHW")))["cam_high"]
    assert hwc.shape == (3, 48, 64, 3) and chw.shape == (3, 3, 48, 64)
    np.testing.assert_array_equal(chw, hwc.transpose(0, 3, 1, 2))
    batch = next(iter(ShardLoader(ShardDataset(out, "train", video_layout="TCHW"), batch_size=4, num_workers=1)))
    assert tuple(batch["cam_high"].shape) == (4, 3, 3, 48, 64) and str(batch["cam_high"].dtype) == "torch.uint8"


def _drop_clock(store: Path) -> None:
    import yaml

    doc = yaml.safe_load((store / "store.yaml").read_text())
    doc.pop("clock")
    (store / "store.yaml").write_text(yaml.safe_dump(doc))


def test_camera_only_export_spans_the_video(tmp_path: Path) -> None:
    store = _store_with_video(tmp_path, fps=10.0)  # 40 frames (0..3.9 s), segment [0, 4.0)
    _drop_clock(store)  # a declared clock defines the extent even when it is not exported
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--keep-order",
                 "--set", "include=[cam_high]", "--set", "streams.cam_high.duration_s=0.2"]) == 0
    keys = sorted(_samples(out))
    assert keys == [f"ep_{e:04d}_{a:06d}" for e in range(2) for a in range(40)]  # grid 10 Hz over 0..3.9 s


def test_camera_only_extent_keeps_the_last_frame_of_a_ms_clock(tmp_path: Path) -> None:
    """Matroska/webm store pts in ms: 18 frames at 15 fps put the last at 1.133 s while its grid point
    is 1.1333... s. A camera-only extent ends at the last frame, so the grid must count a point within
    the camera clock's resolution (one time-base step) of it: 18 windows, the last showing frame 17."""
    from robowds.export.media.encode import encode_frames

    store = tmp_path / "s"
    write_synthetic_store(store, episodes=1, seed=0)
    times = np.arange(18) / 15.0  # pts 0, 67, 133, ..., 1133 ms
    frames = np.zeros((18, 16, 16, 3), dtype=np.uint8)
    frames[:, :, :, 0] = (np.arange(18) * 10)[:, None, None]  # frame k is red k * 10 (FFV1: lossless)
    encode_frames(frames, times, store / "media" / "cam.mkv")
    video = pa.array([{"path": "media/cam.mkv", "fps": 15.0, "start_s": None, "end_s": None}])
    pq.write_table(pa.table({"episode_id": ["ep_0000"], "cam_high": video}), store / "videos.parquet")
    _drop_clock(store)
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--keep-order", "--fps", "15",
                 "--set", "include=[cam_high]", "--set", "streams.cam_high.duration_s=0.1",
                 "--set", "streams.cam_high.encoding=raw", "--set", "streams.cam_high.rate_hz=10"]) == 0
    samples = _samples(out)
    assert sorted(samples) == [f"ep_0000_{a:06d}" for a in range(18)]
    last = samples["ep_0000_000017"]
    assert last["cam_high"][0, 0, 0, 0] == 170 and bool(last["cam_high_mask"][0])
