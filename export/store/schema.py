"""The episode store's schema: tables, fields, kinds and declarations (the README, section "The episode store").

Opening a store reads only Parquet footers and the `episode_id` columns, so it is cheap for any store
size. Structural problems are collected as `Problem`s instead of raised one at a time, so `validate`
can report all of them; `StoreSchema.raise_if_errors` turns them into one user error for `export`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from robowds.export.core.resample import METHODS, QUAT_ORDERS
from robowds.export.errors import UserError
from robowds.export.store.location import RemoteStoreError, StoreFile, StoreLocation, media_rel, store_location
from robowds.export.store.yamlio import YamlError, load_bytes
from robowds.reader.format import FIELD_RE, MASK_SUFFIX, META_FIELD

KINDS = ("timeseries", "video", "image", "text", "value")
RESERVED_COLUMNS = ("episode_id", "split", "start_s", "end_s")
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
VIDEO_EXTS = (".mp4", ".mkv", ".avi", ".webm", ".mov")
DECL_KEYS = {"kind", "interpolation", "names", "units", "max_gap_s", "time_unit", "quaternion_order", "fps"}
SERIES_KEYS = {"names", "units", "max_gap_s", "time_unit", "quaternion_order"}  # meaningless for other kinds
STORE_YAML = "store.yaml"
# an export config kept with the store (`convert lerobot` writes one): not store content, so editing it
# does not change the fingerprint (earlier exports still verify against the store)
EXPORT_YAML = "export.yaml"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the store; `error` problems make it non-exportable."""

    severity: str  # "error" | "warning"
    message: str
    episode: str | None = None
    field: str | None = None
    hint: str | None = None

    @property
    def located(self) -> str:
        """The message after its episode and field: "episode 'e', field 'f': message"."""
        where = ", ".join(p for p in (f"episode {self.episode!r}" if self.episode else "",
                                      f"field {self.field!r}" if self.field else "") if p)
        return f"{where + ': ' if where else ''}{self.message}"

    def __str__(self) -> str:
        text = f"{self.severity}: {self.located}"
        return text + (f" (fix: {self.hint})" if self.hint else "")


@dataclass(frozen=True)
class FieldSpec:
    name: str
    table: str  # parquet file name
    kind: str
    arrow_type: str
    interpolation: str | None = None  # timeseries / video
    value_dtype: str | None = None  # numpy dtype of the stored values
    names: tuple[str, ...] | None = None
    units: str | tuple[str, ...] | None = None
    max_gap_s: float | None = None
    time_unit: str = "s"
    quaternion_order: str | None = None
    fps: float | None = None
    declared: bool = False
    # "typed": the struct layout {t: list<float64 | int64>, v: list<list<T>>}; None: [T, N+1] rows
    layout: str | None = None

    def describe(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if v is not None and k not in ("name", "declared")}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


