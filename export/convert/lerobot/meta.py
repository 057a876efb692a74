"""LeRobot `meta/` read and checked: what `convert lerobot` will convert, or one error saying what in the
metadata is wrong, where, and how to fix it.

Malformed metadata never converts silently and never crashes: `info.json` without a positive `fps`, a
dict of `features` or the path templates; an `episodes.jsonl` line that is not JSON or has no
`episode_index`; a `chunks_size` that is not a positive integer: each is a `UserError` naming the file
(and line) and the fix. A data file that no episode in meta names is not converted, and that is a
*warning* (report `warnings` and stderr), not an error: meta decides which episodes a LeRobot dataset
holds (LeRobot itself loads the episodes meta lists), so a stray file (an episode dropped from meta on
purpose, or data/ of a newer download) must not stop a conversion, but the user is told.

v2.x files are found through the `data_path` / `video_path` templates, and where a template's path is
absent, by matching the template against the files present (each `{field}` any number, the episode's
index read from the *last* `{episode_index}`): a template that puts `{episode_index}` in the chunk
folder (`chunk-{episode_index:03d}/episode_{episode_index:06d}`) while the files sit in `chunk-000`
still finds them. Cost: one glob of data/ (and one per camera of videos/), O(files).

The Hugging Face cache (`huggingface_hub.snapshot_download`): `<repo>/snapshots/<rev>/...` are relative
links into `<repo>/blobs/<sha256>`. A dataset under a `snapshots/<rev>` folder whose repo has `blobs/`,
or whose videos link into such a `blobs/` folder (a `local_dir` download with links), adds that blobs
folder to the store's `media_roots`: the videos' link chains (store -> dataset -> blob) end inside a
declared root, and nothing else outside the dataset is opened.
"""

from __future__ import annotations

import glob
import json
import re
import string
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from robowds.export.convert.episode_store import field_name
from robowds.export.errors import UserError

BOOKKEEPING = {"timestamp", "frame_index", "episode_index", "index", "task_index"}  # LeRobot's own columns
SUPPORTED = ("v2.0", "v2.1", "v3.0")
MAX_NAME = 32  # a store field name's limit (store/schema.py); `<field>_mask` of 37 is a valid member (reader/format.py)
META_FIX = "download the dataset's meta/ folder again (the same revision as its data/)"


@dataclass(frozen=True)
class Feature:
    key: str  # LeRobot's feature key, e.g. observation.state
    field: str  # the store's field name, e.g. observation_state
    kind: str  # "timeseries" | "video" | "images" (per-frame images in the Parquet rows -> a video file)
    dtype: str
    names: tuple[str, ...] | None


@dataclass
class LeRobotInfo:
    """What meta/ says: the info, the mapped features, the episodes with their files, the episodes
    skipped with the reason, warnings (`{"message", "fix"}`) and the folders media may live in."""

    root: Path
    fps: float
    version: str
    features: list[Feature]
    episodes: list[dict[str, Any]]  # listed episodes whose data files exist, each with its data path and videos
    skipped: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, str]] = field(default_factory=list)
    media_roots: list[Path] = field(default_factory=list)  # the dataset, and the HF cache's blobs/ if any


def lerobot_field_name(key: str) -> str:
    """A feature key -> a store field name. LeRobot keys are dotted paths, most specific part last: a
    key too long for a field name loses whole leading parts (`annotation.human.action.task_description`
    -> `human_action_task_description`), never its tail, so the name still says what the field is."""
    parts = key.split(".")
    for i in range(len(parts)):
        tail = ".".join(parts[i:])
        if len(re.sub(r"[^a-z0-9_]", "_", tail.lower())) <= MAX_NAME and tail[:1].isalpha():
            return field_name(tail)
    return field_name(key)


