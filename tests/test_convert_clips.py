"""`robowds convert clips` on the vendored real webm (VP9 + 5.1 Opus, first pts 7 ms, pts in ms, the first
36.74 s of the physicsworks lecture clip): exported frames equal the frames PyAV decodes from the source
at the grid times, every segment keeps all its windows (its last frame included), texts per episode, the
audio track left out, the store identical for 1 and 2 workers, and each bad input one message."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from functools import lru_cache
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robowds.export.cli.main import main
from robowds.export.convert.clips.labels import LabelOptions, Record, parse_csv, parse_json, to_labels
from robowds.export.convert.clips.segments import Segment, file_segment, grid_extent
from robowds.export.core.windows import grid_frame_count
from robowds.export.media.frames import select_frames
from robowds.export.store.validate import validate_store

from exports import export_members, npy
from realdata import real_path
from videos import to_rgb

CLIP = "webm_vp9_real_clip_physicsworks"
VIDEO = "videos/physicsworks.webm"
FPS = 15.0
FRAMES = 551  # video frames in the vendored cut (pts 0.007 .. 36.674 s)
ITEM_000 = {"frames": (311, 551), "text": "Holding ball in front of chest"}  # labels.json [20.74, 36.74) s
# authored for the tests: starts mid-GOP, 7 ms before a frame; its last frame (8.940 s) lies 0.33 ms before
# its 15 fps grid point, the case whose last window a camera-only extent used to lose
MID = {"id": "lecture_3s_9s", "video": VIDEO, "start": 3.0, "end": 9.0,
       "label": "Lecturer walking along the blackboard", "template": "Walking along [something]",
       "placeholders": ["blackboard"]}
MID_FRAMES = (45, 135)


def clip(*parts: str) -> Path:
    """A path inside the vendored clip folder (the folder itself when no parts)."""
    return real_path(CLIP, *parts)


@lru_cache(maxsize=1)
def source_pts() -> np.ndarray:
    """[F] presentation times (s) of the source's decoded frames, with PyAV."""
    with av.open(str(clip(VIDEO))) as container:
        base = container.streams.video[0].time_base
        return np.array([float(f.pts * base) for f in container.decode(video=0)])


def source_frames(wanted: set[int]) -> dict[int, np.ndarray]:
    """Decoded RGB frames [H, W, 3] of the source by index, only those `wanted` (memory)."""
    with av.open(str(clip(VIDEO))) as container:
        frames = [(i, f) for i, f in enumerate(container.decode(video=0)) if i in wanted]
    return {i: rgb for (i, _), rgb in zip(frames, to_rgb(f for _, f in frames))}


def item_000() -> dict:
    return json.loads(clip("labels.json").read_text())["items"][0]


def convert(*args: str) -> int:
    return main(["convert", "clips", *map(str, args), "--quiet", "--workers", "1"])


def export(store: Path, out: Path, *sets: str, stride: int = 1) -> dict[str, dict[str, bytes]]:
    options = [x for s in sets for x in ("--set", s)]
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--fps", "15", "--keep-order",
                 "--stride", str(stride), "--set", "window.duration_s=0.0666666666666667",
                 "--set", "window.rate_hz=15", "--set", "shard.min_shards=1", *options]) == 0
    return export_members(out)


def windows(samples: dict[str, dict[str, bytes]], episode: str) -> list[dict[str, bytes]]:
    keys = sorted(k for k in samples if k.rsplit("_", 1)[0] == episode)
    assert keys == [f"{episode}_{k:06d}" for k in range(len(keys))]
    return [samples[k] for k in keys]


@pytest.fixture(scope="module")
def json_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("clips")
    (root / "labels.json").write_text(json.dumps({"items": [item_000(), MID]}))
    assert convert(clip(), root / "store", "--labels", root / "labels.json") == 0
    return root / "store"


def test_vendored_clip_is_the_recorded_cut_and_nothing_else() -> None:
    listed = dict(line.split("  ", 1)[::-1] for line in clip("SHA256SUMS").read_text().splitlines())
    for name, digest in listed.items():
        assert hashlib.sha256(clip(name).read_bytes()).hexdigest() == digest, name
    present = {p.relative_to(clip()).as_posix() for p in clip().rglob("*") if p.is_file()}
    assert present == set(listed) | {"SHA256SUMS", "PROVENANCE.md"}
    pts = source_pts()
    assert len(pts) == FRAMES and pts[0] == 0.007 and pts[-1] == 36.674  # first pts 7 ms kept