@dataclass
class StoreSchema:
    location: StoreLocation  # a local folder or an fsspec URL (export/store/location.py)
    tables: dict[str, list[str]]  # parquet file -> its field columns
    fields: dict[str, FieldSpec]
    episode_ids: list[str]  # sorted
    rows: dict[str, dict[str, tuple[int, int]]]  # table -> episode_id -> (row group, row in group)
    reserved: dict[str, str]  # reserved column -> table holding it
    clock: str | None
    problems: list[Problem] = field(default_factory=list)
    # store.yaml `media_roots`, resolved: folders outside the store that media may live in (opt-in)
    media_roots: tuple[Path, ...] = ()

    @property
    def root(self) -> Path | str:
        """The store's folder, or its URL when it is in object storage (for messages)."""
        return self.location.path if self.location.local else self.location.url

    def media_path(self, rel: str) -> Path | StoreFile:
        """A media path from a table, resolved and confined to the store or a declared media root;
        a `StoreFile` (opened by range) when the store is in object storage."""
        if self.location.local:
            return safe_media_path(self.location.path, rel, self.media_roots)
        try:
            return StoreFile(self.location, media_rel(rel))
        except ValueError:
            raise MediaPathError(f"media path {rel!r} must be relative to the store and stay inside it",
                                 hint="write paths relative to the store URL, without `..`, a leading `/` or a "
                                      "URL scheme") from None

    def local_folders(self) -> list[Path]:
        """The folders export tasks read from the local file system (every Ray node must see them)."""
        return [self.location.path, *self.media_roots] if self.location.local else []

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    def raise_if_errors(self) -> None:
        errors = self.errors
        if len(errors) == 1:  # one problem: its own fix, not a second "error:" inside the message
            only = errors[0]
            raise UserError(f"store {self.root}: {only.located}",
                            hint=only.hint or "run `robowds validate STORE` for the full report")
        if errors:
            listed = "\n  ".join(str(p) for p in errors[:20])
            more = f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""
            raise UserError(f"store {self.root} has {len(errors)} problem(s):\n  {listed}{more}",
                            hint="run `robowds validate STORE` for the full report")

    def timeseries(self) -> list[FieldSpec]:
        return [f for f in self.fields.values() if f.kind == "timeseries"]


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


def _infer(name: str, table: str, typ: pa.DataType, sample: Any) -> FieldSpec | str:
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


def _first_strings(row: pa.Table) -> dict[str, str | None]:
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


def _load_declarations(location: StoreLocation, problems: list[Problem]
                       ) -> tuple[dict[str, dict[str, Any]], str | None, tuple[Path, ...]]:
    where = location.join(STORE_YAML)
    try:
        if not ((location.path / STORE_YAML).exists() if location.local else location.is_file(STORE_YAML)):
            return {}, None, ()
        doc = load_bytes(location.read_bytes(STORE_YAML), where) or {}
    except YamlError as exc:
        problems.append(Problem("error", f"{STORE_YAML} is {exc.reason}", hint=f"fix {where}"))
        return {}, None, ()
    except OSError as exc:
        problems.append(Problem("error", f"{STORE_YAML} cannot be read: {exc.strerror or exc}",
                                hint=f"make {where} a readable YAML file, or remove it"))
        return {}, None, ()
    if not isinstance(doc, dict):
        problems.append(Problem("error", f"{STORE_YAML} must be a mapping",
                                hint="see docs/store.md, section store.yaml"))
        return {}, None, ()
    unknown = set(doc) - {"version", "clock", "fields", "media_roots"}
    if unknown:
        problems.append(Problem("error", f"{STORE_YAML}: unknown key(s) {sorted(unknown)}",
                                hint="known: version, clock, fields, media_roots"))
    if doc.get("version", 1) != 1:
        problems.append(Problem("error", f"{STORE_YAML}: version {doc.get('version')!r} is not supported (1)"))
    decls = doc.get("fields") or {}
    if not isinstance(decls, dict):
        problems.append(Problem("error", f"{STORE_YAML}: fields must be a mapping of field name -> declaration, "
                                f"got a {type(decls).__name__}",
                                hint="write `fields:` then one indented `name:` per field, without `- ` in front"))
        decls = {}
    clock = doc.get("clock")
    if clock is not None and not isinstance(clock, str):
        problems.append(Problem("error", f"{STORE_YAML}: clock must be a field name, got {clock!r}",
                                hint="e.g. `clock: joints`"))
        clock = None
    for name, decl in decls.items():
        if not isinstance(decl, dict):
            problems.append(Problem("error", f"{STORE_YAML}: declaration must be a mapping", field=name))
            continue
        bad = set(decl) - DECL_KEYS
        if bad:
            problems.append(Problem("error", f"{STORE_YAML}: unknown declaration key(s) {sorted(bad)}",
                                    field=name, hint=f"known: {', '.join(sorted(DECL_KEYS))}"))
    if not location.local and doc.get("media_roots") is not None:
        problems.append(Problem("error", f"{STORE_YAML}: media_roots is for a store in a local folder; a store "
                                f"in object storage reads media under its own URL only ({location.url})",
                                hint="copy the media under the store's prefix and remove media_roots"))
        return decls, clock, ()
    media_roots = _media_roots(location.path, doc.get("media_roots"), problems) if location.local else ()
    return decls, clock, media_roots


