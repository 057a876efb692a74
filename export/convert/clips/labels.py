"""Labels of video clips (Something-Something-v2 style, JSON or CSV) -> one `Label` per episode. Pure.

The labels file is read at the edge (`read_records`); everything else here is a function of its text, so
the mapping is tested without files. A record is one episode: the whole clip, or the labelled segment
`[start, end)` of it (Voltron style: several labels cut one long video). Field names follow SSv2:

- the episode id: `id` (or `--id-column`); without one, the video file's stem (`<stem>_<k>` when the file
  has several labels, k counting that file's labels from 0 in file order);
- the video: `file`, `video` or `path` (or `--file-column`), relative to SRC; without one (SSv2 ships
  `<id>.webm` files and ids only), the file in SRC whose stem is the id;
- the text: `text`, `label` or `template` (or `--text-column`); a `template` with `placeholders` and no
  caption is filled in ("Holding [something]" + ["ball"] -> "Holding ball"), as SSv2 builds `label`;
- the segment: `start` / `end` (or `start_s` / `end_s`) in seconds of the video's own clock, or with
  `--time-unit frames`, `start` / `end` (or `start_frame` / `end_frame`): 0-based decoded frame numbers,
  end exclusive. Either may be absent (from the first frame / to the last).

A record that cannot be mapped is a `BadRecord` (where, why, fix): the caller refuses the conversion
or, with `--skip-bad`, lists it and goes on. The labels file itself being unreadable is one UserError.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Iterable

from robowds.export.errors import UserError

FILE_KEYS = ("file", "video", "path")
TEXT_KEYS = ("text", "label", "template")
TIME_KEYS = {"s": (("start", "start_s"), ("end", "end_s")),
             "frames": (("start", "start_frame"), ("end", "end_frame"))}
JSON_LISTS = ("items", "labels", "annotations")  # an object holding the records under one of these keys
VIDEO_SUFFIXES = (".webm", ".mp4", ".mkv", ".avi", ".mov")
PLACEHOLDER = re.compile(r"\[[^\]]*\]")  # SSv2 template slots: "[something]", "[part of something]"


@dataclass(frozen=True)
class LabelOptions:
    """Which record keys to read (None: the SSv2 defaults above) and the unit of start/end."""

    id_column: str | None = None
    file_column: str | None = None
    text_column: str | None = None
    time_unit: str = "s"  # "s" | "frames"


@dataclass(frozen=True)
class Record:
    """One raw record of the labels file and where it is, for messages ("labels.csv line 4")."""

    where: str
    values: dict[str, Any]


@dataclass(frozen=True)
class Label:
    """One episode: its video file (relative to SRC, POSIX), segment in the label's unit, and texts."""

    where: str
    episode_id: str
    file: str
    start: float | int | None  # seconds (float) or frame number (int); None = the first frame
    end: float | int | None  # exclusive; None = to the last frame
    text: str
    template: str | None


@dataclass(frozen=True)
class BadRecord:
    where: str
    reason: str
    hint: str

    def error(self) -> UserError:
        return UserError(f"{self.where}: {self.reason}", hint=self.hint)


class RecordError(ValueError):
    """A record that cannot be mapped (internal: becomes a BadRecord)."""

    def __init__(self, reason: str, hint: str) -> None:
        super().__init__(reason)
        self.reason, self.hint = reason, hint


