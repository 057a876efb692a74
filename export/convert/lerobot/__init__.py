"""LeRobot v2.0 / v2.1 / v3.0 datasets -> an episode store, exactly.

Layout read (LeRobot's own documentation): `meta/info.json` (fps, features with dtype, shape and names,
`data_path` / `video_path` templates, `chunks_size`); v2.x: `meta/episodes.jsonl` (episode_index, tasks,
length) and one Parquet file and mp4 per episode; v3.0: `meta/episodes/chunk-*/file-*.parquet` (per
episode its data file and, per camera, its mp4 and segment), Parquet and mp4 files of many episodes.

Mapping (one store row per episode, `episode_id` = `episode_<index:06d>`):
- every numeric feature except LeRobot's bookkeeping columns -> a typed time series `{t, v}`:
  `t = frame_index / fps` in float64 (LeRobot's `timestamp` column is float32: ~2 us steps at 60 s, and
  its last frames would round onto the wrong grid point), `v` the values in their stored dtype; `names`
  (flat, or nested one level as LeRobot writes them) become the field's `names`. A table without
  `frame_index` (GR00T's v2.0 data) uses its row order, only where `timestamp` steps by 1/fps; a median
  `timestamp` step other than 1/fps is an error (info.json's fps would stretch every series);
- every video feature -> a video field `{path, fps, start_s, end_s}` pointing at the source file through
  a symlink in `media/` to the dataset's path, not its resolved target, so a Hugging Face cache's chain
  (store -> snapshot -> blob) stays whole (referenced, never copied or re-encoded; store.yaml lists the
  source, and the cache's blobs/, under `media_roots`); v3.0 files hold many episodes, each the
  half-open segment `[from_timestamp, to_timestamp)` of `meta/episodes`;
- every image feature (per-frame images embedded in the Parquet rows) -> one video file per episode in
  the store: JPEG frames muxed as MJPEG byte for byte, PNG frames encoded losslessly (FFV1), frame k at
  `frame_index[k] / fps`;
- the episode's tasks -> text field `task` (several tasks joined with " | "): v2.x those its rows'
  `task_index` names in meta/tasks.jsonl (not the other labels episodes.jsonl may list), else meta's.
The table's clock and the video's: LeRobot pairs row k with the frame at pts = `timestamp[k]`. Where
`frame_index / fps - timestamp` is one constant beyond float32 noise (a table clock starting a frame late,
as some datasets record), the videos get that constant as `clock_offset_s`, so the same pairs come out
on the exact frame-index grid; each such episode is named in the report's `notes`.
Feature keys become field names with `.` -> `_` (`observation.state` -> `observation_state`); a key too
long loses leading parts (`meta.lerobot_field_name`). Reading and checking meta/: `meta.py`.

Episodes that meta lists but whose Parquet file is absent (a partial download) are skipped and listed
in `convert_report.json`; video files they lack are one error naming them all (or, with --skip-bad,
each such episode is skipped). Memory: one episode's table at a time, O(longest episode).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from robowds.export.convert.episode_store import FieldSpec
from robowds.export.convert.lerobot.export_config import export_files
from robowds.export.convert.lerobot.meta import Feature, LeRobotInfo, missing_videos, read_info, task_table
from robowds.export.convert.run import Conversion, run_conversion
from robowds.export.errors import UserError

__all__ = ["Feature", "LeRobotInfo", "read_info", "plan_lerobot", "convert_lerobot", "clock_offset"]


OPTIONAL = ("frame_index", "timestamp", "task_index")  # LeRobot's columns, read when the file has them
REGULAR_S = 1e-4  # LeRobot's own tolerance for timestamps against the frame grid
FPS_TOLERANCE = 0.01  # a table whose median step is 1% off 1/fps is another rate, not jitter


@dataclass(frozen=True)
class EpisodeTask:
    """One episode to convert, all a worker needs (picklable, a few hundred bytes)."""

    root: Path
    fps: float
    v3: bool
    features: tuple[Feature, ...]
    entry: dict[str, Any]  # from meta: episode_index, tasks, data path, videos {key: (path, from, to)}
    media_roots: tuple[Path, ...] = ()  # where a video's link chain may end (the dataset, the HF cache's blobs/)


@lru_cache(maxsize=1)
def _data_file(path: Path, columns: tuple[str, ...], v3: bool) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """A data file's `columns` that it has, and for v3 its rows grouped by episode ([R] row order, [R]
    its episode indices). v3 files hold many episodes and a worker's consecutive tasks are usually in the
    same file: the last file read is kept (one per worker process), so each file is read once per worker,
    not per episode."""
    # ParquetFile.read, not read_table: 3.7x faster on LeRobot's small files (no dataset discovery)
    file = pq.ParquetFile(path)
    present = set(file.schema_arrow.names)
    if v3 and "episode_index" not in present:
        raise UserError(f"{path} has no episode_index column (a LeRobot v3.0 data file holds many episodes)",
                        hint="download the data file again")
    table = file.read(columns=[c for c in dict.fromkeys([*columns, *(["episode_index"] if v3 else [])])
                               if c in present])
    if not v3:
        return table, np.zeros(0, np.int64), np.zeros(0, np.int64)
    episodes = table.column("episode_index").to_numpy()  # [R]
    order = np.argsort(episodes, kind="stable")  # rows of one episode together, in file order
    return table, order, episodes[order]


def _episode_table(task: EpisodeTask, columns: tuple[str, ...]) -> pa.Table:
    """The episode's rows: every feature column, and those of `OPTIONAL` the file has. A feature column
    the file lacks, or (v3) rows that disagree with meta/episodes, are one error naming file and episode."""
    index, rel = int(task.entry["episode_index"]), task.entry["data"]
    try:
        table, order, episodes = _data_file(task.root / rel, columns, task.v3)
    except (OSError, pa.ArrowException) as exc:
        raise UserError(f"episode {index}: cannot read {task.root / rel}: {exc}",
                        hint="download the episode's data file again, or pass --skip-bad") from exc
    absent = [c for c in columns if c not in OPTIONAL and c not in table.column_names]
    if absent:
        raise UserError(f"episode {index}: {rel} has no column {', '.join(map(repr, absent))} (a feature "
                        "meta/info.json lists)", hint="download the data file again, or convert without it: "
                        + " ".join(f"--exclude {c}" for c in absent))
    if not task.v3:
        return table
    lo, hi = np.searchsorted(episodes, [index, index + 1])
    length = task.entry.get("length")
    if hi == lo or (isinstance(length, int) and hi - lo != length):
        held = np.unique(episodes)  # [E] the episodes the file's rows say they are
        raise UserError(f"episode {index}: {rel} holds {hi - lo} rows with episode_index {index} where "
                        f"meta/episodes says {length} (the file's rows are of episodes "
                        f"{', '.join(map(str, held[:8]))}{', ...' if len(held) > 8 else ''})",
                        hint="meta/ and data/ are of different revisions: download both again")
    return table.take(order[lo:hi])


def episode_frames(table: pa.Table, task: EpisodeTask) -> tuple[np.ndarray, list[str]]:
    """The episode's [T] frame indices and notes. `frame_index` where the table has it; without it (as in
    GR00T's v2.0 data) the row order, but only when `timestamp` steps by 1/fps (within LeRobot's 0.1 ms).
    A median `timestamp` step that is not 1/fps is an error: meta/info.json's fps would stretch or
    squeeze every series (LeRobot refuses such a dataset too)."""
    index, rel = int(task.entry["episode_index"]), task.entry["data"]
    for name in ("timestamp", "frame_index"):
        column = table.column(name) if name in table.column_names else None
        if column is not None and (column.null_count or not _numeric(column.type)):
            raise UserError(f"episode {index}: {rel}: column {name!r} holds {column.null_count} empty values or is "
                            f"not numeric ({column.type})", hint="download the data file again")
    ts = table.column("timestamp").to_numpy().astype(np.float64) if "timestamp" in table.column_names else None
    if ts is not None and len(ts) >= 2:
        step = float(np.median(np.diff(ts)))  # s
        if step <= 0:
            raise UserError(f"episode {index}: {rel}: its timestamps do not increase (median step {step:.6g} s)",
                            hint="download the data file again")
        if not abs(step * task.fps - 1) <= FPS_TOLERANCE:
            raise UserError(f"episode {index}: {rel}: its timestamps step {step:.6g} s ({1 / step:.6g} Hz) but "
                            f"meta/info.json says fps {task.fps:g}",
                            hint=f"set `fps` in meta/info.json to {1 / step:.6g} if the timestamps are right, else "
                                 "download the data file again")
    if "frame_index" in table.column_names:
        return table.column("frame_index").to_numpy(), []
    if ts is None:
        raise UserError(f"episode {index}: {rel} has neither a frame_index nor a timestamp column: its rows have "
                        "no times", hint="download the data file again")
    steps = np.diff(ts)  # [T - 1]
    bad = np.flatnonzero(np.abs(steps - 1 / task.fps) > REGULAR_S)
    if len(bad):
        k = int(bad[0])
        raise UserError(f"episode {index}: {rel} has no frame_index column and its timestamps are not regular "
                        f"(row {k} -> {k + 1} steps {steps[k]:.6g} s, 1/fps is {1 / task.fps:.6g} s): the row order "
                        "cannot stand for the frame index",
                        hint="add a frame_index column to the data files (LeRobot writes one)")
    return np.arange(len(ts), dtype=np.int64), [
        f"episode {index}: no frame_index column; the row order is the frame index (timestamps regular at 1/fps)"]


def _numeric(typ: pa.DataType) -> bool:
    return pa.types.is_integer(typ) or pa.types.is_floating(typ)


def _task_text(table: pa.Table, task: EpisodeTask) -> str:
    """The episode's task text: v2.x, the tasks its rows' `task_index` names in meta/tasks.jsonl, in order
    of first appearance (LeRobot's task of a frame); this leaves out the other per-frame labels that
    some datasets (GR00T's `annotation.*`) also list in episodes.jsonl's `tasks`. Else meta's `tasks`."""
    names = None if task.v3 else task_table(task.root)
    column = table.column("task_index") if "task_index" in table.column_names else None
    if names is None or column is None or column.null_count:
        return " | ".join(str(x) for x in task.entry.get("tasks", []))
    values = column.to_numpy()  # [T]
    unique, first = np.unique(values, return_index=True)
    ordered = [int(i) for i in unique[np.argsort(first)]]
    unknown = [i for i in ordered if i not in names]
    if unknown:
        raise UserError(f"episode {task.entry['episode_index']}: {task.entry['data']} has task_index {unknown} that "
                        "meta/tasks.jsonl does not list", hint="download the dataset's meta/ folder again")
    return " | ".join(names[i] for i in ordered)


FLOAT32_NOISE_S = 1e-4  # float32 timestamps at an hour of recording are within ~0.2 ms; a real offset is a frame


def clock_offset(frame_index: np.ndarray, timestamp: np.ndarray, fps: float) -> float:
    """`frame_index / fps - timestamp` when it is one constant beyond float32 noise (the table's clock
    starts a frame after the video's, as some datasets record), else 0. The video then sits at
    `pts + clock_offset_s` on the frame-index clock, pairing each row with the frame LeRobot pairs it
    with (the one at pts = timestamp)."""
    if len(frame_index) == 0:
        return 0.0
    diff = frame_index.astype(np.float64) / fps - timestamp.astype(np.float64)  # [T]
    median = float(np.median(diff))
    if abs(median) <= FLOAT32_NOISE_S or np.max(np.abs(diff - median)) > FLOAT32_NOISE_S:
        return 0.0
    return round(median * fps) / fps if abs(median * fps - round(median * fps)) < 0.01 else median


def convert_episode(task: EpisodeTask, folder: Path) -> dict[str, Any]:
    """One store row: typed time series, video structs (symlinks made in `folder/media`), task text."""
    index = int(task.entry["episode_index"])
    series = [f for f in task.features if f.kind == "timeseries"]
    images = [f for f in task.features if f.kind == "images"]
    table = _episode_table(task, (*OPTIONAL, *[f.key for f in series], *[f.key for f in images]))
    frame_index, notes = episode_frames(table, task)  # [T]
    t = frame_index.astype(np.float64) / task.fps  # [T] exact grid times
    offset = (clock_offset(frame_index, table.column("timestamp").to_numpy(), task.fps)
              if "timestamp" in table.column_names else 0.0)
    row: dict[str, Any] = {"episode_id": f"episode_{index:06d}", "task": _task_text(table, task)}
    for f in series:
        leaf = table.schema.field(f.key).type
        while pa.types.is_list(leaf) or pa.types.is_fixed_size_list(leaf) or pa.types.is_large_list(leaf):
            leaf = leaf.value_type
        if not (_numeric(leaf) or pa.types.is_boolean(leaf)):
            raise UserError(f"episode {index}: {task.entry['data']}: column {f.key!r} holds {leaf} values, not the "
                            f"{f.dtype} meta/info.json declares", hint="download the data file again, or convert "
                                                                        f"without it: --exclude {f.key}")
    for f in series:
        row[f.field] = {"t": t, "v": _values(table.column(f.key), len(t))}  # v: [T, N]
    media = folder / "media"
    for f in images:
        row[f.field] = _image_video(table.column(f.key), t, task.fps, media / f.field / f"episode_{index:06d}.mkv",
                                    f"episode {index}, feature {f.key!r}")
    for f in (f for f in task.features if f.kind == "video"):
        rel, start, end = task.entry["videos"][f.key]
        source = task.root / rel  # not resolved: the link chain (store -> dataset -> HF cache blob) is kept
        if not source.is_file():
            raise UserError(f"episode {index}: video {source} of feature {f.key!r} is missing",
                            hint="download the dataset's videos/ too, convert with --exclude "
                                 f"{f.key}, or pass --skip-bad")
        target = source.resolve()
        if not any(target.is_relative_to(r) for r in (task.root, *task.media_roots)):
            raise UserError(f"episode {index}: video {rel} of feature {f.key!r} is a link to {target}, outside the "
                            "dataset folder (a store only opens files in the folders its store.yaml lists)",
                            hint="copy the dataset with its files in place of the links (`cp -rL`) and convert "
                                 "the copy")
        link = media / f.field / "_".join(Path(rel).parts[-2:])  # chunk-000_episode_000001.mp4 (v2) or
        # chunk-000_file-000.mp4 (v3: one link per file, shared by the episodes it holds)
        link.parent.mkdir(parents=True, exist_ok=True)
        try:
            link.symlink_to(source)
        except FileExistsError:  # another worker linked the same v3 file
            pass
        row[f.field] = {"path": link.relative_to(folder).as_posix(), "fps": task.fps,
                        "start_s": start, "end_s": end, "clock_offset_s": offset or None}
    if offset:
        notes.append(f"episode {index}: table timestamps are {-offset:+.6f} s from frame_index / fps; "
                     f"its videos are placed with clock_offset_s = {offset:.6f} (LeRobot's pairing kept)")
    if notes:
        row["_notes"] = notes
    return row


def _image_video(column: pa.ChunkedArray, t: np.ndarray, fps: float, path: Path, where: str) -> dict[str, Any]:
    """Per-frame images (HF `Image`: struct {bytes, path}) -> one video file: JPEG frames muxed as MJPEG
    byte for byte, anything else (PNG) decoded and encoded losslessly (FFV1). Frame k sits at t[k]."""
    from PIL import Image, UnidentifiedImageError

    from robowds.export.media.encode import encode_frames, mux_jpegs

    cells = column.combine_chunks()
    data = cells.field("bytes").to_pylist() if pa.types.is_struct(cells.type) else cells.to_pylist()
    if any(d is None for d in data):
        raise UserError(f"{where}: {sum(d is None for d in data)} of {len(data)} frames have no embedded image bytes "
                        "(images stored by path are not converted)", hint="exclude the feature with --exclude")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        first = Image.open(io.BytesIO(data[0]))
        if all(d[:2] == b"\xff\xd8" for d in data):  # JPEG: the bytes themselves become the video's packets
            offset = mux_jpegs(data, t, path, *first.size)
        else:
            frames = np.stack([np.asarray(Image.open(io.BytesIO(d)).convert("RGB")) for d in data])  # [T, H, W, 3]
            offset = encode_frames(frames, t, path)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise UserError(f"{where}: an image cannot be decoded: {exc}",
                        hint="exclude the feature with --exclude, or pass --skip-bad") from exc
    return {"path": path.relative_to(path.parents[2]).as_posix(), "fps": fps, "start_s": None, "end_s": None,
            "clock_offset_s": offset}


def _values(column: pa.ChunkedArray, length: int) -> np.ndarray | pa.Array:
    """A feature column as T rows of N values in its stored dtype: list columns stay Arrow (the store
    writer takes their rows as they are), scalar columns become [T, 1]."""
    array = column.combine_chunks()
    if pa.types.is_list(array.type) or pa.types.is_fixed_size_list(array.type) or pa.types.is_large_list(array.type):
        if array.null_count or array.flatten().null_count:
            return array.flatten().to_numpy(zero_copy_only=False).reshape(length, -1)  # nulls -> NaN rows
        return array
    return array.to_numpy(zero_copy_only=False).reshape(length, 1)


def plan_lerobot(src: Path, exclude: tuple[str, ...] = (), skip_bad: bool = False) -> Conversion:
    """The conversion of the LeRobot dataset at `src`: its fields and one task per episode with files.
    `exclude`: feature keys (or field names) not to convert. Video files the episodes lack are one error
    naming them all, unless `skip_bad` (each such episode is then skipped when it is converted)."""
    info = read_info(Path(src).resolve())
    features = tuple(f for f in info.features if f.key not in exclude and f.field not in exclude)
    if not features:
        raise UserError(f"{info.root}: every feature is excluded ({', '.join(exclude)}): nothing but the task to "
                        "convert", hint="leave out fewer features with --exclude")
    if not skip_bad and (error := missing_videos(info, features)) is not None:
        raise error
    specs = [FieldSpec("task", "text", "str", source="tasks")]
    for f in features:
        specs.append(FieldSpec(f.field, "video" if f.kind == "images" else f.kind, f.dtype, f.names, source=f.key))
    videos = any(f.kind == "video" for f in features)
    roots = tuple(info.media_roots) if videos else ()
    tasks = [EpisodeTask(info.root, info.fps, info.version == "v3.0", features, entry, roots)
             for entry in info.episodes]
    return Conversion("lerobot", info.root, specs, tasks, convert_episode,
                      lambda task: f"episode {task.entry['episode_index']} ({task.entry['data']})",
                      media_roots=list(roots),
                      report={"version": info.version, "fps": info.fps, "excluded": sorted(exclude),
                              "warnings": info.warnings},
                      skipped=info.skipped,
                      files=export_files(info.fps, features, info.root))


def convert_lerobot(src: Path, store: Path, overwrite: bool = False, progress: bool = False, workers: int = 1,
                    skip_bad: bool = False, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """Convert the LeRobot dataset at `src` into a new episode store at `store`; returns the report
    (also written as `store/convert_report.json`). `progress`: a bar over episodes on stderr."""
    return run_conversion(plan_lerobot(src, exclude, skip_bad), Path(store), overwrite=overwrite, workers=workers,
                          skip_bad=skip_bad, progress=progress)
