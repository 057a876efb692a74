"""Fault injection for episode stores (tests only): rewrite real Parquet tables and files in place.

Every helper reads a table with pyarrow, changes it, and writes it back, so the store under test is
exactly what a user's converter could have produced.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

SERIES_F32 = pa.list_(pa.list_(pa.float32()))


def rewrite_table(store: Path, table: str, fn: Callable[[pa.Table], pa.Table]) -> None:
    """Read `store/table`, apply `fn`, write the result back (one row group per 64 rows, like synth)."""
    path = Path(store) / table
    pq.write_table(fn(pq.read_table(path)), path, row_group_size=64)


def replace_column(t: pa.Table, name: str, values: pa.Array | list[Any], type: pa.DataType | None = None) -> pa.Table:
    """`t` with column `name` replaced (keeping its position and, unless `type` is given, its type)."""
    array = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(
        values, type=type or t.schema.field(name).type)
    return t.set_column(t.schema.get_field_index(name), name, array)


def rewrite_cell(store: Path, table: str, column: str, episode: str, fn: Callable[[Any], Any]) -> None:
    """Replace one episode's cell of `column` by `fn(old cell as Python value)`."""
    def change(t: pa.Table) -> pa.Table:
        cells = t.column(column).to_pylist()
        row = t.column("episode_id").to_pylist().index(episode)
        cells[row] = fn(cells[row])
        return replace_column(t, column, cells)
    rewrite_table(store, table, change)


def rewrite_series(store: Path, table: str, field: str, episode: str,
                   fn: Callable[[np.ndarray], np.ndarray | list[list[float]]]) -> None:
    """Replace one episode's `[T, N+1]` time series by `fn(array)` (an array, or ragged lists of rows)."""
    def change(cell: list[list[float]]) -> list[list[float]]:
        new = fn(np.asarray(cell, dtype=np.float64))
        return new.tolist() if isinstance(new, np.ndarray) else new
    rewrite_cell(store, table, field, episode, change)


def series(store: Path, table: str, field: str, episode: str) -> np.ndarray:
    """One episode's time series as stored, `[T, N+1]`."""
    t = pq.read_table(Path(store) / table, columns=["episode_id", field])
    row = t.column("episode_id").to_pylist().index(episode)
    return np.asarray(t.column(field)[row].as_py(), dtype=np.float64)


def edit_yaml(store: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    """Edit store.yaml in place: `fn` mutates the parsed document."""
    path = Path(store) / "store.yaml"
    doc = yaml.safe_load(path.read_text())
    fn(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def manifest(out: Path) -> dict[str, Any]:
    return json.loads((Path(out) / "manifest.json").read_text())


def exported_samples(out: Path) -> dict[tuple[str, int], dict[str, bytes]]:
    """Every exported sample: (episode id, anchor) -> {member suffix (e.g. 'joints.npy'): bytes}."""
    samples: dict[str, dict[str, bytes]] = {}
    for shard in sorted(Path(out).rglob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                key, _, suffix = member.name.partition(".")
                samples.setdefault(key, {})[suffix] = tar.extractfile(member).read()
    out_map = {}
    for members in samples.values():
        meta = json.loads(members["meta.json"])
        out_map[(meta["episode_id"], meta["anchor"])] = members
    return out_map


def npy(blob: bytes) -> np.ndarray:
    return np.load(io.BytesIO(blob), allow_pickle=False)