def parse_json(text: str, name: str) -> list[Record]:
    """Records of a JSON labels file: a list of objects, or an object holding that list under one of
    `JSON_LISTS` (its other keys, such as a `_note`, are ignored)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UserError(f"labels file {name} is not valid JSON: {exc}",
                        hint="fix the file (a list of objects, or {\"items\": [...]}), or pass --labels") from exc
    if isinstance(data, dict):
        lists = [k for k in JSON_LISTS if isinstance(data.get(k), list)]
        if len(lists) != 1:
            raise UserError(f"labels file {name}: a JSON object must hold its records as a list under exactly one "
                            f"of {', '.join(JSON_LISTS)}; found keys {sorted(data)[:8]}",
                            hint="write the records as a JSON list, or under \"items\"")
        data = data[lists[0]]
    if not isinstance(data, list):
        raise UserError(f"labels file {name}: expected a JSON list of records, got {type(data).__name__}",
                        hint="write the records as a JSON list of objects")
    records = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise UserError(f"labels file {name} item {i}: expected an object, got {type(item).__name__}",
                            hint="every record is an object such as {\"id\": ..., \"label\": ...}")
        records.append(Record(f"{name} item {i}", item))
    return records


def parse_csv(text: str, name: str) -> list[Record]:
    """Records of a CSV labels file with a header row; empty cells are absent keys."""
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
        header = reader.fieldnames
        if not header or any(not (h or "").strip() for h in header) or len(set(header)) != len(header):
            raise UserError(f"labels file {name}: the first line must be a header of distinct column names, "
                            f"got {header}", hint="start the CSV with a header such as id,video,start,end,label")
        records = []
        for row in reader:
            where = f"{name} line {reader.line_num}"
            if None in row:
                raise UserError(f"{where}: more cells ({len(header) + len(row[None])}) than header columns "
                                f"({len(header)})", hint="quote cells that contain commas")
            records.append(Record(where, {k.strip(): v.strip() for k, v in row.items()
                                          if v is not None and v.strip() != ""}))
    except csv.Error as exc:
        raise UserError(f"labels file {name} is not valid CSV: {exc}", hint="fix the file, or pass --labels") from exc
    return records


def _first_key(values: dict[str, Any], chosen: str | None, defaults: tuple[str, ...]) -> str | None:
    if chosen is not None:
        return chosen if chosen in values else None
    return next((k for k in defaults if k in values), None)


def _string(value: Any, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise RecordError(f"{what} must be a string, got {value!r}", f"write {what} as a string")
    return str(value).strip()


def _time(values: dict[str, Any], keys: tuple[str, str], unit: str) -> float | int | None:
    """The record's start (or end) in its unit; a key of the other unit is an error, not ignored."""
    present = [k for k in keys if k in values]
    own = {k for group in TIME_KEYS[unit] for k in group}
    other = [k for u, pair in TIME_KEYS.items() if u != unit for group in pair for k in group
             if k in values and k not in own]
    if other:
        flag = "--time-unit frames" if unit == "s" else "--time-unit s"
        raise RecordError(f"{other[0]} is not in the unit of --time-unit {unit}", f"pass {flag}, or rename the key")
    if len(present) > 1:
        raise RecordError(f"both {present[0]} and {present[1]} are given", f"keep one of {present[0]}, {present[1]}")
    if not present:
        return None
    key, raw = present[0], values[present[0]]
    try:
        if isinstance(raw, bool):
            raise ValueError
        number = float(raw)
    except (TypeError, ValueError):
        raise RecordError(f"{key} = {raw!r} is not a number", f"write {key} as a number") from None
    if not math.isfinite(number) or number < 0:
        raise RecordError(f"{key} = {raw!r} must be a finite number >= 0", f"fix {key}")
    if unit == "frames":
        if number != int(number):
            raise RecordError(f"{key} = {raw!r} is not a whole frame number",
                              "frame numbers are 0-based integers; pass --time-unit s for seconds")
        return int(number)
    return number


def _text(values: dict[str, Any], options: LabelOptions) -> tuple[str, str | None]:
    """(episode text, template or None)."""
    template = _string(values["template"], "template") if "template" in values else None
    key = _first_key(values, options.text_column, TEXT_KEYS)
    if key is None:
        wanted = options.text_column or "/".join(TEXT_KEYS)
        raise RecordError(f"no text: the record has no {wanted}",
                          "give every label a text (--text-column names the key)")
    text = _string(values[key], key)
    placeholders = values.get("placeholders")
    if key == "template" and isinstance(placeholders, list) and placeholders:
        fill = iter(str(p) for p in placeholders)
        text = PLACEHOLDER.sub(lambda m: next(fill, m.group(0)), text)
    if not text:
        raise RecordError(f"{key} is empty", "give every label a text")
    return text, template