def _names(spec: dict[str, Any]) -> tuple[str, ...] | None:
    """LeRobot writes names flat (`["x", "y"]`), nested one level (`[["x", "y"]]`), or as a dict
    (`{"motors": [...]}`); all give one name per value column."""
    names = spec.get("names")
    if isinstance(names, dict):
        names = [n for part in names.values() for n in (part if isinstance(part, list) else [part])]
    if isinstance(names, list) and len(names) == 1 and isinstance(names[0], list):
        names = names[0]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    shape = spec.get("shape") or [1]
    width = int(np.prod(shape)) if all(isinstance(s, int) for s in shape) else -1
    return tuple(names) if len(names) == width else None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A meta `.jsonl` file's records; a line that is not a JSON object (a truncated download) is one
    error naming the file and line."""
    out = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise UserError(f"{path} line {number} is not JSON ({exc}): {line[:60]!r}", hint=META_FIX) from exc
        if not isinstance(record, dict):
            raise UserError(f"{path} line {number} is not a JSON object: {line[:60]!r}", hint=META_FIX)
        out.append(record)
    return out


def _fps(info: dict[str, Any], info_path: Path) -> float:
    fps = info.get("fps")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not np.isfinite(fps) or fps <= 0:
        raise UserError(f"{info_path}: fps must be a positive number of frames per second, got {fps!r}",
                        hint="set `fps` in meta/info.json to the rate the dataset was recorded at (e.g. 30), "
                             "or download meta/info.json again")
    return float(fps)


def _features(info: dict[str, Any], info_path: Path) -> list[Feature]:
    specs = info.get("features")
    if not isinstance(specs, dict) or not specs:
        raise UserError(f"{info_path}: no `features` ({'absent' if specs is None else repr(specs)[:40]}): "
                        "nothing to convert", hint="download meta/info.json again (LeRobot lists every feature there)")
    features = []
    for key, spec in sorted(specs.items()):
        if key in BOOKKEEPING:
            continue
        if not isinstance(spec, dict):
            raise UserError(f"{info_path}: feature {key!r} is {spec!r}, not an object with `dtype` and `shape`",
                            hint="download meta/info.json again")
        dtype = str(spec.get("dtype"))
        if dtype in ("video", "image"):
            features.append(Feature(key, lerobot_field_name(key), "video" if dtype == "video" else "images",
                                    "uint8", None))
            continue
        try:
            kind = np.dtype(dtype).kind
        except TypeError:
            continue  # string and other non-numeric features are not mapped (docs/convert.md)
        if kind in "biuf":
            features.append(Feature(key, lerobot_field_name(key), "timeseries", dtype, _names(spec)))
    if not features:
        raise UserError(f"{info_path}: none of the features {sorted(specs)} is numeric, a video or an image: "
                        "nothing to convert", hint="check that this is the dataset's meta/info.json")
    clash = {f.field for f in features if sum(g.field == f.field for g in features) > 1}
    if clash:
        raise UserError(f"{info_path}: features map to the same field name(s) {sorted(clash)}",
                        hint="rename the features, or convert with a custom script")
    return features


def read_info(root: Path) -> LeRobotInfo:
    """Open `meta/`: the features to map and the episodes whose data files exist."""
    info_path = root / "meta" / "info.json"
    if not info_path.is_file():
        raise UserError(f"{root} is not a LeRobot dataset: {info_path} is missing",
                        hint="pass the dataset root (the folder holding meta/, data/ and videos/)")
    try:
        info = json.loads(info_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{info_path} is not JSON: {exc}", hint="download the dataset's meta/ again") from exc
    if not isinstance(info, dict):
        raise UserError(f"{info_path} is not a JSON object", hint="download the dataset's meta/ again")
    version = str(info.get("codebase_version", ""))
    if version not in SUPPORTED:
        raise UserError(f"{info_path}: LeRobot codebase_version {version!r} is not supported by this converter",
                        hint=f"supported: {', '.join(SUPPORTED)}")
    fps = _fps(info, info_path)
    features = _features(info, info_path)
    for key in ("data_path", *(["video_path"] if any(f.kind == "video" for f in features) else [])):
        if not isinstance(info.get(key), str) or not info[key]:
            raise UserError(f"{info_path}: `{key}` (the path template of the {key[:-5]} files) is missing",
                            hint="download meta/info.json again")
    out = LeRobotInfo(root, fps, version, features, [])
    listed = _v3_episodes(root, info, features, out) if version == "v3.0" else _v2_episodes(root, info, features, out)
    for entry in listed:
        if not (root / entry["data"]).is_file():
            out.skipped.append({"episode_index": entry["episode_index"], "reason": f"{entry['data']} is missing"})
            continue
        out.episodes.append(entry)
    out.media_roots = _media_roots(root, out.episodes) if any(f.kind == "video" for f in features) else []
    return out


def _media_roots(root: Path, episodes: list[dict[str, Any]]) -> list[Path]:
    """The dataset folder, and each Hugging Face cache `blobs/` folder its videos live in: the repo's
    whose snapshot `root` is (or lies in), and any a video links into (`snapshot_download(local_dir=...,
    local_dir_use_symlinks=...)` leaves absolute links into the cache). Nothing else outside `root`:
    a video linked elsewhere is refused when it is converted. Cost: one `lstat` per video file."""
    roots = [root]
    for folder in [root, *root.parents]:
        if folder.parent.name == "snapshots" and _is_blobs(folder.parent.parent / "blobs"):
            roots.append((folder.parent.parent / "blobs").resolve())
            break
    for entry in episodes:
        for rel, _, _ in entry["videos"].values():
            path = root / rel
            if path.is_symlink():
                target = path.resolve()
                if not any(target.is_relative_to(r) for r in roots) and _is_blobs(target.parent):
                    roots.append(target.parent)
    return roots


def _is_blobs(folder: Path) -> bool:
    """A Hugging Face cache repo's `blobs/` folder (`<repo>/blobs` beside `<repo>/snapshots`)."""
    return folder.name == "blobs" and folder.is_dir() and (folder.parent / "snapshots").is_dir()


