"""Video segments are half-open [start_s, end_s) and the episode extent follows one rule in validate
and export (issue 9, items 1 and 2): no frame of the next episode leaks into a window, no extra
all-padding anchor, and validate's durations are the export's."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.main import main
from robowds.export.core.extent import ExtentError, episode_extent, in_segment, segment_frames, segment_span
from robowds.export.store.validate import validate_store

from realdata import G1_EPISODES, g1_parquet, g1_video
from videos import gradient_frames, write_frames

VIDEO_TYPE = pa.struct([("path", pa.string()), ("fps", pa.float64()), ("start_s", pa.float64()),
                        ("end_s", pa.float64())])


def _samples(out: Path) -> dict[str, dict]:
    from robowds.reader import ShardDataset
    return {s["__key__"]: s for s in ShardDataset(out, "train", shuffle=False)}


def _export(store: Path, out: Path, *sets: str) -> None:
    args = ["export", str(store), str(out), "--quiet", "--workers", "1", "--keep-order",
            "--set", "streams.cam.encoding=raw"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0


def _flat_frames(values: list[int], size: int = 16) -> np.ndarray:
    """[F, size, size, 3] uint8, frame i a flat image of values[i] (lossless png keeps it exact)."""
    return np.stack([np.full((size, size, 3), v, dtype=np.uint8) for v in values])


# --- the repro: one mp4, 20 frames at 10 fps, frame i of value 10 * i, two segments ---

def _two_segment_store(root: Path, with_state: bool) -> Path:
    root.mkdir(parents=True)
    write_frames(root / "all.mp4", _flat_frames([10 * i for i in range(20)]), rate=10)
    video = pa.array([{"path": "all.mp4", "fps": 10.0, "start_s": 0.0, "end_s": 1.0},
                      {"path": "all.mp4", "fps": 10.0, "start_s": 1.0, "end_s": 2.0}], type=VIDEO_TYPE)
    columns = {"episode_id": ["ep0", "ep1"], "cam": video}
    if with_state:  # 10 Hz state over each episode's own 1 s, times from 0 (LeRobot style)
        t = np.arange(10) / 10.0
        state = np.column_stack([t, t]).tolist()
        columns["state"] = [state, state]
    pq.write_table(pa.table(columns), root / "episodes.parquet")
    return root


@pytest.mark.parametrize("with_state", [False, True], ids=["camera-only", "with-state"])
def test_segment_end_is_exclusive_no_frame_of_the_next_episode(tmp_path: Path, with_state: bool) -> None:
    store = _two_segment_store(tmp_path / "s", with_state)
    report = validate_store(store)
    assert report.exportable and not [p for p in report.problems if p.severity == "warning"], report.render()
    assert report.durations == pytest.approx({"ep0": 0.9, "ep1": 0.9})
    out = tmp_path / "out"
    _export(store, out, "streams.cam.duration_s=0.3")
    samples = _samples(out)
    assert sorted(samples) == [f"ep{e}_{a:06d}" for e in range(2) for a in range(10)]  # 10 windows each, not 11
    last = samples["ep0_000009"]  # steps at 0.9, 1.0, 1.1 s: 1.0 is ep1's first frame (value 100)
    assert last["cam_mask"].tolist() == [True, False, False]
    assert last["cam"][:, 0, 0, 0].tolist() == [90, 0, 0]
    first = samples["ep1_000000"]  # episode time 0 = file time 1.0
    assert first["cam"][:, 0, 0, 0].tolist() == [100, 110, 120] and first["cam_mask"].all()
    for key, sample in samples.items():  # no window of ep0 ever shows a frame of ep1, and vice versa
        values = sample["cam"][:, 0, 0, 0][sample["cam_mask"]]
        assert ((values < 100) if key.startswith("ep0") else (values >= 100)).all(), key
    if with_state:
        assert all(s["state_mask"].any() for s in samples.values())  # no anchor of all-padding state


def test_causal_selection_never_takes_the_next_episodes_frame(tmp_path: Path) -> None:
    store = _two_segment_store(tmp_path / "s", with_state=False)
    out = tmp_path / "out"
    _export(store, out, "streams.cam.duration_s=0.3", "streams.cam.selection=causal")
    last = _samples(out)["ep0_000009"]
    assert last["cam_mask"].tolist() == [True, False, False] and last["cam"][0, 0, 0, 0] == 90


# --- LeRobot v3's exact float values (copied as literals from the Reachy2 episodes metadata of the shared
# real data; nothing here reads a file) ---

LEROBOT_LENGTHS = [299, 300, 300]
LEROBOT_FROM = [0.0, 9.966666666666667, 19.96666666666667]  # videos/observation.image/from_timestamp
LEROBOT_TO = [9.966666666666667, 19.96666666666667, 29.96666666666667]  # .../to_timestamp


def _write_lerobot_video(path: Path, frames: np.ndarray) -> None:
    """30 fps with the 1/15360 time base FFmpeg's mp4 muxer picks for 30 fps (pts = 512 k), as LeRobot's."""
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("png", rate=30)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "rgb24"
        stream.time_base = Fraction(1, 15360)
        stream.codec_context.time_base = Fraction(1, 15360)
        for k, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = 512 * k, Fraction(1, 15360)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def test_lerobot_v3_exact_from_to_timestamps(tmp_path: Path) -> None:
    """Three episodes in one mp4 with LeRobot's from/to floats (frame times = pts * 1/15360)."""
    total = sum(LEROBOT_LENGTHS)
    assert LEROBOT_TO[-1] == pytest.approx(total / 30) and LEROBOT_FROM[1] == 299 / 30
    store = tmp_path / "s"
    store.mkdir()
    ids = np.arange(total)
    frames = np.zeros((total, 8, 8, 3), dtype=np.uint8)  # frame k: red = k % 256, green = k // 256
    frames[..., 0], frames[..., 1] = (ids % 256)[:, None, None], (ids // 256)[:, None, None]
    _write_lerobot_video(store / "file-000.mp4", frames)
    states, videos = [], []
    for n, lo, hi in zip(LEROBOT_LENGTHS, LEROBOT_FROM, LEROBOT_TO):
        t = np.arange(n) / 30.0  # LeRobot's float32 `timestamp` snapped to k / fps, as a converter does
        states.append(np.column_stack([t, np.arange(n)]).tolist())
        videos.append({"path": "file-000.mp4", "fps": 30.0, "start_s": lo, "end_s": hi})
    pq.write_table(pa.table({"episode_id": ["e0", "e1", "e2"], "state": states,
                             "cam": pa.array(videos, type=VIDEO_TYPE)}), store / "episodes.parquet")
    report = validate_store(store)
    assert report.exportable and not [p for p in report.problems if p.severity == "warning"], report.render()
    out = tmp_path / "out"
    _export(store, out, "fps=30", "window.duration_s=0.1")  # 3 steps at 30 Hz: anchor, +1, +2 frames
    samples = _samples(out)
    first_frame = np.cumsum([0] + LEROBOT_LENGTHS)
    for e, n in enumerate(LEROBOT_LENGTHS):
        keys = sorted(k for k in samples if k.startswith(f"e{e}_"))
        assert keys == [f"e{e}_{a:06d}" for a in range(n)]  # one window per frame, no extra anchor
        for a in (0, n - 3, n - 2, n - 1):
            s = samples[f"e{e}_{a:06d}"]
            real = a + np.arange(3) < n
            assert s["cam_mask"].tolist() == real.tolist() and s["state_mask"].tolist() == real.tolist(), (e, a)
            shown = s["cam"][:, 0, 0, 0].astype(int) + 256 * s["cam"][:, 0, 0, 1].astype(int)
            expected = np.where(real, first_frame[e] + a + np.arange(3), 0)
            assert shown.tolist() == expected.tolist(), (e, a)


# --- the extent: one rule for validate and export ---

def test_video_does_not_widen_an_episode_with_time_series(tmp_path: Path) -> None:
    """State from 0.05 s, video from 0.0 s: the grid starts at 0.05 in export and validate alike."""
    store = tmp_path / "s"
    store.mkdir()
    write_frames(store / "v.mp4", _flat_frames([10 * i for i in range(12)]), rate=10)
    t = 0.05 + np.arange(10) / 10.0  # 0.05 .. 0.95 s
    pq.write_table(pa.table({"episode_id": ["ep"], "state": [np.column_stack([t, t]).tolist()],
                             "cam": pa.array([{"path": "v.mp4", "fps": 10.0, "start_s": None, "end_s": None}],
                                             type=VIDEO_TYPE)}), store / "episodes.parquet")
    report = validate_store(store)
    assert report.durations == pytest.approx({"ep": 0.9})
    out = tmp_path / "out"
    _export(store, out, "window.duration_s=0.1")
    samples = _samples(out)
    assert sorted(samples) == [f"ep_{a:06d}" for a in range(10)]
    assert [json.loads(json.dumps(samples[f"ep_{a:06d}"]["meta"]))["t"] for a in (0, 9)] == [0.05, 0.95]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["report"]["duration_s"] == pytest.approx(sum(report.durations.values()))
    assert all(s["state_mask"].all() for s in samples.values())


def test_validate_and_export_durations_agree_on_the_synthetic_store(tmp_path: Path) -> None:
    from robowds.export.cli.synth import write_synthetic_store

    store = tmp_path / "s"
    write_synthetic_store(store, episodes=4, seed=3)
    report = validate_store(store)
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["report"]["duration_s"] == pytest.approx(sum(report.durations.values()), abs=1e-6)


def test_extent_rule() -> None:
    series = {"a": (0.05, 2.0), "b": (0.0, 1.5)}
    cams = [(-1.0, 3.0)]
    assert episode_extent(None, None, series, None, cams) == (0.0, 2.0)  # all series, never the cameras
    assert episode_extent(None, None, series, "a", cams) == (0.05, 2.0)  # the clock alone
    assert episode_extent(0.5, None, series, None, cams) == (0.5, 2.0)  # a declared bound wins
    assert episode_extent(None, None, {}, None, cams + [(-2.0, 1.0)]) == (-2.0, 3.0)  # camera-only
    assert episode_extent(1.0, 2.0, {}, None, []) == (1.0, 2.0)
    assert episode_extent(None, None, {}, None, []) == (0.0, 0.0)  # static fields only: one window
    with pytest.raises(ExtentError, match="ends"):
        episode_extent(3.0, 2.0, series, None, [])


def test_segment_is_half_open_within_float_noise() -> None:
    pts = np.arange(899) * 512 * (1 / 15360)  # file times as PyAV gives them: pts * time_base
    for lo, hi, n, first in zip(LEROBOT_FROM, LEROBOT_TO, LEROBOT_LENGTHS, [0, 299, 599]):
        assert segment_frames(pts, lo, hi) == (first, first + n)
        span = segment_span(pts, lo, hi, None)
        assert span[0] == pytest.approx(0.0, abs=1e-12) and span[1] == pytest.approx((n - 1) / 30, abs=1e-12)
    assert in_segment(np.array([0.0, 0.9, 1.0 - 1e-12, 1.0]), 0.0, 1.0).tolist() == [True, True, False, False]
    assert segment_span(pts, 40.0, 41.0, None) is None


def test_empty_segment_is_an_error_in_validate_and_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "s"
    store.mkdir()
    write_frames(store / "v.mp4", _flat_frames([10 * i for i in range(10)]), rate=10)
    t = np.arange(10) / 10.0
    pq.write_table(pa.table({"episode_id": ["ep"], "state": [np.column_stack([t, t]).tolist()],
                             "cam": pa.array([{"path": "v.mp4", "fps": 10.0, "start_s": 5.0, "end_s": 6.0}],
                                             type=VIDEO_TYPE)}), store / "episodes.parquet")
    assert main(["validate", str(store)]) == 1
    assert "segment [5.0, 6.0) s holds no frame of 'v.mp4'" in capsys.readouterr().out
    assert main(["export", str(store), str(tmp_path / "out"), "--quiet", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "episode 'ep'" in err and "holds no frame" in err


# --- the report's PSNR (issue 9, item 4) ---

def test_report_psnr_measures_real_frames_across_the_episode(tmp_path: Path) -> None:
    """With history offsets the first windows are all padding: measured there the PSNR was 100 dB
    (zeros against zeros). It must be the stored-vs-source PSNR of real frames, across the episode."""
    from robowds.reader import ShardDataset

    store = tmp_path / "s"
    store.mkdir()
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 24, (200, 32, 32, 3), dtype=np.uint8)
    frames = gradient_frames(200, 32, 32) // 2 + noise  # 20 s at 10 fps, known and a little noisy: jpg loses some
    write_frames(store / "v.mp4", frames, rate=10)  # png: decoded source == frames exactly
    pq.write_table(pa.table({"episode_id": ["ep"], "cam": pa.array(
        [{"path": "v.mp4", "fps": 10.0, "start_s": None, "end_s": None}], type=VIDEO_TYPE)}), store / "e.parquet")
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--set", "streams.cam.encoding=jpg",
                 "--set", "streams.cam.offset_s=-1.0", "--set", "streams.cam.duration_s=0.5"]) == 0
    video = json.loads((out / "manifest.json").read_text())["report"]["video"]["cam"]
    squared, count = 0.0, 0  # the PSNR over every real frame of every window, independently
    for s in ShardDataset(out, "train", shuffle=False):
        anchor, mask = s["meta"]["anchor"], s["cam_mask"]
        source = frames[np.clip(anchor - 10 + np.arange(5), 0, 199)][mask].astype(np.float64)
        squared += float(((s["cam"][mask].astype(np.float64) - source) ** 2).sum())
        count += source.size
    full = 10 * np.log10(255.0 ** 2 / (squared / count))
    assert 15 < full < 45
    assert video["psnr_db_min"] == pytest.approx(full, abs=1.0), (video, full)
    # one window in each of the 4 chunks of 64 anchors: the first with a real frame (anchor 6: 1 of 5
    # steps real), then 3 windows of 5 real frames
    assert video["psnr_frames"] == 1 + 3 * 5


