"""One HDF5 episode (a robomimic demo, an ALOHA file, a mapped group) -> one store row, in a worker.

The plan (`plan`) decided every field from the first episode; a task carries that decision
(dataset paths, kinds, dtypes, widths) and the episode's clock, and this module reads the episode's
datasets with h5py and checks them against it: a dataset that is missing, of another dtype or width,
or of another length than the episode's other per-step datasets is the episode's `UserError` (named
by file and episode, so `--skip-bad` can leave it out). Times are `k / rate_hz` in float64 (k the
integer step), or a time dataset's values scaled to seconds. Memory: one dataset at a time (a camera's
frames are read, encoded and dropped before the next).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robowds.export.convert.hdf5.frames import cut_jpeg_rows, pick_length_row, write_jpegs, write_raw
from robowds.export.convert.hdf5.layout import store_dtype
from robowds.export.errors import UserError


def require_h5py():  # noqa: ANN201 (the h5py module)
    """h5py, imported only when an HDF5 conversion runs (an optional dependency)."""
    try:
        import h5py
    except ImportError as exc:
        raise UserError("robowds convert hdf5 needs the h5py package, which is not installed",
                        hint="pip install 'robowds[convert]'  (or: pip install h5py)") from exc
    return h5py


@dataclass(frozen=True)
class Source:
    """One field of every episode: where it is read and what it must look like."""

    field: str  # store field name
    kind: str  # "timeseries" | "video" | "text"
    path: str  # dataset path relative to the episode group; for text, the group's attribute name
    dtype: str = ""  # store dtype (time series) or "uint8" / "vlen-bytes" / "vlen-uint8" (video)
    width: int = 0  # values per step (time series)
    time: str | None = None  # its own [T] time dataset (mapping), else the episode clock
    jpeg_rows: bool = False  # video stored as padded JPEG rows [T, L] uint8
    lengths: str | None = None  # ALOHA: `/compress_len` [cams, T], path from the file root
    lengths_row: int = -1  # the camera's position in name order (the row tried first)


@dataclass(frozen=True)
class EpisodeTask:
    """All a worker needs for one episode (picklable, a few hundred bytes)."""

    file: Path
    group: str  # episode group path in the file ("" = the file root)
    episode_id: str
    label: str  # "demo demo_3", "episode file", "group episodes/ep_1": for messages
    sources: tuple[Source, ...]
    rate_hz: float | None  # steps at k / rate_hz ...
    time: str | None = None  # ... or this [T] dataset (relative to the group) ...
    ticks_per_s: float = 1.0  # ... divided by this
    split: str | None = None  # robomimic mask -> the store's `split` column
    codec: str = "ffv1"  # raw frames' codec
    num_samples: int | None = None  # robomimic's per-demo attribute, checked against the datasets

    @property
    def where(self) -> str:
        return f"{self.file} ({self.label})"


def _fail(task: EpisodeTask, message: str, hint: str) -> UserError:
    return UserError(f"{task.where}: {message}", hint=f"{hint}, or pass --skip-bad to leave this episode out")


def _dataset(task: EpisodeTask, group: Any, path: str) -> Any:
    node = group.get(path)
    if node is None or not hasattr(node, "shape"):
        held = sorted(group.keys()) if hasattr(group, "keys") else []
        raise _fail(task, f"dataset {path!r} is missing (the episode holds {held[:12]})",
                    "convert files of one layout together, or --exclude the field")
    return node


def _times(task: EpisodeTask, group: Any, path: str, length: int) -> np.ndarray:
    """[T] float64 seconds from a time dataset."""
    data = _dataset(task, group, path)
    values = np.asarray(data[()])
    if values.ndim != 1 or values.dtype.kind not in "iuf" or len(values) != length:
        raise _fail(task, f"time dataset {path!r} must be one number per step ({length}), got "
                          f"{values.dtype} {list(values.shape)}", "point time at the episode's [T] timestamps")
    return values.astype(np.float64) / task.ticks_per_s


def _series(task: EpisodeTask, src: Source, data: Any) -> np.ndarray:
    values = np.asarray(data[()])
    dtype = store_dtype(values.dtype.newbyteorder("=").name if values.dtype.kind in "biuf" else "other")
    width = int(np.prod(values.shape[1:], dtype=np.int64)) if values.ndim > 1 else 1
    if dtype != src.dtype or width != src.width:
        raise _fail(task, f"dataset {src.path!r} is {values.dtype} with {width} values per step; the first "
                          f"episode's is {src.dtype} with {src.width}", "convert episodes of one shape together")
    return values.reshape(len(values), width).astype(np.dtype(dtype).newbyteorder("="), copy=False)  # [T, N]


def _video(task: EpisodeTask, src: Source, data: Any, f: Any, t: np.ndarray, folder: Path) -> dict[str, Any]:
    path = folder / "media" / src.field / f"{task.episode_id}.mkv"
    try:
        if src.jpeg_rows:
            rows = np.asarray(data[()])  # [T, L] uint8
            lengths = None
            if src.lengths is not None and src.lengths in f:
                compress_len = np.asarray(f[src.lengths][()])  # [cams, T]
                row = pick_length_row(rows, compress_len, src.lengths_row)
                lengths = compress_len[row] if row is not None else None
            offset = write_jpegs(cut_jpeg_rows(rows, lengths), t, path)
        elif src.dtype in ("vlen-bytes", "vlen-uint8"):
            offset = write_jpegs([bytes(np.asarray(x, np.uint8)) if not isinstance(x, bytes) else x
                                  for x in data[()]], t, path)
        else:
            if data.dtype != np.uint8 or data.ndim != 4 or data.shape[-1] != 3:
                raise ValueError(f"frames must be uint8 [T, H, W, 3], got {data.dtype} {list(data.shape)}")
            # one frame at a time from the file ([H, W, 3] each): memory is a frame, not the episode
            offset = write_raw((data[k] for k in range(data.shape[0])), t, path, task.codec)
    except ValueError as exc:
        raise _fail(task, f"camera dataset {src.path!r}: {exc}", f"--exclude {src.field}") from exc
    fps = 1.0 / float(np.median(np.diff(t))) if task.rate_hz is None and len(t) > 1 else (task.rate_hz or 0.0)
    return {"path": path.relative_to(folder).as_posix(), "fps": fps, "start_s": None, "end_s": None,
            "clock_offset_s": offset}


def _text(task: EpisodeTask, group: Any, src: Source) -> str:
    if src.path not in group.attrs:
        raise _fail(task, f"attribute {src.path!r} of field {src.field!r} is missing", "fix the mapping's attr")
    value = group.attrs[src.path]
    value = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    if not isinstance(value, str):
        raise _fail(task, f"attribute {src.path!r} of field {src.field!r} is {type(value).__name__}, not text",
                    "map a string attribute")
    return value


def convert_episode(task: EpisodeTask, folder: Path) -> dict[str, Any]:
    """One store row: typed time series on the episode clock, one video per camera, text, the split."""
    h5py = require_h5py()
    try:
        f = h5py.File(task.file, "r")
    except OSError as exc:
        raise _fail(task, f"cannot open the HDF5 file: {exc}", "check the file") from exc
    with f:
        group = f[task.group] if task.group else f
        steps = [s for s in task.sources if s.kind != "text" and s.time is None]  # on the episode clock
        data = {s.path: _dataset(task, group, s.path) for s in task.sources if s.kind != "text"}
        lengths = {s.path: int(data[s.path].shape[0]) if data[s.path].shape else 0 for s in steps}
        if len(set(lengths.values())) > 1:
            listed = ", ".join(f"{p} {n}" for p, n in lengths.items())
            raise _fail(task, f"datasets of different lengths in one episode: {listed}",
                        "fix the file, or --exclude the odd dataset")
        length = next(iter(lengths.values()), 0)
        if task.num_samples is not None and steps and task.num_samples != length:
            raise _fail(task, f"attribute num_samples = {task.num_samples} but the datasets hold {length} steps",
                        "fix the file")
        if steps and length == 0:
            raise _fail(task, "the episode has no steps", "leave it out")
        t = (np.arange(length, dtype=np.float64) / task.rate_hz if task.time is None
             else _times(task, group, task.time, length))  # [T] seconds
        row: dict[str, Any] = {"episode_id": task.episode_id, "split": task.split}
        for src in task.sources:
            if src.kind == "text":
                row[src.field] = _text(task, group, src)
                continue
            own_t = t if src.time is None else _times(task, group, src.time, int(data[src.path].shape[0]))
            if src.kind == "timeseries":
                row[src.field] = {"t": own_t, "v": _series(task, src, data[src.path])}  # v: [T, N]
            else:
                row[src.field] = _video(task, src, data[src.path], f, own_t, folder)
    return row