def _format(template: str, where: Path, **values: Any) -> str:
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError) as exc:
        raise UserError(f"{where}: path template {template!r} cannot be filled ({exc!r}); it may use "
                        f"{sorted(values)}", hint="download meta/info.json again") from exc


def discover(root: Path, template: str, fixed: dict[str, str]) -> dict[int, str]:
    """The files present that match `template` (a `str.format` path; `fixed` fields filled, the others
    any number), by episode index (the last `{episode_index}` in the path): {index: path relative to
    root}. Empty if the template has no `{episode_index}` (v3 files hold many episodes)."""
    pattern, regex, index_groups = "", "", []
    group = 0
    for literal, name, spec, _ in string.Formatter().parse(template):
        pattern += glob.escape(literal)
        regex += re.escape(literal)
        if name is None:
            continue
        if name in fixed:
            pattern += glob.escape(fixed[name])
            regex += re.escape(fixed[name])
            continue
        pattern += "*"
        regex += r"(\d+)"
        group += 1
        if name == "episode_index":
            index_groups.append(group)
    if not index_groups:
        return {}
    found: dict[int, str] = {}
    for path in sorted(root.glob(pattern)):
        rel = path.relative_to(root).as_posix()
        match = re.fullmatch(regex, rel)
        if match:
            found.setdefault(int(match.group(index_groups[-1])), rel)
    return found


def _chunks_size(info: dict[str, Any], info_path: Path) -> int:
    size = info.get("chunks_size", 1000)
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise UserError(f"{info_path}: chunks_size must be a positive integer, got {size!r}",
                        hint="set `chunks_size` in meta/info.json (LeRobot's default is 1000)")
    return size


