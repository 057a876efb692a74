"""What every converter writes: one `episodes.parquet` row per episode, typed columns, and `store.yaml`.

A converter describes its fields once (`FieldSpec`) and produces one plain row per episode:

- timeseries: `{"t": float64 [T] seconds, "v": [T, N] in the field's dtype}` (typed `{t, v}` layout, so
  bool/int values stay exact), or None for a stream the episode did not record; `v` may also be an
  Arrow list array of T rows of N values (a source's own column, passed through without a numpy copy:
  this halved LeRobot's per-episode cost);
- video: `{"path": str relative to the store, "fps": float, "start_s", "end_s", "clock_offset_s": float
  or None}`;
- text: a string; value: a scalar or a 1-D array per episode.

`arrow_table` turns rows into Arrow columns straight from the numpy buffers (offsets + flat values):
building them from Python lists was 4x slower on the G1 tables. Memory: the rows given (one episode
per call in the driver).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa

KINDS = ("timeseries", "video", "text", "value")
VIDEO_TYPE = pa.struct([("path", pa.string()), ("fps", pa.float64()), ("start_s", pa.float64()),
                        ("end_s", pa.float64()), ("clock_offset_s", pa.float64())])


@dataclass(frozen=True)
class FieldSpec:
    """One store field: its name, kind, value dtype and declarations (written to store.yaml)."""

    name: str  # store field name, `[a-z][a-z0-9_]{0,31}` (see `field_name`)
    kind: str  # one of KINDS
    dtype: str = "float32"  # numpy dtype of the values (timeseries, value)
    names: tuple[str, ...] | None = None  # one per value column
    source: str = ""  # where it comes from in the source (for the report)
    declare: dict[str, Any] = field(default_factory=dict)  # other store.yaml keys (interpolation, units...)

    def declarations(self) -> dict[str, Any]:
        decl: dict[str, Any] = {}
        if self.kind == "timeseries" and self.names:
            decl["names"] = list(self.names)
        if self.kind == "timeseries" and np.dtype(self.dtype).kind in "biu":
            decl["interpolation"] = "hold"  # a flag or an index is never interpolated
        decl.update(self.declare)
        return decl


def field_name(key: str) -> str:
    """A source key -> a store field name: lowercase `[a-z0-9_]`, starting with a letter, at most 32
    characters, never ending in `_` (a cut name could) nor in `_mask` (reserved for masks)."""
    name = re.sub(r"[^a-z0-9_]", "_", key.lower())
    if not name or not name[0].isalpha():
        name = f"f_{name}"
    name = name[:32].rstrip("_") or "f"
    if name.endswith("_mask"):
        name = name[:-5] + "_msk"
    return name


def unique_names(keys: Sequence[str], taken: Iterable[str] = ()) -> list[str]:
    """Valid, distinct field names for `keys`, in order (see `field_name`): a clash with an earlier key
    or with a name in `taken` (fields the converter or the user fixed) gets `_2`, `_3`..."""
    used, out = set(taken), []
    for key in keys:
        base = name = field_name(key)
        k = 2
        while name in used:
            suffix = f"_{k}"
            name = base[: 32 - len(suffix)] + suffix
            k += 1
        used.add(name)
        out.append(name)
    return out


def _list_array(values: list[np.ndarray], leaf: pa.DataType) -> pa.Array:
    """`list<leaf>` from 1-D arrays, built from one offsets buffer and one flat values buffer."""
    lengths = np.array([len(v) for v in values], dtype=np.int64)  # [R]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)  # [R + 1]
    flat = np.concatenate(values) if values else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, leaf))


def _offsets(rows: pa.Array) -> np.ndarray:
    """[T + 1] offsets of a list or fixed-size-list array's rows into its flattened values."""
    if pa.types.is_fixed_size_list(rows.type):
        return np.arange(len(rows) + 1, dtype=np.int64) * rows.type.list_size
    offsets = rows.offsets.to_numpy()  # [T + 1]
    return offsets - offsets[0]