def _file(values: dict[str, Any], options: LabelOptions, episode_id: str | None,
          videos_by_stem: dict[str, list[str]]) -> str:
    """The record's video, relative to SRC, as a normalised POSIX path that stays inside SRC."""
    key = _first_key(values, options.file_column, FILE_KEYS)
    if key is None:
        if episode_id is None:
            wanted = options.file_column or "/".join(FILE_KEYS)
            raise RecordError(f"neither an id nor a video file ({wanted})", "give every label an id or a file")
        found = videos_by_stem.get(episode_id, [])
        if len(found) != 1:
            what = "no video file" if not found else f"{len(found)} video files ({', '.join(found[:3])})"
            raise RecordError(f"{what} in SRC named {episode_id} ({'/'.join(VIDEO_SUFFIXES)})",
                              "add the video, or name it in a file/video column")
        return found[0]
    raw = _string(values[key], key).replace("\\", "/")
    path = PurePosixPath(raw)
    if not raw or path.is_absolute() or ".." in path.parts or re.match(r"^[A-Za-z]:", raw) or "://" in raw:
        raise RecordError(f"video {raw!r} is not a path inside SRC (absolute, '..' or a URL)",
                          "name videos relative to SRC; converted stores only reference files inside SRC")
    return path.as_posix()


def to_labels(records: Iterable[Record], options: LabelOptions,
              videos_by_stem: dict[str, list[str]]) -> tuple[list[Label], list[BadRecord]]:
    """Records -> labels in file order, and the records that cannot be mapped (with why and the fix).

    `videos_by_stem`: stem -> video paths relative to SRC, for records that name no file (SSv2)."""
    if options.time_unit not in TIME_KEYS:
        raise UserError(f"--time-unit must be one of {', '.join(TIME_KEYS)}, got {options.time_unit!r}",
                        hint="--time-unit s for start/end in seconds, frames for start_frame/end_frame")
    starts, ends = TIME_KEYS[options.time_unit]
    id_key = options.id_column or "id"
    parsed: list[tuple[Record, str | None, str, Any, Any, str, str | None]] = []
    bad: list[BadRecord] = []
    for record in records:
        values, explicit = record.values, None
        try:
            explicit = _string(values[id_key], id_key) if id_key in values else None
            if explicit == "":
                raise RecordError(f"{id_key} is empty", "give every label a non-empty id")
            file = _file(values, options, explicit, videos_by_stem)
            start, end = _time(values, starts, options.time_unit), _time(values, ends, options.time_unit)
            if start is not None and end is not None and not end > start:
                raise RecordError(f"the segment [{start}, {end}) is empty: its end must be greater than its start",
                                  "fix start/end (the end is exclusive)")
            text, template = _text(values, options)
        except RecordError as exc:
            where = record.where + (f" (episode {explicit!r})" if explicit else "")
            bad.append(BadRecord(where, exc.reason, exc.hint + ", or pass --skip-bad"))
            continue
        parsed.append((record, explicit, file, start, end, text, template))
    per_file: dict[str, int] = {}
    for _, _, file, *_ in parsed:
        per_file[file] = per_file.get(file, 0) + 1
    labels, seen, count = [], {}, {}
    for record, explicit, file, start, end, text, template in parsed:
        stem = PurePosixPath(file).stem
        k = count.get(file, 0)
        count[file] = k + 1
        episode_id = explicit if explicit is not None else (stem if per_file[file] == 1 else f"{stem}_{k}")
        if episode_id in seen:
            bad.append(BadRecord(f"{record.where} (episode {episode_id!r})",
                                 f"the id is already used by {seen[episode_id]}",
                                 "give every label a distinct id, or pass --skip-bad"))
            continue
        seen[episode_id] = record.where
        labels.append(Label(record.where, episode_id, file, start, end, text, template))
    return labels, bad


def unmapped_keys(records: Iterable[Record], options: LabelOptions) -> list[str]:
    """Record keys no field comes from (e.g. SSv2's `placeholders`), for the report."""
    used = {options.id_column or "id", "template", *(k for group in TIME_KEYS[options.time_unit] for k in group)}
    used |= {options.file_column} if options.file_column else set(FILE_KEYS)
    used |= {options.text_column} if options.text_column else set(TEXT_KEYS)
    return sorted({k for r in records for k in r.values} - used)
