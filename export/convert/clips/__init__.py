"""A folder of video clips plus a labels file (Something-Something-v2 / Voltron style) -> an episode store.

Mapping (one store row per label; `labels` says how records are read):
- the label's video -> a video field (`--video-field`, default `video`): a struct `{path, fps, start_s,
  end_s}` whose path is a symlink `media/<field>/<path in SRC>` to the source file (referenced, never
  copied or re-encoded; store.yaml lists SRC under `media_roots`); `start_s` / `end_s` the label's
  half-open segment in the file's own clock (None/None: the whole clip); `fps` the stream's average
  rate as PyAV reads it, or `--fps`;
- the label's text -> a text field (`--text-field`, default `text`); SSv2's `template`, when every label
  has one, -> a text field `template` (the 174 SSv2 classes are templates);
- the episode extent -> the reserved `start_s` / `end_s` columns: the segment's first frame and its
  last frame put on the grid (`segments.grid_extent`: otherwise a pts rounded to the container's
  1 ms loses the segment's last window).
Audio streams and any video stream after the first are not converted (the store has no audio kind);
the report lists the files that have them. Memory: one file's pts at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from robowds.export.convert.clips.labels import (FILE_KEYS, VIDEO_SUFFIXES, Label, LabelOptions, Record, parse_csv,
                                                 parse_json, to_labels, unmapped_keys)
from robowds.export.convert.clips.segments import SegmentError, file_segment, grid_extent
from robowds.export.convert.episode_store import FieldSpec, field_name
from robowds.export.convert.run import Conversion, run_conversion
from robowds.export.errors import UserError
from robowds.export.media.frames import VideoError, probe_video

DEFAULT_LABELS = ("labels.json", "labels.csv")
RESERVED = ("episode_id", "split", "start_s", "end_s", "template", "meta")


@dataclass(frozen=True)
class Probe:
    """What the converter needs of a video file: its frames' pts and clock, its rate, what it leaves out."""

    pts: np.ndarray  # [F] sorted seconds, as the export computes them (export/media/frames.probe_video)
    resolution: float  # s, the video stream's time base: how finely its pts are stored
    fps: float | None  # the container's average rate
    ignored: tuple[str, ...]  # streams not converted: "audio opus 5.1", "video #1 h264"...


def probe(path: Path) -> Probe:
    """Frame times and stream list of `path`. Raises VideoError for a file PyAV cannot read as a video."""
    stat = path.stat()
    return _probe(path, stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=1)
def _probe(path: Path, size: int, mtime_ns: int) -> Probe:
    """`probe`, keyed by the file's size and time as well (a worker's consecutive labels usually share a
    file: the last one probed is kept, and a replaced file is probed again)."""
    import av  # lazy: only videos need PyAV

    info = probe_video(path)
    try:
        with av.open(str(path)) as container:
            video = container.streams.video[0]
            ignored = tuple(_describe(s) for s in container.streams if s.index != video.index)
            resolution = float(video.time_base)
    except av.FFmpegError as exc:  # pragma: no cover (probe_video opened it a moment ago)
        raise VideoError(f"{path.name} cannot be read as a video: {exc}") from exc
    return Probe(info.pts, resolution, info.declared_fps, ignored)


def _describe(stream: Any) -> str:
    layout = getattr(getattr(stream.codec_context, "layout", None), "name", "")
    return " ".join(x for x in (stream.type, stream.codec_context.name, layout) if x)


@dataclass(frozen=True)
class ClipTask:
    """One label to convert: all a worker needs (picklable)."""

    src: Path  # resolved SRC
    label: Label
    time_unit: str
    fps: float | None  # --fps, or None to use the file's average rate
    video_field: str
    text_field: str
    template: bool  # write the `template` field
    note_streams: bool  # the first label of its file: note the streams left out


def describe(task: ClipTask) -> str:
    """The episode, for the skipped list (whose reason, the UserError, names the record and video)."""
    return f"episode {task.label.episode_id!r}"


def convert_clip(task: ClipTask, folder: Path) -> dict[str, Any]:
    """One store row: the video struct (its symlink made under `folder/media`), the texts, the extent."""
    label = task.label
    where = f"{label.where} (episode {label.episode_id!r}, video {label.file})"
    source = (task.src / label.file).resolve()
    if not source.is_relative_to(task.src):
        raise UserError(f"{where}: {task.src / label.file} resolves to {source}, outside SRC {task.src}",
                        hint="pass as SRC the folder the videos really live in, or pass --skip-bad")
    if not source.is_file():
        raise UserError(f"{where}: the video {source} is missing",
                        hint="add the file, fix the label's video path (relative to SRC), or pass --skip-bad")
    try:
        info = probe(source)
    except VideoError as exc:
        raise UserError(f"{where}: {exc}", hint="replace the file with a readable video, or pass --skip-bad") from exc
    fps = task.fps or info.fps
    if not fps:
        raise UserError(f"{where}: {source.name} does not state its frame rate", hint="pass --fps")
    try:
        segment = file_segment(label.start, label.end, task.time_unit, info.pts, fps)
    except SegmentError as exc:
        raise UserError(f"{where}: {exc.reason}", hint=f"{exc.hint}, or pass --skip-bad") from exc
    start, end = grid_extent(info.pts, segment, fps, info.resolution)
    link = folder / "media" / task.video_field / label.file  # one link per source file, shared by its labels
    link.parent.mkdir(parents=True, exist_ok=True)
    try:
        link.symlink_to(source)
    except FileExistsError:  # another label (maybe in another worker) of the same file linked it
        pass
    row: dict[str, Any] = {
        "episode_id": label.episode_id, "start_s": start, "end_s": end, task.text_field: label.text,
        task.video_field: {"path": link.relative_to(folder).as_posix(), "fps": float(fps),
                           "start_s": segment.start_s, "end_s": segment.end_s, "clock_offset_s": None}}
    if task.template:
        row["template"] = label.template
    if task.note_streams and info.ignored:
        row["_notes"] = [f"{label.file}: not converted: {', '.join(info.ignored)} (a store has no audio kind; "
                         "the first video stream is the field)"]
    return row