def test_json_labels_map_to_segments_texts_and_extents(json_store: Path) -> None:
    report = json.loads((json_store / "convert_report.json").read_text())
    assert (report["format"], report["episodes"], report["skipped"]) == ("clips", 2, [])
    assert report["not_converted"] == ["placeholders"]
    assert report["notes"] == [f"{VIDEO}: not converted: audio opus 5.1 (a store has no audio kind; the first "
                               "video stream is the field)"]  # the audio track is ignored, and said so
    rows = {r["episode_id"]: r for r in pq.read_table(json_store / "episodes.parquet").to_pylist()}
    first, mid = rows["physicsworks_000"], rows["lecture_3s_9s"]
    assert first["video"] == {"path": f"media/video/{VIDEO}", "fps": 15.0, "start_s": 20.74, "end_s": 36.74,
                              "clock_offset_s": None}
    assert (first["text"], first["template"]) == (ITEM_000["text"], "Holding [something] in front of [something]")
    assert (mid["text"], mid["template"]) == ("Lecturer walking along the blackboard", "Walking along [something]")
    assert mid["video"]["start_s"] == 3.0 and mid["video"]["end_s"] == 9.0
    assert mid["start_s"] == pytest.approx(0.007) and mid["end_s"] == pytest.approx(0.007 + 89 / 15, abs=1e-12)
    link = json_store / "media" / "video" / VIDEO
    assert link.is_symlink() and link.resolve() == clip(VIDEO).resolve()  # referenced, not copied
    assert str(clip()) in (json_store / "store.yaml").read_text()  # media_roots
    assert validate_store(json_store).exportable


def test_exported_frames_are_the_source_frames_at_the_grid_times(json_store: Path, tmp_path: Path) -> None:
    """One window per frame of each segment, its last frame included; window k holds the source frame
    nearest to the segment's first frame + k / 15 s, as PyAV decodes it (raw, bit for bit)."""
    samples = export(json_store, tmp_path / "out", "streams.video.encoding=raw")
    pts = source_pts()
    expected = {"physicsworks_000": (20.74, 36.74, ITEM_000), "lecture_3s_9s": (3.0, 9.0, {"text": MID["label"]})}
    wanted = set(range(*ITEM_000["frames"])) | set(range(*MID_FRAMES))
    frames = source_frames(wanted)
    for episode, (start, end, item) in expected.items():
        inside = np.flatnonzero((pts >= start) & (pts < end))  # the segment's frames, half-open
        got = windows(samples, episode)
        assert len(got) == len(inside)  # every frame has its window: none lost at the end
        for k, sample in enumerate(got):
            grid = pts[inside[0]] + k / FPS  # file time of grid point k
            nearest = int(np.argmin(np.abs(pts - grid)))
            assert nearest == inside[k] and abs(pts[nearest] - grid) < 0.001
            np.testing.assert_array_equal(npy(sample["video.npy"])[0], frames[nearest])
            assert sample["text.txt"] == item["text"].encode()
            assert json.loads(sample["meta.json"])["t"] == pytest.approx(pts[inside[0]] - start + k / FPS, abs=1e-8)
    assert (len(windows(samples, "physicsworks_000")), len(windows(samples, "lecture_3s_9s"))) == (240, 90)
    assert all(set(s) == {"meta.json", "text.txt", "template.txt", "video.npy", "video_mask.npy"}
               for s in samples.values())  # no audio member


