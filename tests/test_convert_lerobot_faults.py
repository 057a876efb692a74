"""Malformed LeRobot metadata never converts silently and never crashes (issue 22, items 2-4): each
corruption of a copy of the vendored real data, through the CLI, is one error (exit 2, no store) or one
warning (exit 0, in the report too) naming the file, the episode and the fix, and never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.main import main

from realdata import g1, real_path

CAMERA = "observation.images.cam_high"
REACHY2 = "lerobot_v30_reachy2_apple_storage_rerun"


def _info(src: Path, change: Callable[[dict], None]) -> None:
    info = json.loads((src / "meta" / "info.json").read_text())
    change(info)
    (src / "meta" / "info.json").write_text(json.dumps(info))


def _table(path: Path, change: Callable[[pa.Table], pa.Table]) -> None:
    pq.write_table(change(pq.read_table(path)), path)


def _episode(src: Path, index: int) -> Path:
    return src / "data" / "chunk-000" / f"episode_{index:06d}.parquet"


def _drop_frame_index_and_skip_a_frame(src: Path) -> None:
    _info(src, lambda info: info["features"].pop("frame_index"))
    for index in (1, 2):
        def change(t: pa.Table, late: bool = index == 1) -> pa.Table:
            ts = t["timestamp"].to_numpy().copy()
            if late:
                ts[5:] += 1 / 30  # a dropped frame between rows 4 and 5
            return t.drop(["frame_index"]).set_column(t.schema.get_field_index("timestamp"), "timestamp", pa.array(ts))
        _table(_episode(src, index), change)


def _cut_last_line(src: Path) -> None:
    path = src / "meta" / "episodes.jsonl"
    text = path.read_text()
    path.write_text(text[:text.rindex("\n", 0, -1) + 50])  # the last line cut after 49 characters


def _unlist_episode_2(src: Path) -> None:
    path = src / "meta" / "episodes.jsonl"
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines() if '"episode_index": 2,' not in line))


def _shift_v3_episodes(src: Path) -> None:
    _table(src / "data" / "chunk-000" / "file-000.parquet",
           lambda t: t.set_column(t.schema.get_field_index("episode_index"), "episode_index",
                                  pc.add(t["episode_index"], 10)))


def _stray_v3_file(src: Path) -> None:
    shutil.copyfile(src / "data" / "chunk-000" / "file-000.parquet", src / "data" / "chunk-000" / "file-001.parquet")


def _no_videos(src: Path) -> None:
    shutil.rmtree(src / "videos")


FIX_FPS = ("set `fps` in meta/info.json to the rate the dataset was recorded at (e.g. 30), or download "
           "meta/info.json again")
G1_DATA = "data/chunk-000/episode_00000{}.parquet"
# (source, corruption, extra arguments, exit code, stderr's lines: `{src}` is the copy's folder). Errors
# where the store would be wrong or meta cannot be read; a warning only where meta is readable and what it
# lists converts right (a data file meta does not list: LeRobot itself loads only what meta lists).
CASES = {
    "fps 0": ("g1", lambda s: _info(s, lambda i: i.update(fps=0)), [], 2, [
        "robowds convert: error: {src}/meta/info.json: fps must be a positive number of frames per second, got 0",
        f"  fix: {FIX_FPS}"]),
    "fps thirty": ("g1", lambda s: _info(s, lambda i: i.update(fps="thirty")), [], 2, [
        "robowds convert: error: {src}/meta/info.json: fps must be a positive number of frames per second, got "
        "'thirty'", f"  fix: {FIX_FPS}"]),
    "no features": ("g1", lambda s: _info(s, lambda i: i.pop("features")), [], 2, [
        "robowds convert: error: {src}/meta/info.json: no `features` (absent): nothing to convert",
        "  fix: download meta/info.json again (LeRobot lists every feature there)"]),
    "chunks_size 0": ("g1", lambda s: _info(s, lambda i: i.update(chunks_size=0)), [], 2, [
        "robowds convert: error: {src}/meta/info.json: chunks_size must be a positive integer, got 0",
        "  fix: set `chunks_size` in meta/info.json (LeRobot's default is 1000)"]),
    "a feature's column absent": ("g1", lambda s: _table(_episode(s, 2), lambda t: t.drop(["action"])), [], 2, [
        f"robowds convert: error: episode 2: {G1_DATA.format(2)} has no column 'action' (a feature meta/info.json "
        "lists)", "  fix: download the data file again, or convert without it: --exclude action"]),
    "a feature's column of text": ("g1", lambda s: _table(_episode(s, 2), lambda t: t.set_column(
        t.schema.get_field_index("action"), "action", pa.array(["x"] * len(t)))), [], 2, [
        f"robowds convert: error: episode 2: {G1_DATA.format(2)}: column 'action' holds string values, not the "
        "float32 meta/info.json declares", "  fix: download the data file again, or convert without it: "
                                           "--exclude action"]),
    "empty timestamps": ("g1", lambda s: _table(_episode(s, 2), lambda t: t.set_column(
        t.schema.get_field_index("timestamp"), "timestamp", pa.nulls(len(t), pa.float32()))), [], 2, [
        f"robowds convert: error: episode 2: {G1_DATA.format(2)}: column 'timestamp' holds 343 empty values or is "
        "not numeric (float)", "  fix: download the data file again"]),
    "episodes.jsonl cut short": ("g1", _cut_last_line, [], 2, [
        "robowds convert: error: {src}/meta/episodes.jsonl line 100 is not JSON (Unterminated string starting at: "
        "line 1 column 33 (char 32)): '{{\"episode_index\": 99, \"tasks\": [\"Pick up the yell'",
        "  fix: download the dataset's meta/ folder again (the same revision as its data/)"]),
    "a data file meta does not list": ("g1", _unlist_episode_2, [], 0, [
        f"robowds convert: warning: {G1_DATA.format(2)} (episode 2) is listed in no meta/episodes.jsonl entry: not "
        "converted", "  fix: download meta/episodes.jsonl again if the episode belongs to the dataset, or move the "
                     "file out of data/ if it was dropped on purpose"]),
    "a v3 data file meta does not name": ("reachy2", _stray_v3_file, ["--exclude", "observation.image"], 0, [
        "robowds convert: warning: data/chunk-000/file-001.parquet is named by no episode in meta/episodes: not "
        "converted", "  fix: download the dataset's meta/ folder again (the same revision as its data/), or move "
                     "the file out of data/"]),
    "a record without episode_index": ("g1", lambda s: (s / "meta" / "episodes.jsonl").write_text(
        '{"episode_index": 1, "tasks": []}\n{"tasks": ["x"], "length": 3}\n'), [], 2, [
        "robowds convert: error: {src}/meta/episodes.jsonl: record 2 has no valid episode_index (None)",
        "  fix: download the dataset's meta/ folder again (the same revision as its data/)"]),
    "a task_index tasks.jsonl does not list": ("g1", lambda s: (s / "meta" / "tasks.jsonl").write_text(
        '{"task_index": 5, "task": "another task"}\n'), [], 2, [
        f"robowds convert: error: episode 1: {G1_DATA.format(1)} has task_index [0] that meta/tasks.jsonl does not "
        "list", "  fix: download the dataset's meta/ folder again"]),
    "fps 15 for 30 Hz timestamps": ("g1", lambda s: _info(s, lambda i: i.update(fps=15)), [], 2, [
        f"robowds convert: error: episode 1: {G1_DATA.format(1)}: its timestamps step 0.0333333 s (30 Hz) but "
        "meta/info.json says fps 15",
        "  fix: set `fps` in meta/info.json to 30 if the timestamps are right, else download the data file again"]),
    "no frame_index, irregular timestamps": ("g1", _drop_frame_index_and_skip_a_frame, [], 2, [
        f"robowds convert: error: episode 1: {G1_DATA.format(1)} has no frame_index column and its timestamps are "
        "not regular (row 4 -> 5 steps 0.0666667 s, 1/fps is 0.0333333 s): the row order cannot stand for the "
        "frame index", "  fix: add a frame_index column to the data files (LeRobot writes one)"]),
    "v3 rows of other episodes": ("reachy2", _shift_v3_episodes, ["--exclude", "observation.image"], 2, [
        "robowds convert: error: episode 0: data/chunk-000/file-000.parquet holds 0 rows with episode_index 0 where "
        "meta/episodes says 299 (the file's rows are of episodes 10, 11, 12)",
        "  fix: meta/ and data/ are of different revisions: download both again"]),
    "no data file": ("g1", lambda s: shutil.rmtree(s / "data"), [], 2, [
        "robowds convert: error: {src}: no episodes to convert (100 skipped; the first: episode 0: "
        "data/chunk-000/episode_000000.parquet is missing)",
        "  fix: check that SRC is the dataset's root folder and holds its data files"]),
    "every camera file missing": ("g1", _no_videos, [], 2, [
        "robowds convert: error: {src}: 2 video files missing (by camera: the file and the episodes in it):",
        f"    {CAMERA}: videos/chunk-000/{CAMERA}/episode_000001.mp4 (episode 1)",
        f"    {CAMERA}: videos/chunk-000/{CAMERA}/episode_000002.mp4 (episode 2)",
        f"  fix: download the dataset's videos/ too, convert without the camera(s) with --exclude {CAMERA}, or pass "
        "--skip-bad to convert the other episodes"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_metadata_is_one_error_or_warning_naming_file_episode_and_fix(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    source, corrupt, args, code, lines = CASES[case]
    src, store = tmp_path / "src", tmp_path / "store"
    shutil.copytree(g1() if source == "g1" else real_path(REACHY2), src)
    corrupt(src)
    assert main(["convert", "lerobot", str(src), str(store), "--quiet", "--workers", "1", *args]) == code
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [line.format(src=src) for line in lines]  # no traceback, nothing else
    if code:
        assert not store.exists()
        return
    report = json.loads((store / "convert_report.json").read_text())
    message = lines[0].split("warning: ", 1)[1]
    assert report["warnings"] == [{"message": message, "fix": lines[1][len("  fix: "):]}]
    assert report["episodes"] == (1 if source == "g1" else 3)  # the unnamed file left out, the rest converted
    assert [s for s in report["skipped"] if s["reason"] == message] == [
        {"episode_index": 2, "reason": message} if source == "g1" else
        {"episode": "data/chunk-000/file-001.parquet", "reason": message}]