def read_records(path: Path) -> list[Record]:
    """The labels file's records (JSON or CSV by suffix); one UserError if it cannot be read."""
    if path.suffix.lower() not in (".json", ".csv"):
        raise UserError(f"labels file {path}: unknown type {path.suffix!r}", hint="give a .json or .csv labels file")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM from a spreadsheet export is not a column name
    except FileNotFoundError:
        raise UserError(f"labels file {path} does not exist", hint="pass --labels FILE") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"labels file {path} cannot be read: {exc}", hint="save it as UTF-8 text") from exc
    return parse_json(text, path.name) if path.suffix.lower() == ".json" else parse_csv(text, path.name)


def find_labels(src: Path, labels: Path | None) -> Path:
    if labels is not None:
        return Path(labels)
    found = [src / name for name in DEFAULT_LABELS if (src / name).is_file()]
    if len(found) != 1:
        what = "neither labels.json nor labels.csv" if not found else "both labels.json and labels.csv"
        raise UserError(f"{src} has {what}", hint="pass --labels FILE")
    return found[0]


def videos_by_stem(src: Path) -> dict[str, list[str]]:
    """stem -> video files under SRC with that stem (relative POSIX paths, sorted), for labels naming no file."""
    out: dict[str, list[str]] = {}
    for path in sorted(src.rglob("*")):
        if path.suffix.lower() in VIDEO_SUFFIXES and path.is_file():
            out.setdefault(path.stem, []).append(path.relative_to(src).as_posix())
    return out


def _check_field(name: str, option: str) -> str:
    if field_name(name) != name or name in RESERVED:
        raise UserError(f"{option} {name!r} is not a usable field name",
                        hint=f"use lowercase letters, digits and _, starting with a letter, not one of {RESERVED}"
                             f" (e.g. {field_name(name)!r})")
    return name


def plan_clips(src: Path, labels: Path | None = None, options: LabelOptions = LabelOptions(),
               video_field: str = "video", text_field: str = "text", fps: float | None = None,
               skip_bad: bool = False) -> Conversion:
    """The conversion of the clips in `src` labelled by `labels` (default: labels.json / labels.csv in
    `src`): one task per label. Records that cannot be mapped stop it, or with `skip_bad` are listed."""
    root = Path(src).resolve()
    if not root.is_dir():
        raise UserError(f"{src} is not a folder", hint="pass the folder holding the video files")
    if video_field == text_field:
        raise UserError(f"--video-field and --text-field are both {video_field!r}", hint="give them distinct names")
    _check_field(video_field, "--video-field")
    _check_field(text_field, "--text-field")
    if fps is not None and not fps > 0:
        raise UserError(f"--fps must be > 0, got {fps}", hint="omit it to use each file's own rate")
    path = find_labels(root, labels)
    records = read_records(path)
    file_keys = {options.file_column} if options.file_column else set(FILE_KEYS)
    needs_index = any(not file_keys & set(r.values) for r in records)  # SSv2: ids only, <id>.webm in SRC
    labels_, bad = to_labels(records, options, videos_by_stem(root) if needs_index else {})
    if bad and not (skip_bad and labels_):
        error = bad[0].error()
        if labels_ or len(bad) == 1:
            raise error
        raise UserError(f"{path.name}: none of its {len(bad)} labels can be converted; the first: {error.message}",
                        hint=error.hint)
    template = bool(labels_) and all(label.template is not None for label in labels_)
    specs = [FieldSpec(video_field, "video", "uint8", source="file"),
             FieldSpec(text_field, "text", "str", source=options.text_column or "text|label|template")]
    if template:
        specs.append(FieldSpec("template", "text", "str", source="template"))
    specs += [FieldSpec("start_s", "value", "float64", source="extent: first frame"),
              FieldSpec("end_s", "value", "float64", source="extent: last frame on the fps grid")]
    first_of_file: set[str] = set()
    tasks = []
    for label in labels_:
        tasks.append(ClipTask(root, label, options.time_unit, fps, video_field, text_field, template,
                              label.file not in first_of_file))
        first_of_file.add(label.file)
    return Conversion("clips", root, specs, tasks, convert_clip, describe, media_roots=[root],
                      report={"labels": str(path.resolve()), "time_unit": options.time_unit, "fps": fps,
                              "not_converted": unmapped_keys(records, options)
                              + ([] if template or not any(label.template for label in labels_) else ["template"])},
                      skipped=[{"episode": b.where, "reason": b.reason} for b in bad])


def convert_clips(src: Path, store: Path, labels: Path | None = None, options: LabelOptions = LabelOptions(),
                  video_field: str = "video", text_field: str = "text", fps: float | None = None,
                  overwrite: bool = False, progress: bool = False, workers: int = 1,
                  skip_bad: bool = False) -> dict[str, Any]:
    """Convert the labelled clips in `src` into a new episode store at `store`; returns the report (also
    written as `store/convert_report.json`)."""
    conv = plan_clips(src, labels, options, video_field, text_field, fps, skip_bad)
    return run_conversion(conv, Path(store), overwrite=overwrite, workers=workers, skip_bad=skip_bad,
                          progress=progress)