def test_csv_labels_in_frames_and_whole_clips(json_store: Path, tmp_path: Path) -> None:
    """CSV labels: frame numbers select the same frames as the seconds of the JSON labels, a label without
    start/end is the whole clip, ids come from the file stem; every episode keeps all its windows."""
    with (tmp_path / "labels.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["file", "start", "end", "text"])
        writer.writerow([VIDEO, *ITEM_000["frames"], ITEM_000["text"]])
        writer.writerow([VIDEO, *MID_FRAMES, "Lecturer, walking along the blackboard"])
        writer.writerow([VIDEO, "", "", "The whole cut"])
    assert convert(clip(), tmp_path / "store", "--labels", tmp_path / "labels.csv", "--time-unit", "frames",
                   "--video-field", "cam", "--text-field", "caption") == 0
    rows = pq.read_table(tmp_path / "store" / "episodes.parquet").to_pylist()
    assert [r["episode_id"] for r in rows] == ["physicsworks_0", "physicsworks_1", "physicsworks_2"]
    assert [r["caption"] for r in rows] == [ITEM_000["text"], "Lecturer, walking along the blackboard", "The whole cut"]
    pts = source_pts()
    assert [(r["cam"]["start_s"], r["cam"]["end_s"]) for r in rows] == [  # the frames' pts (to float rounding)
        (pytest.approx(pts[311], abs=1e-12), None), (pytest.approx(pts[45], abs=1e-12),
                                                     pytest.approx(pts[135], abs=1e-12)), (None, None)]
    by_seconds = {r["episode_id"]: r for r in pq.read_table(json_store / "episodes.parquet").to_pylist()}
    for row, same in zip(rows, ("physicsworks_000", "lecture_3s_9s")):
        other = by_seconds[same]
        assert row["end_s"] - row["start_s"] == pytest.approx(other["end_s"] - other["start_s"], abs=1e-9)
    samples = export(tmp_path / "store", tmp_path / "out", "streams.cam.resize=[16,12]")
    assert [len(windows(samples, e)) for e in ("physicsworks_0", "physicsworks_1", "physicsworks_2")] == \
        [240, 90, FRAMES]
    assert windows(samples, "physicsworks_2")[-1]["caption.txt"] == b"The whole cut"


def test_the_store_is_identical_for_one_and_two_workers(tmp_path: Path) -> None:
    (tmp_path / "labels.json").write_text(json.dumps([item_000(), MID, {**MID, "id": "again", "start": 1.0}]))
    stores = []
    for workers in ("1", "2"):
        store = tmp_path / f"store{workers}"
        assert main(["convert", "clips", str(clip()), str(store), "--labels", str(tmp_path / "labels.json"),
                     "--quiet", "--workers", workers]) == 0
        stores.append(store)

    def listing(store: Path) -> dict[str, bytes | str]:
        return {p.relative_to(store).as_posix(): os.readlink(p) if p.is_symlink() else p.read_bytes()
                for p in sorted(store.rglob("*")) if p.is_symlink() or p.is_file()}

    one, two = listing(stores[0]), listing(stores[1])
    assert one.keys() == two.keys() and {"episodes.parquet", "store.yaml", f"media/video/{VIDEO}"} <= set(one)
    assert one == two


def test_skip_bad_converts_the_segment_inside_the_cut_and_lists_the_others(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The vendored labels.json, unchanged: items 001-003 lie after the 36.74 s cut."""
    assert convert(clip(), tmp_path / "store", "--skip-bad") == 0
    out = capsys.readouterr().out
    assert "converted 1 episodes" in out and "skipped 3" in out
    report = json.loads((tmp_path / "store" / "convert_report.json").read_text())
    assert [s["episode"] for s in report["skipped"]] == [f"episode 'physicsworks_00{i}'" for i in (1, 2, 3)]
    assert [s["reason"].split(": ", 1)[0] for s in report["skipped"]] == [
        f"labels.json item {i} (episode 'physicsworks_00{i}', video {VIDEO})" for i in (1, 2, 3)]
    assert all("is outside the video" in s["reason"] for s in report["skipped"])


def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def _labels(tmp_path: Path, items: list[dict]) -> list[str]:
    return ["--labels", str(_write(tmp_path / "labels.json", json.dumps(items)))]


BAD = {  # name -> (SRC set-up, extra args) builder, expected message
    "segment outside the video": (lambda t: (clip(), []), "labels.json item 1 (episode 'physicsworks_001', video "
                                  f"{VIDEO}): segment [52.74, 67.54) s is outside the video"),
    "missing video": (lambda t: (clip(), _labels(t, [{**MID, "video": "videos/gone.webm"}])),
                      "labels.json item 0 (episode 'lecture_3s_9s', video videos/gone.webm): the video "),
    "unparseable JSON": (lambda t: (clip(), ["--labels", str(_write(t / "labels.json", '{"items": [{"id": 1,'))]),
                         "labels file labels.json is not valid JSON"),
    "unparseable CSV": (lambda t: (clip(), ["--labels", str(_write(t / "l.csv", f"id,video\na,{VIDEO},extra\n"))]),
                        "l.csv line 2: more cells (3) than header columns (2)"),
    "path escape": (lambda t: (clip(), _labels(t, [{**MID, "video": "../webm_vp9_real_clip_physicsworks/x.webm"}])),
                    "labels.json item 0 (episode 'lecture_3s_9s'): video "
                    "'../webm_vp9_real_clip_physicsworks/x.webm' is not a path inside SRC"),
    "link escape": (lambda t: (_escape(t), ["--labels", str(_write(t / "labels.json", json.dumps(
        [{**MID, "video": "link.webm"}])))]), "outside SRC"),
    "no labels file": (lambda t: (t, []), "has neither labels.json nor labels.csv"),
    "duplicate id": (lambda t: (clip(), _labels(t, [MID, MID])),
                     "labels.json item 1 (episode 'lecture_3s_9s'): the id is already used by labels.json item 0"),
    "no text": (lambda t: (clip(), _labels(t, [{"id": "a", "video": VIDEO}])),
                "labels.json item 0 (episode 'a'): no text: the record has no text/label/template"),
    "frames outside": (lambda t: (clip(), [*_labels(t, [{"id": "a", "video": VIDEO, "start": 500, "end": 600,
                                                          "text": "x"}]), "--time-unit", "frames"]),
                       "frames [500, 600) are outside the video, which has frames [0, 551)"),
    "two start keys": (lambda t: (clip(), _labels(t, [{**MID, "start_s": 1.0}])), "both start and start_s are given"),
    "seconds with --time-unit frames": (lambda t: (clip(), ["--time-unit", "frames"]),
                                        "labels.json item 0 (episode 'physicsworks_000'): start_s is not in the "
                                        "unit of --time-unit frames"),
    "not a video": (lambda t: (_not_a_video(t), []), "clip.webm cannot be read as a video"),
}


def _not_a_video(tmp_path: Path) -> Path:
    """A SRC (SSv2 style: ids only, `<id>.webm`) whose one video is not a video."""
    _write(tmp_path / "src" / "labels.csv", "id,text\nclip,hello\n")
    _write(tmp_path / "src" / "clip.webm", b"\x1aE\xdf\xa3 not a webm")
    return tmp_path / "src"


def _escape(tmp_path: Path) -> Path:
    """A SRC whose video is a symlink to a file outside it."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "link.webm").symlink_to(clip(VIDEO))
    return tmp_path / "src"


@pytest.mark.parametrize("name", sorted(BAD))
def test_each_bad_input_is_one_message_naming_file_and_episode(name: str, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    setup, message = BAD[name]
    src, extra = setup(tmp_path)
    assert convert(src, tmp_path / "store", *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("robowds convert: error: ") and message in err, err
    assert "\n  fix: " in err and "Traceback" not in err and err.count("error:") == 1
    assert not (tmp_path / "store").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".store")]  # no work folder left


def test_bad_options_are_refused_before_anything_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert convert(clip(), tmp_path / "s", "--video-field", "Cam.High") == 2
    assert "--video-field 'Cam.High' is not a usable field name" in capsys.readouterr().err
    assert convert(clip(), tmp_path / "s", "--text-field", "video") == 2
    assert "--video-field and --text-field are both 'video'" in capsys.readouterr().err
    assert convert(clip(), tmp_path / "s", "--fps", "0") == 2
    assert "--fps must be > 0" in capsys.readouterr().err


# --- the pure pieces: label parsing and segment mapping ---------------------------------------------------

ids = st.text("abcxyz019_-", min_size=1, max_size=8)
texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1,
                max_size=20).filter(lambda s: s.strip() == s and s != "")


@st.composite
def records(draw: st.DrawFn) -> list[dict]:
    """Label records with distinct ids, some segments, some whole clips (seconds to the ms)."""
    out = []
    for episode_id in draw(st.lists(ids, min_size=1, max_size=6, unique=True)):
        start = draw(st.none() | st.integers(0, 10_000).map(lambda ms: ms / 1000))
        end = draw(st.none() | st.integers(1, 5_000).map(lambda ms: (start or 0.0) + ms / 1000))
        item = {"id": episode_id, "video": draw(st.sampled_from(["a.webm", "sub/b.mp4"])), "label": draw(texts)}
        item.update({k: v for k, v in (("start", start), ("end", end)) if v is not None})
        out.append(item)
    return out


@settings(max_examples=60, deadline=None)
@given(records())
def test_json_and_csv_labels_parse_to_the_same_labels(items: list[dict]) -> None:
    header = ["id", "video", "start", "end", "label"]
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerows([header, *([x.get(k, "") for k in header] for x in items)])
    as_json = parse_json(json.dumps({"_note": "n", "items": items}), "l.json")
    from_json, bad_json = to_labels(as_json, LabelOptions(), {})
    from_csv, bad_csv = to_labels(parse_csv(text.getvalue(), "l.csv"), LabelOptions(), {})
    assert bad_json == bad_csv == []
    key = [(lb.episode_id, lb.file, lb.start, lb.end, lb.text) for lb in from_json]
    assert key == [(lb.episode_id, lb.file, lb.start, lb.end, lb.text) for lb in from_csv]
    assert key == [(x["id"], x["video"], x.get("start"), x.get("end"), x["label"]) for x in items]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["a.webm", "b.webm"]), min_size=1, max_size=6),
       st.lists(st.integers(0, 9), min_size=6, max_size=6))