# --- real data: LeRobot v2.1 per-episode files vs the same frames as one v3-style file with segments ---


def _concatenate(paths: list[Path], out: Path) -> list[int]:
    """Remux (no re-encode) the AV1 files one after the other into one mp4, as LeRobot v3 stores
    episodes; returns each file's frame count. Each file starts with a keyframe, so decoding is exact."""
    counts = []
    with av.open(str(out), "w", format="mp4") as dst:
        target, offset = None, 0
        for path in paths:
            with av.open(str(path)) as src:
                stream = src.streams.video[0]
                if target is None:
                    target = dst.add_stream("av1", rate=stream.average_rate)  # packets are copied, not encoded
                    target.time_base = stream.time_base
                    target.codec_context.width, target.codec_context.height = stream.width, stream.height
                    target.codec_context.extradata = stream.codec_context.extradata
                end, n = offset, 0
                for packet in src.demux(stream):
                    if packet.dts is None:
                        continue
                    packet.pts, packet.dts = packet.pts + offset, packet.dts + offset
                    end = max(end, packet.pts + packet.duration)
                    packet.stream = target
                    dst.mux(packet)
                    n += 1
                offset = end
                counts.append(n)
    return counts


def test_real_g1_video_as_one_file_with_segments_equals_per_episode_files(tmp_path: Path) -> None:
    episodes = list(G1_EPISODES)
    videos = [g1_video(e) for e in episodes]
    states = [pq.read_table(g1_parquet(e), columns=["frame_index"]).column(0).to_numpy() for e in episodes]
    stores = {"v21": tmp_path / "v21", "v30": tmp_path / "v30"}
    for store in stores.values():
        (store / "media").mkdir(parents=True)
    counts = _concatenate(videos, stores["v30"] / "media" / "all.mp4")
    assert counts == [len(s) for s in states] == [393, 343]  # one frame per parquet row
    bounds = np.cumsum([0] + counts) / 30.0  # LeRobot: from/to = frames before / through this episode / fps
    for e, (name, video) in enumerate(zip(episodes, videos)):
        (stores["v21"] / "media" / video.name).write_bytes(video.read_bytes())
    rows = {"v21": [], "v30": []}
    for e, name in enumerate(episodes):
        t = states[e] / 30.0
        state = np.column_stack([t, np.zeros_like(t)]).tolist()
        rows["v21"].append({"episode_id": name, "state": state, "cam": {
            "path": f"media/{name}.mp4", "fps": 30.0, "start_s": None, "end_s": None}})
        rows["v30"].append({"episode_id": name, "state": state, "cam": {
            "path": "media/all.mp4", "fps": 30.0, "start_s": float(bounds[e]), "end_s": float(bounds[e + 1])}})
    outs = {}
    for kind, store in stores.items():
        pq.write_table(pa.Table.from_pylist(rows[kind], schema=pa.schema(
            [("episode_id", pa.string()), ("state", pa.list_(pa.list_(pa.float64()))), ("cam", VIDEO_TYPE)])),
            store / "episodes.parquet")
        report = validate_store(store)
        assert report.exportable and not [p for p in report.problems if p.severity == "warning"], report.render()
        outs[kind] = tmp_path / f"out-{kind}"
        _export(store, outs[kind], "fps=30", "stride=7", "streams.cam.resize=[32, 24]",
                "streams.cam.rate_hz=30", "streams.cam.duration_s=0.2")
    a, b = _samples(outs["v21"]), _samples(outs["v30"])
    assert sorted(a) == sorted(b) and len(a) == sum(-(-n // 7) for n in counts)
    for key in a:
        assert a[key]["cam_mask"].tolist() == b[key]["cam_mask"].tolist(), key
        np.testing.assert_array_equal(a[key]["cam"], b[key]["cam"], err_msg=key)
    last = a[f"episode_000001_{counts[0] - 1 - (counts[0] - 1) % 7:06d}"]  # the first episode's last window
    assert not last["cam_mask"][-1]  # runs past its last frame: padding, not episode_000002's first frame
