"""Reading episodes' data out of the store, a few rows at a time.

Workers get batches of episodes in the tables' row order; each episode's row is read with only the
columns needed through a forward cursor per table (`row_stream.py`), so a task never decodes a whole
row group, let alone a table, and a worker passes each table once per job.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from robowds.export.core.resample import RawSeries
from robowds.export.errors import EpisodeError, UserError
from robowds.export.store.declarations import FieldSpec
from robowds.export.store.episode_identity import episode_fingerprint, row_digest
from robowds.export.store.location import RemoteStoreError
from robowds.export.store.media_paths import MediaPathError, media_hint
from robowds.export.store.row_stream import RowReader, batch_rows
from robowds.export.store.schema import StoreSchema

IMAGE_MAGIC = ((b"\x89PNG\r\n\x1a\n", "png"), (b"\xff\xd8\xff", "jpg"), (b"BM", "bmp"))


@dataclass
class EpisodeData:
    """One episode's raw fields, as stored (time series still `[T, N+1]` or `RawSeries`, unclean)."""

    episode_id: str
    # field -> [T, N+1] rows, or a RawSeries (times [T], values [T, N]) for the typed {t, v} layout
    streams: dict[str, np.ndarray | RawSeries] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    images: dict[str, tuple[bytes, str]] = field(default_factory=dict)  # field -> (bytes, ext)
    image_sources: dict[str, str] = field(default_factory=dict)  # field -> store path, for error messages
    values: dict[str, np.ndarray] = field(default_factory=dict)
    videos: dict[str, dict[str, Any]] = field(default_factory=dict)
    start_s: float | None = None
    end_s: float | None = None
    # time-series fields this episode did not record (a null or empty cell): its windows carry them
    # zero-padded with an all-false mask
    missing: set[str] = field(default_factory=set)
    # stores with `time_unit: ns`: the integer ns time that stream time 0.0 stands for (the episode's
    # first ns sample; times are seconds relative to it so that float64 keeps them exact)
    time_origin_ns: int | None = None
    # `episode_identity.episode_fingerprint` of the rows read and the media they name (set by the loader)
    fingerprint: str | None = None
    media_sizes: dict[str, int] = field(default_factory=dict)  # store path as the row names it -> bytes


def image_ext(data: bytes) -> str | None:
    for magic, ext in IMAGE_MAGIC:
        if data.startswith(magic):
            return ext
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


def numpy_of(array: pa.Array) -> np.ndarray:
    """`array.to_numpy(zero_copy_only=False)`, for a number array without nulls as a view of its data buffer.

    Why: `to_numpy` goes through Arrow's pandas conversion layer, which imports pandas (when installed)
    on first use: ~0.4 s of CPU in every process that loads episodes, i.e. in every pool worker's
    first task (`scripts/bench_export.py` shows it as per-worker overhead). Nulls, booleans and other
    types take `to_numpy` (float nulls become NaN there)."""
    kind = array.type
    if array.null_count == 0 and (pa.types.is_integer(kind) or pa.types.is_floating(kind)) \
            and not pa.types.is_float16(kind):
        dtype = np.dtype(kind.to_pandas_dtype())  # a numpy type for these; pandas is not imported
        return np.frombuffer(array.buffers()[1], dtype, count=len(array), offset=array.offset * dtype.itemsize)
    return array.to_numpy(zero_copy_only=False)