def test_ids_without_an_id_column_are_file_stems_and_unique(files: list[str], starts: list[int]) -> None:
    records_ = [Record(f"item {i}", {"file": f, "start": s, "text": "t"})
                for i, (f, s) in enumerate(zip(files, starts))]
    labels, bad = to_labels(records_, LabelOptions(), {})
    assert bad == [] and len({lb.episode_id for lb in labels}) == len(files)
    for lb in labels:
        stem = lb.file.removesuffix(".webm")
        assert lb.episode_id == stem if files.count(lb.file) == 1 else lb.episode_id.startswith(stem + "_")


@st.composite
def ms_videos(draw: st.DrawFn) -> tuple[np.ndarray, float]:
    """pts [F] of a constant-rate video stored in whole milliseconds (webm), from a first pts >= 0."""
    fps = draw(st.sampled_from([5.0, 10.0, 12.0, 15.0, 24.0, 25.0, 29.97, 30.0, 50.0, 60.0]))
    count = draw(st.integers(1, 400))
    first = draw(st.integers(0, 5000)) / 1000
    exact = first + np.arange(count) / fps  # [F]
    return np.round(exact * 1000) * 0.001, fps  # as probe_video computes them: pts * time_base


@settings(max_examples=200, deadline=None)
@given(ms_videos(), st.data())
def test_every_segment_gets_one_grid_point_per_frame(video: tuple[np.ndarray, float], data: st.DataObject) -> None:
    """For any segment of a ms-rounded constant-rate video, given in frames or in seconds (the first
    frame's time to the ms, as labels are written), the segment holds exactly its frames, and the export's
    own grid count and nearest-frame choice give one window per frame, frame k at grid point k."""
    pts, fps = video
    lo = data.draw(st.integers(0, len(pts) - 1))
    hi = data.draw(st.integers(lo + 1, len(pts)))
    by_frames = file_segment(lo, hi, "frames", pts, fps)
    end_s = None if hi == len(pts) else round(float(pts[hi]), 3)
    by_seconds = file_segment(round(float(pts[lo]), 3), end_s, "s", pts, fps)
    for segment in (by_frames, by_seconds):
        assert (segment.lo, segment.hi) == (lo, hi)
        start, end = grid_extent(pts, segment, fps, 0.001)
        assert grid_frame_count(start, end, fps, float(np.spacing(max(abs(start), abs(end))))) == hi - lo
        episode_t = pts[lo:hi] - (segment.start_s or 0.0)  # [n]
        grid = start + np.arange(hi - lo) / fps  # [n]
        index, valid = select_frames(episode_t, grid)
        assert valid.all() and index.tolist() == list(range(hi - lo))
        assert end >= episode_t[-1] - 0.001 and end <= episode_t[-1] + 0.001


