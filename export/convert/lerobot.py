"""LeRobot v2.0 / v2.1 / v3.0 datasets -> an episode store, exactly.

Layout read (LeRobot's own documentation): `meta/info.json` (fps, features with dtype, shape and names,
`data_path` / `video_path` templates, `chunks_size`); v2.x: `meta/episodes.jsonl` (episode_index, tasks,
length) and one Parquet file and mp4 per episode; v3.0: `meta/episodes/chunk-*/file-*.parquet` (per
episode its data file and, per camera, its mp4 and segment), Parquet and mp4 files of many episodes.

Mapping (one store row per episode, `episode_id` = `episode_<index:06d>`):
- every numeric feature except LeRobot's bookkeeping columns -> a typed time series `{t, v}`:
  `t = frame_index / fps` in float64 (LeRobot's `timestamp` column is float32: ~2 us steps at 60 s, and
  its last frames would round onto the wrong grid point), `v` the values in their stored dtype; `names`
  (flat, or nested one level as LeRobot writes them) become the field's `names`;
- every video feature -> a video field `{path, fps, start_s, end_s}` pointing at the source file through
  a symlink in `media/` (referenced, never copied or re-encoded; store.yaml lists the source under
  `media_roots`); v3.0 files hold many episodes, each the half-open segment
  `[from_timestamp, to_timestamp)` of `meta/episodes`;
- the episode's tasks -> text field `task` (several tasks joined with " | ").
Feature keys become field names with `.` -> `_` (`observation.state` -> `observation_state`).

Episodes that meta lists but whose Parquet file is absent (a partial download) are skipped and listed
in `convert_report.json`. Memory: one episode's table at a time, O(longest episode).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from robowds.export.errors import UserError

BOOKKEEPING = {"timestamp", "frame_index", "episode_index", "index", "task_index"}  # LeRobot's own columns
SUPPORTED = ("v2.0", "v2.1", "v3.0")


@dataclass(frozen=True)
class Feature:
    key: str  # LeRobot's feature key, e.g. observation.state
    field: str  # the store's field name, e.g. observation_state
    kind: str  # "timeseries" | "video"
    dtype: str
    names: tuple[str, ...] | None


@dataclass
class Conversion:
    """What a conversion found: the info, the mapped features, the episodes with their files, and the
    episodes skipped with the reason."""

    root: Path
    fps: float
    version: str
    features: list[Feature]
    episodes: list[dict[str, Any]]  # listed episodes whose data files exist, each with its data path and videos
    skipped: list[dict[str, Any]] = field(default_factory=list)


def field_name(key: str) -> str:
    """LeRobot feature key -> store field name (lowercase, `[a-z0-9_]`, at most 32 characters)."""
    name = re.sub(r"[^a-z0-9_]", "_", key.lower())
    if not name or not name[0].isalpha():
        name = f"f_{name}"
    return name[:32]


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
    width = int(np.prod(spec.get("shape") or [1]))
    return tuple(names) if len(names) == width else None


def read_info(root: Path) -> Conversion:
    """Open `meta/`: the features to map and the episodes whose Parquet files exist."""
    info_path = root / "meta" / "info.json"
    if not info_path.is_file():
        raise UserError(f"{root} is not a LeRobot dataset: {info_path} is missing",
                        hint="pass the dataset root (the folder holding meta/, data/ and videos/)")
    try:
        info = json.loads(info_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{info_path} is not JSON: {exc}", hint="download the dataset's meta/ again") from exc
    version = str(info.get("codebase_version", ""))
    if version not in SUPPORTED:
        raise UserError(f"{info_path}: LeRobot codebase_version {version!r} is not supported by this converter",
                        hint=f"supported: {', '.join(SUPPORTED)}")
    features = []
    for key, spec in sorted(info.get("features", {}).items()):
        if key in BOOKKEEPING:
            continue
        dtype = str(spec.get("dtype"))
        if dtype in ("video", "image"):
            if dtype == "video":
                features.append(Feature(key, field_name(key), "video", "uint8", None))
            continue  # per-frame images in Parquet: not mapped yet (listed in the report)
        if np.dtype(dtype if dtype != "bool" else "bool").kind not in "biuf":
            continue
        features.append(Feature(key, field_name(key), "timeseries", dtype, _names(spec)))
    clash = {f.field for f in features if sum(g.field == f.field for g in features) > 1}
    if clash:
        raise UserError(f"{info_path}: features map to the same field name(s) {sorted(clash)}",
                        hint="rename the features, or convert with a custom script")
    episodes, skipped = [], []
    listed = _v3_episodes(root, info, features) if version == "v3.0" else _v2_episodes(root, info, features)
    for entry in listed:
        path = root / entry["data"]
        if not path.is_file():
            skipped.append({"episode_index": entry["episode_index"], "reason": f"{entry['data']} is missing"})
            continue
        episodes.append(entry)
    return Conversion(root, float(info["fps"]), version, features, episodes, skipped)


def _v2_episodes(root: Path, info: dict[str, Any], features: list[Feature]) -> list[dict[str, Any]]:
    """v2.x: meta/episodes.jsonl, one Parquet file and one mp4 per episode (pts from 0)."""
    out = []
    for line in (root / "meta" / "episodes.jsonl").read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            index = int(entry["episode_index"])
            out.append({**entry, "data": _data_path(info, index),
                        "videos": {f.key: (_video_path(info, index, f.key), None, None)
                                   for f in features if f.kind == "video"}})
    return out


def _v3_episodes(root: Path, info: dict[str, Any], features: list[Feature]) -> list[dict[str, Any]]:
    """v3.0: meta/episodes/chunk-*/file-*.parquet, one row per episode naming its data file and, per
    camera, its mp4 (many episodes concatenated) and half-open segment [from_timestamp, to_timestamp)."""
    files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not files:
        raise UserError(f"{root}: LeRobot v3.0 without meta/episodes/chunk-*/file-*.parquet",
                        hint="download the dataset's meta/ folder")
    out = []
    for path in files:
        for row in pq.read_table(path).to_pylist():
            data = info["data_path"].format(chunk_index=row["data/chunk_index"], file_index=row["data/file_index"])
            videos = {}
            for f in (f for f in features if f.kind == "video"):
                prefix = f"videos/{f.key}/"
                videos[f.key] = (info["video_path"].format(video_key=f.key, chunk_index=row[prefix + "chunk_index"],
                                                           file_index=row[prefix + "file_index"]),
                                 float(row[prefix + "from_timestamp"]), float(row[prefix + "to_timestamp"]))
            out.append({"episode_index": int(row["episode_index"]), "tasks": list(row.get("tasks") or []),
                        "length": row.get("length"), "data": data, "videos": videos})
    return sorted(out, key=lambda e: e["episode_index"])


def _chunk(info: dict[str, Any], index: int) -> int:
    return index // int(info.get("chunks_size", 1000))


def _data_path(info: dict[str, Any], index: int) -> str:
    return info["data_path"].format(episode_chunk=_chunk(info, index), episode_index=index)


def _video_path(info: dict[str, Any], index: int, key: str) -> str:
    return info["video_path"].format(episode_chunk=_chunk(info, index), episode_index=index, video_key=key)


class _Tables:
    """The last data file read, kept: v3 files hold many episodes, so each file is read and grouped by
    episode once (a stable sort of its episode_index column), not scanned again per episode.
    O(one file) memory."""

    def __init__(self, columns: list[str]) -> None:
        self.columns, self.path, self.table = columns, None, None
        self.order, self.episodes = np.zeros(0, np.int64), np.zeros(0, np.int64)  # [R] row order, [R] its episodes

    def episode(self, path: Path, index: int, v3: bool) -> pa.Table:
        if path != self.path:
            self.path, self.table = path, pq.read_table(path, columns=[*self.columns, *(["episode_index"] if v3 else [])])
            if v3:
                episodes = self.table.column("episode_index").to_numpy()  # [R]
                self.order = np.argsort(episodes, kind="stable")  # rows of one episode together, in file order
                self.episodes = episodes[self.order]
        if not v3:
            return self.table
        lo, hi = np.searchsorted(self.episodes, [index, index + 1])
        return self.table.take(self.order[lo:hi])


def episode_rows(conv: Conversion, media: Path) -> Iterator[dict[str, Any]]:
    """One store row per episode: typed time series, video structs (symlinks made in `media`), task."""
    series = [f for f in conv.features if f.kind == "timeseries"]
    tables = _Tables(["frame_index", *[f.key for f in series]])
    for entry in conv.episodes:
        index = int(entry["episode_index"])
        table = tables.episode(conv.root / entry["data"], index, conv.version == "v3.0")
        t = table.column("frame_index").to_numpy().astype(np.float64) / conv.fps  # [T] exact grid times
        row: dict[str, Any] = {"episode_id": f"episode_{index:06d}",
                               "task": " | ".join(str(x) for x in entry.get("tasks", []))}
        for f in series:
            values = _values(table.column(f.key), len(t))  # [T, N]
            row[f.field] = {"t": t, "v": values}
        for f in (f for f in conv.features if f.kind == "video"):
            rel, start, end = entry["videos"][f.key]
            source = (conv.root / rel).resolve()
            if not source.is_file():
                raise UserError(f"episode {index}: video {source} of feature {f.key!r} is missing",
                                hint="download the dataset's videos/ too")
            link = media / f.field / "_".join(Path(rel).parts[-2:])  # chunk-000_episode_000001.mp4 (v2) or
            # chunk-000_file-000.mp4 (v3: one link per file, shared by the episodes it holds)
            if not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(source)
            row[f.field] = {"path": link.relative_to(media.parent).as_posix(), "fps": conv.fps,
                            "start_s": start, "end_s": end}
        yield row


def _values(column: pa.ChunkedArray, length: int) -> np.ndarray:
    """A feature column as [T, N] in its stored dtype (scalars and fixed-size lists alike)."""
    array = column.combine_chunks()
    if pa.types.is_list(array.type) or pa.types.is_fixed_size_list(array.type) or pa.types.is_large_list(array.type):
        flat = array.flatten().to_numpy(zero_copy_only=False)
        return flat.reshape(length, -1)
    return array.to_numpy(zero_copy_only=False).reshape(length, 1)


def store_table(rows: list[dict[str, Any]], conv: Conversion) -> pa.Table:
    """Rows of the episodes table, typed columns built explicitly so that float32 values stay float32
    (the same schema for every batch of rows)."""
    columns: dict[str, pa.Array] = {"episode_id": pa.array([r["episode_id"] for r in rows], pa.string()),
                                    "task": pa.array([r["task"] for r in rows], pa.string())}
    for f in conv.features:
        if f.kind == "timeseries":
            value_type = pa.from_numpy_dtype(np.dtype(f.dtype))
            typ = pa.struct([("t", pa.list_(pa.float64())), ("v", pa.list_(pa.list_(value_type)))])
            columns[f.field] = pa.array([{"t": r[f.field]["t"].tolist(), "v": r[f.field]["v"].tolist()}
                                         for r in rows], type=typ)
        else:
            columns[f.field] = pa.array([r[f.field] for r in rows], type=pa.struct(
                [("path", pa.string()), ("fps", pa.float64()), ("start_s", pa.float64()), ("end_s", pa.float64())]))
    return pa.table(columns)


def store_yaml(conv: Conversion) -> str:
    """Declarations: names per time series, hold for bool/int values; the source as a media root."""
    lines = ["# written by robowds convert lerobot", f"media_roots: [{json.dumps(str(conv.root.resolve()))}]",
             "fields:"]
    for f in conv.features:
        decl = {}
        if f.kind == "timeseries" and f.names:
            decl["names"] = list(f.names)
        if f.kind == "timeseries" and np.dtype(f.dtype).kind in "biu":
            decl["interpolation"] = "hold"
        if decl:
            lines.append(f"  {f.field}: {json.dumps(decl)}")
    if lines[-1] == "fields:":
        lines.pop()
    return "\n".join(lines) + "\n"


def convert_lerobot(src: Path, store: Path, overwrite: bool = False, progress: bool = False) -> dict[str, Any]:
    """Convert the LeRobot dataset at `src` into a new episode store at `store`; returns the report
    (also written as `store/convert_report.json`). `progress`: a bar over episodes on stderr."""
    from robowds.export.convert.store_writer import write_store

    conv = read_info(Path(src).resolve())
    if not conv.episodes:
        raise UserError(f"{src}: none of the {len(conv.skipped)} episodes meta lists has its Parquet file",
                        hint="download the dataset's data/ folder")

    def build(folder: Path) -> dict[str, Any]:
        # one row group per episode, written as it is converted: memory is one episode, not the dataset
        writer, count = None, 0
        try:
            for row in tqdm(episode_rows(conv, folder / "media"), total=len(conv.episodes), desc="convert",
                            unit="ep", disable=not progress):
                table = store_table([row], conv)
                if writer is None:
                    writer = pq.ParquetWriter(folder / "episodes.parquet", table.schema)
                writer.write_table(table)
                count += 1
        finally:
            if writer is not None:
                writer.close()
        (folder / "store.yaml").write_text(store_yaml(conv))
        return {"format": "lerobot", "version": conv.version, "source": str(conv.root), "fps": conv.fps,
                "episodes": count, "skipped": conv.skipped,
                "fields": {f.field: {"source": f.key, "kind": f.kind, "dtype": f.dtype} for f in conv.features}}

    return write_store(Path(store), build, overwrite)
