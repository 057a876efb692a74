"""The episode store's schema: its tables, fields and episodes, opened (the README, section "The episode
store"). What each field is comes from `inference` (the column's type) and `declarations` (store.yaml);
where its media may live from `media_paths`.

Opening a store reads only Parquet footers and the `episode_id` columns, so it is cheap for any store
size. Structural problems are collected as `Problem`s instead of raised one at a time, so `validate`
can report all of them; `StoreSchema.raise_if_errors` turns them into one user error for `export`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from robowds.export.errors import UserError
from robowds.export.store.declarations import STORE_YAML, FieldSpec, Problem, apply_declaration, load_declarations
from robowds.export.store.inference import first_strings, infer_field, invalid_utf8_row
from robowds.export.store.location import RemoteStoreError, StoreFile, StoreLocation, media_rel, store_location
from robowds.export.store.media_paths import MediaPathError, safe_media_path, text_hint
from robowds.reader.format import FIELD_RE, MASK_SUFFIX, META_FIELD

RESERVED_COLUMNS = ("episode_id", "split", "start_s", "end_s")


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
    decls, clock, media_roots = load_declarations(location, problems)
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
            first_row = (first_strings(pfile.read_row_group(0, columns=strings).slice(0, 1))
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
            spec = infer_field(col, name, schema.field(col).type, first_row.get(col))
            if isinstance(spec, str):
                problems.append(Problem("error", spec, field=col))
                continue
            if col in decls and isinstance(decls[col], dict):
                spec = apply_declaration(spec, decls[col], problems)
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
                                    hint=f"declare fps for it in {STORE_YAML}" + text_hint(spec)))
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
