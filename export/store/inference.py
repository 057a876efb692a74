"""A field's kind from its Parquet column: the Arrow type decides, and for a string column the first
value (a path ending in an image or video extension is media, anything else text). Reads nothing:
the caller hands over the type and one sample, so inference stays cheap for any store size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from robowds.export.store.declarations import FieldSpec

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
VIDEO_EXTS = (".mp4", ".mkv", ".avi", ".webm", ".mov")


def _is_list(typ: pa.DataType) -> bool:
    return pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)


TYPED_LAYOUT = "{t: list<float64 | int64>, v: list<list<T>>} (T: bool, int8..int64, uint8..uint64, float32, float64)"


def _infer_typed(name: str, table: str, typ: pa.StructType) -> FieldSpec | str:
    """The typed time-series layout: times and values in two lists, so the values keep their dtype."""
    t, v = typ.field("t").type, typ.field("v").type
    why = f"a typed time series must be {TYPED_LAYOUT}, got {typ}"
    if not (_is_list(t) and _is_list(v) and _is_list(v.value_type)):
        return why
    tleaf, leaf = t.value_type, v.value_type.value_type
    if pa.types.is_floating(tleaf) and tleaf != pa.float64():
        return f"typed time series with {tleaf} times: they would lose precision (float32 has ~1 ms resolution " \
               "after 2 hours); write t as list<float64> (or list<int64> with time_unit: ns)"
    if not (tleaf == pa.float64() or pa.types.is_integer(tleaf)):
        return why
    if pa.types.is_boolean(leaf) or pa.types.is_integer(leaf):
        interpolation = "hold"
    elif leaf in (pa.float32(), pa.float64()):
        interpolation = "linear"
    else:
        return why
    return FieldSpec(name, table, "timeseries", str(typ), interpolation,
                     np.dtype(leaf.to_pandas_dtype()).name, layout="typed")


def infer_field(name: str, table: str, typ: pa.DataType, sample: Any) -> FieldSpec | str:
    """A FieldSpec from the Arrow type (and one sample value for path strings), or why not."""
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        inner = typ.value_type
        if pa.types.is_list(inner) or pa.types.is_large_list(inner) or pa.types.is_fixed_size_list(inner):
            leaf = inner.value_type
            if pa.types.is_floating(leaf):
                return FieldSpec(name, table, "timeseries", str(typ), "linear", leaf.to_pandas_dtype().__name__)
            if pa.types.is_integer(leaf) or pa.types.is_boolean(leaf):
                return FieldSpec(name, table, "timeseries", str(typ), "hold", leaf.to_pandas_dtype().__name__)
            return f"time-series values must be numeric, got {leaf}"
        if pa.types.is_floating(inner) or pa.types.is_integer(inner):
            return FieldSpec(name, table, "value", str(typ), value_dtype=inner.to_pandas_dtype().__name__)
        return f"unsupported list type {typ}"
    if pa.types.is_struct(typ):
        names = {typ.field(i).name for i in range(typ.num_fields)}
        if names == {"t", "v"}:
            return _infer_typed(name, table, typ)
        if {"path", "fps"} <= names and names <= {"path", "fps", "start_s", "end_s", "clock_offset_s"}:
            return FieldSpec(name, table, "video", str(typ), "nearest")
        return (f"unsupported struct {typ} (a video struct has path, fps, start_s, end_s, clock_offset_s; "
                f"a typed time series is {TYPED_LAYOUT})")
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        text = str(sample or "").lower()
        if text.endswith(IMAGE_EXTS):
            return FieldSpec(name, table, "image", str(typ))
        if text.endswith(VIDEO_EXTS):
            return FieldSpec(name, table, "video", str(typ), "nearest")
        return FieldSpec(name, table, "text", str(typ))
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return FieldSpec(name, table, "image", str(typ))
    if pa.types.is_floating(typ) or pa.types.is_integer(typ) or pa.types.is_boolean(typ):
        return FieldSpec(name, table, "value", str(typ), value_dtype=typ.to_pandas_dtype().__name__)
    return f"unsupported column type {typ}"


def first_strings(row: pa.Table) -> dict[str, str | None]:
    """The first row's string columns as text, for kind inference only: bytes that are not UTF-8 are
    replaced here (the episode pass reports them, naming episode and field, for every row)."""
    return {name: None if value is None else value.decode("utf-8", errors="replace")
            for name, value in zip(row.column_names,
                                   (row.column(c).cast(pa.large_binary())[0].as_py() for c in row.column_names))}


def invalid_utf8_row(column: pa.Array | pa.ChunkedArray) -> int | None:
    """Index of the first value of a string column that is not valid UTF-8 (None if all are).

    pyarrow does not check UTF-8 when it reads Parquet, so such bytes surface as a UnicodeDecodeError
    only when a value is converted; this finds which row, one value at a time (error path only)."""
    for row, value in enumerate(column.cast(pa.large_binary()).to_pylist()):
        if value is not None:
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                return row
    return None