def _media_roots(root: Path, value: Any, problems: list[Problem]) -> tuple[Path, ...]:
    """store.yaml `media_roots`: folders (absolute, or relative to the store) that symlinked or
    absolute media paths may resolve into. Without it, nothing a table names may leave the store."""
    if value is None:
        return ()
    hint = "write media_roots as a list of folders, e.g. `media_roots: [/data/videos]` (relative ones start at the store)"
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        problems.append(Problem("error", f"{STORE_YAML}: media_roots must be a list of folder paths, got {value!r}",
                                hint=hint))
        return ()
    roots = []
    for entry in value:
        folder = (root / entry).resolve()  # an absolute entry replaces root
        if not folder.is_dir():
            problems.append(Problem("error", f"{STORE_YAML}: media root {entry!r} is not a folder ({folder})",
                                    hint="create it, fix the path, or remove it from media_roots"))
            continue
        roots.append(folder)
    return tuple(roots)


def _apply(spec: FieldSpec, decl: dict[str, Any], problems: list[Problem]) -> FieldSpec:
    """Overlay a declaration on the inferred spec, checking each declared value."""
    def bad(msg: str, hint: str | None = None) -> FieldSpec:
        problems.append(Problem("error", f"{STORE_YAML}: {msg}", field=spec.name,
                                hint=hint or f"fix the declaration of {spec.name!r} under fields in {STORE_YAML} "
                                             "(README, section store.yaml)"))
        return spec

    kind = decl.get("kind", spec.kind)
    if kind not in KINDS:
        return bad(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    series_only = sorted(k for k in SERIES_KEYS if k in decl)
    if series_only and kind != "timeseries":
        stored = ("a string column" if spec.arrow_type in ("string", "large_string")
                  else f"a {spec.arrow_type} column")
        return bad(f"declares {', '.join(series_only)}, which only a time series has, but the field is {stored} "
                   f"(kind {kind!r})",
                   hint="store a time series as list<list<float64>> rows [time, v1..vN] (not a JSON string), "
                        "or drop those keys")
    if kind != spec.kind and not (spec.kind in ("text", "image", "video") and kind in ("text", "image", "video")
                                  and spec.arrow_type in ("string", "large_string")):
        return bad(f"declared kind {kind!r} does not fit the column type {spec.arrow_type} (inferred {spec.kind!r})")
    interp = decl.get("interpolation", spec.interpolation if kind == spec.kind else "nearest")
    if kind == "timeseries" and interp not in METHODS:
        return bad(f"interpolation {interp!r} is not one of {', '.join(METHODS)}")
    order = decl.get("quaternion_order")
    if interp == "slerp" and order not in QUAT_ORDERS:
        return bad("slerp needs quaternion_order: xyzw or wxyz", hint="declare quaternion_order")
    time_unit = decl.get("time_unit", "s")
    if time_unit not in ("s", "ns"):
        return bad(f"time_unit {time_unit!r} must be s or ns")
    names = decl.get("names")
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        return bad("names must be a list of strings")
    units = decl.get("units")
    max_gap = decl.get("max_gap_s")
    if max_gap is not None and not (isinstance(max_gap, (int, float)) and not isinstance(max_gap, bool)
                                    and 0 < max_gap < float("inf")):
        return bad(f"max_gap_s must be a positive number, got {max_gap!r}")
    fps = decl.get("fps")
    if fps is not None and not (isinstance(fps, (int, float)) and not isinstance(fps, bool)
                                and 0 < fps < float("inf")):
        return bad(f"fps must be a positive number, got {fps!r}",
                   hint="frames per second of its video files, e.g. fps: 30")
    return FieldSpec(spec.name, spec.table, kind, spec.arrow_type,
                     interp if kind in ("timeseries", "video") else None, spec.value_dtype,
                     tuple(names) if names else None, tuple(units) if isinstance(units, list) else units,
                     float(max_gap) if max_gap is not None else None, time_unit,
                     order if interp == "slerp" else None, float(fps) if fps else spec.fps, declared=True,
                     layout=spec.layout)


def open_store(root: Path | str | StoreLocation) -> StoreSchema:
    """Read the store's structure (not its data) and collect every structural problem. `root`: a
    folder, or a `StoreLocation` (a URL with its storage options; export/store/location.py)."""
    location = store_location(root)
    try:
        return _open_store(location)
    except RemoteStoreError as exc:  # the bucket or prefix cannot be listed or a table read at all
        raise UserError(f"store {exc}", hint=getattr(exc, "hint", None)) from exc


def _open_store(location: StoreLocation) -> StoreSchema:
    where = "folder" if location.local else "URL"
    if not location.is_dir():
        raise UserError(f"store {location} is not a {where}" + ("" if location.local else " with objects under it"),
                        hint="pass the folder that holds the Parquet tables" if location.local else
                        "pass the URL of the prefix that holds the Parquet tables (s3://bucket/path/to/store)")
    problems: list[Problem] = []
    table_names = location.tables()
    if not table_names:
        raise UserError(f"store {location} has no *.parquet tables", hint="see the README, section 'The episode store'")
    decls, clock, media_roots = _load_declarations(location, problems)
    tables: dict[str, list[str]] = {}
    fields: dict[str, FieldSpec] = {}
    rows: dict[str, dict[str, tuple[int, int]]] = {}
    reserved: dict[str, str] = {}
    id_sets: dict[str, set[str]] = {}
    unread: set[str] = set()  # columns of tables that could not be opened: no second error for them
    for name in table_names:
        try:
            pfile = location.parquet(name)
            schema = pfile.schema_arrow
            if "episode_id" not in schema.names:
                problems.append(Problem("error", f"table {name} has no episode_id column",
                                        hint="add an episode_id column (string) with one row per episode"))
                unread |= set(schema.names)
                continue
            ids_table = pfile.read(columns=["episode_id"])
            strings = [c for c in schema.names if pa.types.is_string(schema.field(c).type)
                       or pa.types.is_large_string(schema.field(c).type)]
            first_row = (_first_strings(pfile.read_row_group(0, columns=strings).slice(0, 1))
                         if pfile.metadata.num_rows and strings else {})
        except (pa.ArrowException, OSError) as exc:
            problems.append(Problem("error", f"table {name} cannot be read as Parquet: {exc}"))
            continue
        if ids_table.column("episode_id").null_count:  # str(None) would make an episode called 'None'
            row = ids_table.column("episode_id").to_pylist().index(None)
            problems.append(Problem("error", f"table {name}: episode_id of row {row} is null",
                                    hint="give every row an episode id"))
            unread |= set(schema.names)
            continue
        try:
            ids = [str(v) for v in ids_table.column("episode_id").to_pylist()]
        except UnicodeDecodeError:
            row = invalid_utf8_row(ids_table.column("episode_id"))
            problems.append(Problem("error", f"table {name}: episode_id of row {row} is not valid UTF-8 text",
                                    hint="write episode ids as UTF-8 strings (or integers)"))
            unread |= set(schema.names)
            continue
        locs: dict[str, tuple[int, int]] = {}
        row = 0
        for group in range(pfile.metadata.num_row_groups):
            for k in range(pfile.metadata.row_group(group).num_rows):
                ep = ids[row]
                if ep in locs:
                    problems.append(Problem("error", f"episode id appears twice in table {name}", episode=ep))
                locs[ep] = (group, k)
                row += 1
        rows[name] = locs
        id_sets[name] = set(ids)
        tables[name] = []
        for col in schema.names:
            if col in RESERVED_COLUMNS:
                typ = schema.field(col).type
                if col in ("start_s", "end_s") and not (pa.types.is_floating(typ) or pa.types.is_integer(typ)):
                    problems.append(Problem("error", f"reserved column {col} in table {name} must hold seconds "
                                            f"(float64), not {typ}", hint=f"write {col} as float64, or rename the "
                                            "column if it is not the episode's extent"))
                elif col == "split" and not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
                    problems.append(Problem("error", f"reserved column split in table {name} must hold split "
                                            f"names (string), not {typ}", hint="write split as strings, or rename "
                                            "the column if it is not the episode's split"))
                elif col != "episode_id":
                    reserved[col] = name
                continue
            if col in fields:
                problems.append(Problem("error", f"column appears in tables {fields[col].table} and {name}",
                                        field=col, hint="field names must be unique across tables"))
                continue
            if not FIELD_RE.match(col) or col.endswith(MASK_SUFFIX) or col == META_FIELD:
                problems.append(Problem("error", f"field name must match {FIELD_RE.pattern}, not end in "
                                        f"{MASK_SUFFIX!r} and not be {META_FIELD!r}", field=col,
                                        hint="rename the column (it becomes a tar member extension)"))
                continue
            spec = _infer(col, name, schema.field(col).type, first_row.get(col))
            if isinstance(spec, str):
                problems.append(Problem("error", spec, field=col))
                continue
            if col in decls and isinstance(decls[col], dict):
                spec = _apply(spec, decls[col], problems)
            declared_text = isinstance(decls.get(col), dict) and decls[col].get("kind") == "text"
            if spec.kind == "text" and not declared_text and str(first_row.get(col) or "").lstrip().startswith("[["):
                problems.append(Problem("warning", "a text field whose values look like a JSON array of rows: "
                                        "it is exported as text, not as a time series", field=col,
                                        hint="store time series as list<list<float64>> rows [time, v1..vN], "
                                             "or declare kind: text to silence this"))
            fields[col] = spec
            tables[name].append(col)
    for name in decls:
        if name not in fields and name not in unread and not any(p.field == name for p in problems):
            problems.append(Problem("error", f"{STORE_YAML} declares a field that no table has", field=name))
    for spec in fields.values():
        if spec.kind == "timeseries" and spec.interpolation == "slerp" and spec.value_dtype not in ("float32", "float64"):
            problems.append(Problem("error", "slerp needs float quaternion values", field=spec.name))
        if (spec.kind == "timeseries" and spec.value_dtype in ("bool", "bool_")
                and spec.interpolation in ("linear", "slerp")):
            problems.append(Problem("error", f"{spec.interpolation} interpolation of bool values would export "
                                    "fractions between false and true", field=spec.name,
                                    hint="declare interpolation: hold or nearest for it in store.yaml"))
        if spec.kind == "timeseries" and spec.layout is None and spec.value_dtype in ("float16", "float32"):
            problems.append(Problem("error", f"time series stored as {spec.value_dtype}: column 0 (time) would "
                                    "lose precision (float32 has ~1 ms resolution after 2 hours)", field=spec.name,
                                    hint="write list<list<float64>> (values are cast back on export)"))
        if spec.kind == "video" and spec.fps is None and "struct" not in spec.arrow_type:
            problems.append(Problem("error", "video path column without fps", field=spec.name,
                                    hint=f"declare fps for it in {STORE_YAML}" + _text_hint(spec)))
    if clock is not None and (clock not in fields or fields[clock].kind != "timeseries"):
        problems.append(Problem("error", f"{STORE_YAML}: clock {clock!r} is not a time-series field"))
    units = {f.time_unit for f in fields.values() if f.kind == "timeseries"}
    if len(units) > 1:
        problems.append(Problem("error", "time-series fields mix time_unit s and ns",
                                hint="declare one time unit for every time-series field"))
    all_ids = set().union(*id_sets.values()) if id_sets else set()
    for name, ids in id_sets.items():
        for ep in sorted(all_ids - ids)[:50]:
            problems.append(Problem("error", f"missing from table {name} (other tables have it)", episode=ep,
                                    hint="every table needs one row per episode"))
    if not fields:
        problems.append(Problem("error", "the store has no fields besides episode_id"))
    return StoreSchema(location=location, tables={t: c for t, c in tables.items()}, fields=fields,
                       episode_ids=sorted(all_ids), rows=rows, reserved=reserved, clock=clock, problems=problems,
                       media_roots=media_roots)


def fingerprint(root: Path | StoreLocation) -> str:
    """sha256 over the tables and declarations (content) and the media files (path and size), linked
    ones included; not the top-level `export.yaml` (a config, not data). The same files give the same
    fingerprint in a folder and in object storage."""
    location = store_location(root)
    digest = hashlib.sha256()
    try:
        for rel, size in location.files():
            if rel == EXPORT_YAML:
                continue
            digest.update(rel.encode() + b"\0")
            name = PurePosixPath(rel)
            if name.suffix == ".parquet" or name.name == STORE_YAML:
                table = hashlib.sha256()
                for chunk in location.iter_chunks(rel):  # streamed: tables can be larger than memory
                    table.update(chunk)
                digest.update(table.digest())
            else:
                digest.update(str(size).encode())
    except RemoteStoreError as exc:
        raise UserError(f"store {exc}", hint=getattr(exc, "hint", None)) from exc
    return digest.hexdigest()


def _text_hint(spec: FieldSpec) -> str:
    """A string column is taken for a media path when its first value ends in a media extension, so a
    text column whose first value happens to ("draw the logo.png") needs `kind: text`: say so."""
    if spec.kind in ("image", "video") and spec.arrow_type in ("string", "large_string"):
        return (f"; if {spec.name!r} is text, not a path (its first value ends like a file name), declare "
                f"`kind: text` for it under fields in {STORE_YAML}")
    return ""


def media_hint(spec: FieldSpec) -> str:
    """The fix for a media file that cannot be found or read from a path column."""
    return "fix the path (relative to the store folder) or add the file" + _text_hint(spec)


class MediaPathError(ValueError):
    """A media path a table names that robowds may not open; `hint` says how to allow or fix it."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def safe_media_path(root: Path, rel: str, media_roots: tuple[Path, ...] = ()) -> Path:
    """Resolve a media path from a table, refusing anything that leaves the store, unless it resolves
    into one of the store's declared `media_roots` (store.yaml; opt-in, none by default).

    `..` and URLs are refused always; an absolute path only with media roots. A symlink inside the
    store is followed, and its target must lie in the store or a media root: the error names both the
    link and its target, because "leaves the store" alone puzzles the user who made the link."""
    opt_in = (f"to allow it, list the folder it is in under media_roots in {STORE_YAML} "
              "(e.g. `media_roots: [/data/videos]`)")
    absolute = bool(rel) and Path(rel).is_absolute()
    if not rel or ".." in Path(rel).parts or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", rel):
        raise MediaPathError(f"media path {rel!r} must be relative to the store and stay inside it",
                             hint="write paths relative to the store folder, without `..` or a URL scheme")
    if absolute and not media_roots:
        raise MediaPathError(f"media path {rel!r} is absolute, outside the store", hint=opt_in)
    path = (root / rel).resolve()  # an absolute rel replaces root
    if not any(path.is_relative_to(folder) for folder in (root.resolve(), *media_roots)):
        link = next((p for p in [root / rel, *(root / rel).parents] if p.is_symlink()), None)
        where = "outside the store" + (" and every media root" if media_roots else "")
        if link is not None and not absolute:
            raise MediaPathError(f"media path {rel!r} is a link whose target {path} is {where}", hint=opt_in)
        raise MediaPathError(f"media path {rel!r} resolves to {path}, {where}", hint=opt_in)
    return path