def _flat(rows: pa.Array) -> pa.Array:
    """`rows.flatten()` of a list array without null rows: a slice of its values (`flatten` runs a
    pyarrow.compute kernel, whose first use imports that module: ~0.3 s in every worker process)."""
    if rows.null_count:
        return rows.flatten()
    if isinstance(rows, pa.FixedSizeListArray):
        width = rows.type.list_size
        return rows.values.slice(rows.offset * width, len(rows) * width)
    offsets = numpy_of(rows.offsets)  # [T + 1], of this slice
    return rows.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def _series(column: pa.ListArray, row: int, episode: str, name: str) -> np.ndarray | None:
    """Row `row` of a list<list<number>> column as a `[T, N+1]` array; None when the episode did not
    record the stream (a null cell or an empty list)."""
    if not column[row].is_valid:  # a scalar's flag: no pyarrow.compute import (~0.3 s) for `is_null`
        return None
    start, stop = column.offsets[row].as_py(), column.offsets[row + 1].as_py()
    rows = column.values.slice(start, stop - start)  # ListArray of T rows
    if len(rows) == 0:
        return None
    if rows.null_count:
        raise EpisodeError(episode, name, "time series has null rows",
                           hint="every row must be [time, v1..vN]; write a missing value as NaN, not a null row")
    if isinstance(rows, pa.FixedSizeListArray):
        width = rows.type.list_size
        widths = np.full(len(rows), width)
    else:
        offsets = numpy_of(rows.offsets)
        widths = np.diff(offsets)
        width = int(widths[0])
    if (widths != width).any():
        bad = int(np.argmax(widths != width))
        raise EpisodeError(episode, name, f"row {bad} has {widths[bad]} columns, row 0 has {width}",
                           hint="every row must be [time, v1..vN] with the same N")
    leaf = _flat(rows)
    if leaf.null_count and not pa.types.is_floating(leaf.type):
        raise EpisodeError(episode, name, "integer time series has null values",
                           hint="integers have no NaN: drop those rows, or store the values as floats (null = NaN)")
    flat = numpy_of(leaf)  # float nulls become NaN: missing samples
    return flat.reshape(len(rows), width)


def _typed_series(column: pa.StructArray, row: int, episode: str, name: str) -> RawSeries | None:
    """Row `row` of a struct<t: list, v: list<list>> column as times [T] and values [T, N], each in
    its stored dtype; None when the episode did not record the stream (a null cell, or t and v both
    empty). Every way the two lists can disagree is one error naming episode and field."""
    def bad(message: str, hint: str) -> EpisodeError:
        return EpisodeError(episode, name, message, hint=hint)

    if not column[row].is_valid:  # a scalar's flag: no pyarrow.compute import (~0.3 s) for `is_null`
        return None
    cell = column.slice(row, 1)
    children = dict(zip((f.name for f in column.type), cell.flatten()))  # flatten() honours the slice
    t_col, v_col = children["t"], children["v"]
    if t_col.null_count or v_col.null_count:
        raise bad(f"{'t' if t_col.null_count else 'v'} is null", "store both t and v for every episode")
    times = _flat(t_col)  # [T]
    rows = _flat(v_col)  # T value rows
    if len(times) == 0 and len(rows) == 0:
        return None
    if len(times) != len(rows):
        raise bad(f"t has {len(times)} times but v has {len(rows)} rows",
                  "give v exactly one row of values per time in t")
    if times.null_count and not pa.types.is_floating(times.type):
        raise bad("t has null times", "write every time (a NaN float time marks a missing sample)")
    if rows.null_count:
        raise bad(f"v row {rows.is_null().to_numpy(zero_copy_only=False).argmax()} is null",
                  "write every row of v (NaN float values mark a missing sample)")
    if isinstance(rows, pa.FixedSizeListArray):
        widths = np.full(len(rows), rows.type.list_size)
    else:
        widths = np.diff(numpy_of(rows.offsets))  # [T]
    width = int(widths[0]) if len(widths) else 1
    if (widths != width).any():
        at = int(np.argmax(widths != width))
        raise bad(f"v row {at} has {widths[at]} value(s), row 0 has {width}",
                  "every row of v must hold the same N values")
    leaf = _flat(rows)
    if leaf.null_count and not pa.types.is_floating(leaf.type):
        raise bad(f"v has null {leaf.type} values", "write every value (only float values may be NaN: missing)")
    values = numpy_of(leaf).reshape(len(rows), width)  # [T, N]; float nulls -> NaN
    return RawSeries(numpy_of(times), values)


def series_width(raw: np.ndarray | RawSeries) -> int:
    """N, the value columns of a stream in either layout."""
    return raw.width if isinstance(raw, RawSeries) else raw.shape[1] - 1


def check_series_shape(spec: FieldSpec, raw: np.ndarray | RawSeries, episode: str) -> None:
    """Declared names / units against the stream's value columns ([T, N+1] -> N). The loader runs it,
    so validate and export refuse the same streams (export used to write a schema with the wrong N)."""
    columns = series_width(raw)
    for key, declared in (("names", spec.names), ("units", spec.units if isinstance(spec.units, tuple) else None)):
        if declared is not None and len(raw) and len(declared) != columns:
            raise EpisodeError(episode, spec.name, f"declares {len(declared)} {key} but has {columns} value columns",
                               hint=f"give one {key[:-1]} per value column in store.yaml (column 0 is the time)")