def _v2_episodes(root: Path, info: dict[str, Any], features: list[Feature], out: LeRobotInfo) -> list[dict[str, Any]]:
    """v2.x: meta/episodes.jsonl, one Parquet file and one mp4 per episode (pts from 0). A data file no
    line names is a warning (see the module docstring)."""
    info_path, episodes_path = root / "meta" / "info.json", root / "meta" / "episodes.jsonl"
    if not episodes_path.is_file():
        raise UserError(f"{root}: LeRobot {info.get('codebase_version')} without meta/episodes.jsonl",
                        hint=META_FIX)
    size = _chunks_size(info, info_path)
    task_table(root)  # checked here, before any worker reads it
    cameras = [f for f in features if f.kind == "video"]
    found = discover(root, info["data_path"], {})
    found_videos = {f.key: discover(root, info["video_path"], {"video_key": f.key}) for f in cameras}

    def locate(template: str, index: int, present: dict[int, str], **fixed: Any) -> str:
        rel = _format(template, info_path, episode_chunk=index // size, episode_index=index, **fixed)
        return rel if (root / rel).is_file() else present.get(index, rel)

    entries, seen = [], set()
    for number, record in enumerate(read_jsonl(episodes_path), 1):
        index = record.get("episode_index")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0 or index in seen:
            what = "a repeated" if isinstance(index, int) and index in seen else "no valid"  # a list: unhashable
            raise UserError(f"{episodes_path}: record {number} has {what} episode_index ({index!r})", hint=META_FIX)
        seen.add(index)
        tasks = record.get("tasks") or []
        entries.append({**record, "tasks": [str(t) for t in (tasks if isinstance(tasks, list) else [tasks])],
                        "data": locate(info["data_path"], index, found),
                        "videos": {f.key: (locate(info["video_path"], index, found_videos[f.key], video_key=f.key),
                                           None, None) for f in cameras}})
    for index, rel in sorted(found.items()):
        if index not in seen:
            _unlisted(out, index, rel, episodes_path.relative_to(root).as_posix())
    return entries


def _unlisted(out: LeRobotInfo, index: int, rel: str, meta: str) -> None:
    reason = f"{rel} (episode {index}) is listed in no {meta} entry: not converted"
    out.skipped.append({"episode_index": index, "reason": reason})
    out.warnings.append({"message": reason, "fix": f"download {meta} again if the episode belongs to the dataset, "
                                                   "or move the file out of data/ if it was dropped on purpose"})


def _v3_episodes(root: Path, info: dict[str, Any], features: list[Feature], out: LeRobotInfo) -> list[dict[str, Any]]:
    """v3.0: meta/episodes/chunk-*/file-*.parquet, one row per episode naming its data file and, per
    camera, its mp4 (many episodes concatenated) and half-open segment [from_timestamp, to_timestamp)."""
    info_path = root / "meta" / "info.json"
    files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not files:
        raise UserError(f"{root}: LeRobot v3.0 without meta/episodes/chunk-*/file-*.parquet",
                        hint="download the dataset's meta/ folder")
    entries = []
    for path in files:
        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:  # noqa: BLE001 (pyarrow raises several types for a damaged file)
            raise UserError(f"{path}: cannot read meta/episodes: {exc}", hint=META_FIX) from exc
        for row in rows:
            try:
                data = _format(info["data_path"], info_path, chunk_index=row["data/chunk_index"],
                               file_index=row["data/file_index"])
                videos = {}
                for f in (f for f in features if f.kind == "video"):
                    prefix = f"videos/{f.key}/"
                    videos[f.key] = (_format(info["video_path"], info_path, video_key=f.key,
                                             chunk_index=row[prefix + "chunk_index"],
                                             file_index=row[prefix + "file_index"]),
                                     float(row[prefix + "from_timestamp"]), float(row[prefix + "to_timestamp"]))
                entries.append({"episode_index": int(row["episode_index"]), "tasks": list(row.get("tasks") or []),
                                "length": row.get("length"), "data": data, "videos": videos})
            except (KeyError, TypeError) as exc:
                raise UserError(f"{path}: an episode row (episode_index {row.get('episode_index')!r}) has no "
                                f"valid column {exc}", hint=META_FIX) from exc
    named = {e["data"] for e in entries}
    pattern = re.sub(r"\{[^}]*\}", "*", info["data_path"])
    for path in sorted(root.glob(pattern)):
        rel = path.relative_to(root).as_posix()
        if rel not in named:
            message = f"{rel} is named by no episode in meta/episodes: not converted"
            out.skipped.append({"episode": rel, "reason": message})
            out.warnings.append({"message": message, "fix": META_FIX + ", or move the file out of data/"})
    return sorted(entries, key=lambda e: e["episode_index"])


def missing_videos(info: LeRobotInfo, features: tuple[Feature, ...]) -> UserError | None:
    """Every video file the episodes to convert need and lack, in one error (None when all are there):
    one message per run, not one per missing file."""
    missing: dict[str, dict[str, list[int]]] = {}  # feature -> path -> episodes
    for entry in info.episodes:
        for f in features:
            if f.kind == "video":
                rel = entry["videos"][f.key][0]
                if not (info.root / rel).is_file():
                    missing.setdefault(f.key, {}).setdefault(rel, []).append(int(entry["episode_index"]))
    if not missing:
        return None
    count = sum(len(paths) for paths in missing.values())
    lines = [f"{key}: {rel} (episode{'s' if len(eps) > 1 else ''} {', '.join(map(str, eps))})"
             for key, paths in sorted(missing.items()) for rel, eps in paths.items()]
    return UserError(f"{info.root}: {count} video file{'s' if count > 1 else ''} missing (by camera: the file and "
                     "the episodes in it):\n    "
                     + "\n    ".join(lines),
                     hint="download the dataset's videos/ too, convert without the camera(s) with "
                          + " ".join(f"--exclude {key}" for key in sorted(missing))
                          + ", or pass --skip-bad to convert the other episodes")


@lru_cache(maxsize=4)
def task_table(root: Path) -> dict[int, str] | None:
    """v2.x meta/tasks.jsonl: {task_index: task}, or None when absent. LeRobot's task of a frame is the
    entry its `task_index` names (read once per worker process)."""
    path = root / "meta" / "tasks.jsonl"
    if not path.is_file():
        return None
    table = {}
    for number, record in enumerate(read_jsonl(path), 1):
        index, task = record.get("task_index"), record.get("task")
        if isinstance(index, bool) or not isinstance(index, int) or not isinstance(task, str):
            raise UserError(f"{path}: record {number} needs an integer task_index and a string task, got "
                            f"{json.dumps(record)[:80]}", hint=META_FIX)
        table[index] = task
    return table