def _timeseries_column(cells: list[Any], spec: FieldSpec) -> pa.Array:
    dtype = np.dtype(spec.dtype)
    leaf = pa.from_numpy_dtype(dtype)
    typ = pa.struct([("t", pa.list_(pa.float64())), ("v", pa.list_(pa.list_(leaf)))])
    if any(c is None for c in cells):  # rare (a stream an episode did not record): the simple path
        return pa.array([None if c is None else {"t": np.asarray(c["t"], np.float64).tolist(),
                                                 "v": np.asarray(c["v"], dtype).reshape(len(c["t"]), -1).tolist()}
                         for c in cells], type=typ)
    ts = [np.asarray(c["t"], np.float64) for c in cells]  # each [T]
    if len(cells) == 1 and isinstance(cells[0]["v"], pa.Array):  # Arrow rows passed through, no numpy trip
        rows_array = cells[0]["v"]
        if len(rows_array) != len(ts[0]):
            raise ValueError(f"{spec.name}: {len(ts[0])} times but {len(rows_array)} value rows")
        inner = pa.ListArray.from_arrays(pa.array(_offsets(rows_array), pa.int32()),
                                         rows_array.flatten().cast(leaf))
        v_col = pa.ListArray.from_arrays(pa.array([0, len(rows_array)], pa.int32()), inner)
        return pa.StructArray.from_arrays([_list_array(ts, pa.float64()), v_col], fields=list(typ))
    vs = [np.asarray(c["v"], dtype).reshape(len(t), -1) for c, t in zip(cells, ts)]  # each [T, N]
    t_col = _list_array(ts, pa.float64())
    rows = _list_array([v.reshape(-1) for v in vs], leaf)  # flat values per episode
    # rows of N values: split each episode's flat values into T lists of width N
    widths = [v.shape[1] for v in vs]
    row_lengths = np.concatenate([np.full(len(t), w, np.int64) for t, w in zip(ts, widths)]) if ts else np.zeros(0)
    row_offsets = np.concatenate([[0], np.cumsum(row_lengths)]).astype(np.int32)
    inner = pa.ListArray.from_arrays(pa.array(row_offsets, pa.int32()), rows.flatten())
    ep_offsets = np.concatenate([[0], np.cumsum([len(t) for t in ts])]).astype(np.int32)
    v_col = pa.ListArray.from_arrays(pa.array(ep_offsets, pa.int32()), inner)
    return pa.StructArray.from_arrays([t_col, v_col], fields=list(typ))


def _value_column(cells: list[Any], spec: FieldSpec) -> pa.Array:
    dtype = np.dtype(spec.dtype)
    arrays = [np.asarray(c, dtype) for c in cells]
    if all(a.ndim == 0 for a in arrays):
        return pa.array(np.array(arrays, dtype), pa.from_numpy_dtype(dtype))
    return _list_array([a.reshape(-1) for a in arrays], pa.from_numpy_dtype(dtype))


def arrow_table(rows: list[dict[str, Any]], specs: Sequence[FieldSpec]) -> pa.Table:
    """The episodes table for `rows` (the same schema for any rows of the same specs)."""
    columns: dict[str, pa.Array] = {"episode_id": pa.array([r["episode_id"] for r in rows], pa.string())}
    for spec in specs:
        cells = [r.get(spec.name) for r in rows]
        if spec.kind == "timeseries":
            columns[spec.name] = _timeseries_column(cells, spec)
        elif spec.kind == "video":
            columns[spec.name] = pa.array(cells, type=VIDEO_TYPE)
        elif spec.kind == "text":
            columns[spec.name] = pa.array(cells, pa.string())
        elif spec.kind == "value":
            columns[spec.name] = _value_column(cells, spec)
        else:
            raise ValueError(f"unknown field kind {spec.kind!r}")
    return pa.table(columns)


def store_yaml(specs: Sequence[FieldSpec], media_roots: Sequence[str], header: str,
               extra: dict[str, Any] | None = None) -> str:
    """store.yaml: `media_roots` (the source folders that referenced media live in), top-level keys in
    `extra` (e.g. `clock`), and each field's declarations, one JSON-style line per field."""
    lines = [f"# {header}", "version: 1"]
    if media_roots:
        lines.append(f"media_roots: [{', '.join(json.dumps(str(r)) for r in media_roots)}]")
    for key, value in (extra or {}).items():
        lines.append(f"{key}: {json.dumps(value)}")
    decls = [(s.name, s.declarations()) for s in specs if s.declarations()]
    if decls:
        lines.append("fields:")
        lines.extend(f"  {name}: {json.dumps(decl)}" for name, decl in decls)
    return "\n".join(lines) + "\n"