@settings(max_examples=100, deadline=None)
@given(ms_videos(), st.floats(-100, 100), st.floats(0.001, 100))
def test_a_segment_in_seconds_is_inside_or_refused(video: tuple[np.ndarray, float], start: float,
                                                   length: float) -> None:
    """A segment in seconds either holds frames all inside it or is refused; never an empty segment."""
    from robowds.export.convert.clips.segments import SegmentError

    pts, fps = video
    try:
        segment = file_segment(start, start + length, "s", pts, fps)
    except SegmentError:
        return
    assert isinstance(segment, Segment) and segment.hi > segment.lo
    held = pts[segment.lo:segment.hi]
    assert held[0] >= start - 1e-6 and held[-1] < start + length - 1e-6 + 1e-12


def test_templates_are_filled_with_placeholders_when_they_are_the_text() -> None:
    labels, _ = to_labels([Record("r", {"id": "1", "file": "a.webm", "template": "Putting [something] on [x]",
                                        "placeholders": ["a pen", "a mug"]})], LabelOptions(), {})
    assert (labels[0].text, labels[0].template) == ("Putting a pen on a mug", "Putting [something] on [x]")
    labels, bad = to_labels([Record("r", {"id": "78687", "label": "x"})], LabelOptions(),
                            {"78687": ["20bn/78687.webm"]})
    assert bad == [] and labels[0].file == "20bn/78687.webm"  # SSv2: ids only, files <id>.webm