def check_image_decodes(blob: bytes, episode: str, name: str, source: str) -> None:
    """Decode the image once (Pillow, ~1 ms for a small PNG), so a damaged file fails here, naming it,
    and not in every training step that reads one of the episode's windows."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(blob)) as image:
            image.load()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise EpisodeError(episode, name, f"image {source!r} cannot be decoded: {exc}",
                           hint="re-export or replace the image file") from exc


LOAD_AHEAD = 8  # episodes whose rows are read in one forward pass (an export task's batch)


class EpisodeLoader:
    """Loads `EpisodeData` for batches of episode ids from a store. `content_key`: the store's
    fingerprint, when the caller has one (the export's tasks): then row cursors are kept for the next
    loader of this process (`row_stream.RowReader`).

    Memory: the rows of `LOAD_AHEAD` episodes (copied out of the Parquet record batches) and what the
    cursors hold (`row_stream.py`), whatever the size of the tables' row groups. Episodes are best
    asked for in `read_order`: rows behind a cursor cost a pass from their row group's start."""

    def __init__(self, schema: StoreSchema, fields: list[str], content_key: str | None = None) -> None:
        self.schema = schema
        self.fields = fields
        self.content_key = content_key
        self._reader = RowReader(schema.location, content_key)
        # table -> (the wanted fields, the reserved columns) read from it; O(tables), made once
        self._columns = {table: self._table_columns(table) for table in schema.tables}

    def load(self, episode_ids: list[str]) -> Iterator[EpisodeData | EpisodeError]:
        """Episodes in the given order, or the error that makes one unreadable (the batch goes on);
        the rows of each `LOAD_AHEAD` episodes are read in one forward pass."""
        for lo in range(0, len(episode_ids), LOAD_AHEAD):
            chunk = episode_ids[lo:lo + LOAD_AHEAD]
            try:
                rows = self._rows(chunk)
            except EpisodeError as exc:  # a table that cannot be read: every episode of the chunk
                yield from (EpisodeError(ep, exc.field, exc.reason, hint=exc.hint) for ep in chunk)
                continue
            for ep in chunk:
                try:
                    yield self._load_one(ep, rows)
                except EpisodeError as exc:
                    yield exc

    def load_all(self, episode_ids: list[str]) -> Iterator[tuple[EpisodeData, list[EpisodeError]]]:
        """For `validate`: each episode with every field that loads, and one error per field that does
        not (the export stops at an episode's first error; a user fixing a store wants them all).
        Tolerates a store with structural problems: tables an episode is missing from are skipped."""
        for lo in range(0, len(episode_ids), LOAD_AHEAD):
            chunk = episode_ids[lo:lo + LOAD_AHEAD]
            rows = self._rows(chunk, tolerant=True)
            for ep in chunk:
                problems: list[EpisodeError] = []
                yield self._load_one(ep, rows, problems), problems

    def _table_columns(self, table: str) -> tuple[list[str], list[str]]:
        """(the wanted fields, the reserved columns) this loader reads from `table`."""
        wanted = [c for c in self.schema.tables[table] if c in self.fields]
        # the `split` column is read once for all episodes by the plan (job._declared_splits)
        extras = [c for c, t in self.schema.reserved.items() if t == table and c != "split"]
        return wanted, extras

    def _rows(self, episode_ids: list[str], tolerant: bool = False) -> dict[tuple[str, str], dict[str, pa.Array]]:
        """(table, episode) -> that episode's row (its needed columns), read in row order. `tolerant`:
        episodes missing from a table are left out (validate) instead of failing with a KeyError."""
        wanted = []
        for table in self.schema.tables:
            if not any(self._columns[table]):
                continue
            for ep in episode_ids:
                if tolerant and ep not in self.schema.rows[table]:
                    continue  # open_store reported the episode missing from this table
                group, row = self.schema.rows[table][ep]
                wanted.append((table, group, row, ep))
        return self._reader.read(wanted, {table: sum(self._columns[table], []) for table in self.schema.tables})

    def _load_one(self, ep: str, rows: dict[tuple[str, str], dict[str, pa.Array]],
                  problems: list[EpisodeError] | None = None) -> EpisodeData:
        """`problems`: None raises the first error; a list collects one per field and loads the rest."""
        data = EpisodeData(ep)
        digests = {}  # table -> row_digest: the episode's identity, from the rows read anyway
        for table in self.schema.tables:
            wanted, extras = self._columns[table]
            if (table, ep) not in rows:
                continue  # nothing read from this table, or (validate) the episode is missing from it
            columns = rows[table, ep]  # each a 1-row array
            digests[table] = row_digest(columns)
            for col in wanted:
                try:
                    self._fill(data, col, columns[col], 0)
                except EpisodeError as exc:
                    if problems is None:
                        raise
                    problems.append(exc)
            for col in extras:
                value = columns[col][0].as_py()
                if value is not None:
                    setattr(data, col, float(value))
        self._relative_ns(data, problems)
        data.fingerprint = episode_fingerprint(digests, data.media_sizes)
        return data

    def _fill(self, data: EpisodeData, name: str, column: pa.Array, row: int) -> None:
        spec = self.schema.fields[name]
        ep = data.episode_id
        if spec.kind == "timeseries":
            load = _typed_series if spec.layout == "typed" else _series
            raw = load(column, row, ep, name)
            if raw is None:
                data.missing.add(name)
                return
            data.streams[name] = raw
            check_series_shape(spec, raw, ep)
            return
        try:
            value = column[row].as_py()
        except UnicodeDecodeError as exc:  # pyarrow reads Parquet strings without checking their UTF-8
            raw = column[row].cast(pa.large_binary()).as_py()
            raise EpisodeError(ep, name, f"{spec.kind} value is not valid UTF-8 text: byte {exc.start} "
                               f"({raw[exc.start:exc.start + 1]!r}) of {raw[:40]!r}",
                               hint="write the column as UTF-8 strings (decode the source bytes with their "
                                    "real encoding, e.g. latin-1, when converting)") from exc
        if value is None:
            raise EpisodeError(ep, name, f"{spec.kind} value is null", hint="every episode needs this field")
        if spec.kind == "text":
            data.texts[name] = str(value)
        elif spec.kind == "value":
            data.values[name] = np.asarray(value, dtype=spec.value_dtype)
        elif spec.kind == "video":
            video = dict(value) if isinstance(value, dict) else {"path": value, "fps": spec.fps}
            try:
                video["file"] = self.schema.media_path(str(video["path"]))  # a Path, or a StoreFile (remote)
            except MediaPathError as exc:
                raise EpisodeError(ep, name, str(exc), hint=exc.hint) from exc
            try:
                found = video["file"].is_file()
            except OSError as exc:  # a store in object storage: access denied, connection lost
                raise EpisodeError(ep, name, f"video file {video['path']!r} cannot be read: {exc}",
                                   hint=getattr(exc, "hint", None) or media_hint(spec)) from exc
            if not found:
                raise EpisodeError(ep, name, f"video file {video['path']!r} is missing", hint=media_hint(spec))
            try:
                data.media_sizes[str(video["path"])] = video["file"].stat().st_size if isinstance(
                    video["file"], Path) else video["file"].size()  # the episode's identity: path and size
            except OSError as exc:
                raise EpisodeError(ep, name, f"video file {video['path']!r} cannot be read: {exc}",
                                   hint=getattr(exc, "hint", None) or media_hint(spec)) from exc
            data.videos[name] = video
        elif spec.kind == "image":
            data.images[name] = self._image(ep, name, value)
            if not isinstance(value, (bytes, bytearray)):  # a path: its size (bytes in the row are hashed there)
                data.media_sizes[str(value)] = len(data.images[name][0])
            data.image_sources[name] = "(binary column)" if isinstance(value, (bytes, bytearray)) else repr(str(value))

    def _image(self, ep: str, name: str, value: Any) -> tuple[bytes, str]:
        if isinstance(value, (bytes, bytearray)):
            blob = bytes(value)
        else:
            try:
                path = self.schema.media_path(str(value))
                blob = path.read_bytes()
            except MediaPathError as exc:
                raise EpisodeError(ep, name, str(exc), hint=exc.hint) from exc
            except OSError as exc:
                raise EpisodeError(ep, name, f"image file {value!r} cannot be read: {exc.strerror or exc}",
                                   hint=media_hint(self.schema.fields[name])) from exc
        ext = image_ext(blob)
        if ext is None:
            raise EpisodeError(ep, name, "image is not PNG, JPEG, WebP or BMP", hint="re-encode it as PNG or JPEG")
        check_image_decodes(blob, ep, name, value if isinstance(value, str) else "(binary column)")
        return blob, ext

    def _relative_ns(self, data: EpisodeData, problems: list[EpisodeError] | None = None) -> None:
        ns = {n: a for n, a in data.streams.items() if self.schema.fields[n].time_unit == "ns"}
        for n, arr in list(ns.items()):
            if (arr.times if isinstance(arr, RawSeries) else arr).dtype.kind not in "iu":
                error = EpisodeError(data.episode_id, n, "time_unit ns needs an integer (int64) time column",
                                     hint=f"store {n}'s times as int64 nanoseconds, or remove `time_unit: ns` "
                                          "from store.yaml (float seconds)")
                if problems is None:
                    raise error
                problems.append(error)
                del ns[n], data.streams[n]  # its times cannot be made relative like the others'
        if not ns:
            return
        converted, origin = ns_to_seconds(ns)
        data.streams.update(converted)
        data.time_origin_ns = origin
        for bound in ("start_s", "end_s"):
            if getattr(data, bound) is not None:
                setattr(data, bound, getattr(data, bound) - origin * 1e-9)


def ns_to_seconds(streams: dict[str, np.ndarray | RawSeries]) -> tuple[dict[str, np.ndarray | RawSeries], int]:
    """int64-nanosecond streams -> float64 seconds since their common first time.

    The origin is subtracted in int64 before converting, so times 1 ns apart stay distinct (float64 of
    1.7e18 ns itself only resolves 256 ns). `[T, N+1]` rows come back as float64 rows (one dtype for
    time and values); a `RawSeries` keeps its values as they are."""
    stored = {n: a.times if isinstance(a, RawSeries) else a[:, 0] for n, a in streams.items()}  # [T] each
    firsts = [int(t.min()) for t in stored.values() if len(t)]
    origin = min(firsts) if firsts else 0
    out: dict[str, np.ndarray | RawSeries] = {}
    for name, arr in streams.items():
        times = (stored[name].astype(np.int64) - origin).astype(np.float64) * 1e-9  # [T]
        if isinstance(arr, RawSeries):
            out[name] = RawSeries(times, arr.values)
        else:
            out[name] = np.column_stack([times, arr[:, 1:].astype(np.float64)])
    return out, origin


def series_widths(schema: StoreSchema, names: list[str]) -> dict[str, int]:
    """N (value columns) of each named time-series field, from its first recorded episode: the width an
    episode that did not record the stream is padded to. Streams those columns only, in record
    batches of ~4 MiB (`stream=True`: one data page per column and one batch in memory, not the row
    group's column chunks), until each field has one; typically the first batch, so O(1) in the
    number of episodes and in the size of the row group (a table written as one row group was
    decoded whole here: +540 MB at 20k synthetic episodes).

    A field that no episode recorded is an error (there is nothing to window, nor a width)."""
    widths: dict[str, int] = {}
    by_table: dict[str, list[str]] = {}
    for name in names:
        by_table.setdefault(schema.fields[name].table, []).append(name)
    for table, fields in sorted(by_table.items()):
        todo = set(fields)
        try:
            table_file = schema.location.parquet(table, stream=True)
        except RemoteStoreError as exc:
            raise UserError(f"store table {exc}", hint=exc.hint) from exc
        rows = batch_rows(table_file, 0, sorted(todo)) if table_file.metadata.num_row_groups else 1
        for batch in table_file.iter_batches(batch_size=rows, columns=sorted(todo)):
            for name in sorted(todo):
                spec, column = schema.fields[name], batch.column(name)
                load = _typed_series if spec.layout == "typed" else _series
                for row in range(len(column)):
                    try:
                        raw = load(column, row, "?", name)
                    except EpisodeError:
                        continue  # that episode's own error is reported when it is loaded
                    if raw is not None:
                        widths[name] = series_width(raw)
                        todo.discard(name)
                        break
            if not todo:
                break
        for name in sorted(todo):
            raise UserError(f"time-series field {name!r} has no samples in any episode",
                            hint=f"record it in at least one episode, or leave it out with --set exclude=[{name}]")
    return widths
