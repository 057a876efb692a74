"""Reading single rows (one episode each) out of a Parquet row group without decoding the whole group.

Why: `pyarrow.parquet.write_table` puts up to 1M rows in one row group, and a row group's column is
one column chunk: `read_row_group` decodes all of it (20k synthetic episodes: ~3 GB per worker), and
even `iter_batches` on a `ParquetFile` opened the default way first reads the whole column chunk
(pyarrow's `pre_buffer=True`), which for incompressible samples is as large as the decoded column.

How: a `RowCursor` streams one row group with `iter_batches` on a file opened with pre-buffering off
and a read buffer (`StoreLocation.parquet(stream=True)`): pyarrow then holds one data page per
column (~1 MB by pyarrow's default `data_page_size`) and one record batch at a time. A cursor only
moves forward; a `RowReader` takes the rows a batch of episodes needs in row order, copies each one
out of its record batch and lets the rest go. A row before the cursor restarts it at the group's
first row.

Scaling: memory is one record batch (aimed at `BATCH_BYTES` decoded) plus one data page per column
and cursor, plus the rows handed out, whatever the row group's size. Time: a cursor passes each row
once while its requests move forward; the export sends each worker its batches in row order
(`read_order`), so a worker decodes each table once per job, as the row-group memo of 46a6514 did,
without holding it. A request behind the cursor costs a pass from the group's start up to that
row: a caller that reads in another order than `read_order` pays for it in time, not memory.
"""

from __future__ import annotations

from typing import Any, Iterator

import pyarrow as pa

from robowds.export.errors import EpisodeError
from robowds.export.store.location import RemoteStoreError, StoreLocation
from robowds.export.store.schema import StoreSchema

BATCH_BYTES = 4 << 20  # decoded bytes of a record batch the cursor aims at
MAX_BATCH_ROWS = 256  # tiny rows: enough to keep pyarrow's per-batch cost (~20 us) out of the way
CURSORS_KEPT = 8  # cursors a process keeps (`_CURSORS`): each holds a record batch and a page per column

# Cursors of earlier `RowReader`s of this process, for the next batch of the same job: the export sends
# a worker its batches in row order, so its cursor in a table moves forward and each row group is
# decoded once per worker and job, never held whole. Keyed by the store's content hash (the job's
# fingerprint), the table, the row group and the columns, so a changed table is never read through an
# old cursor; one cursor per table and job (the batches move forward).
CursorKey = tuple[str | None, str, int, tuple[str, ...]]
_CURSORS: dict[CursorKey, "RowCursor"] = {}


def drop_row_groups() -> None:
    """Free the cursors this process keeps (`_CURSORS`): the export calls it when its tasks are done,
    so a process that ran a job in-process (`--workers 1`, a notebook) does not hold them on."""
    _CURSORS.clear()


def read_order(schema: StoreSchema, episode_ids: list[str]) -> list[str]:
    """The episodes in the order of their rows: by (row group, row) in each table, the tables in name
    order (stores have one row order for all tables as a rule; the first table decides otherwise).

    Why: `schema.episode_ids` is sorted as text ("10" before "2"), which is not the row order of a
    table of integer ids; batches of episodes taken in row order let each worker's cursor move forward."""
    missing = (1 << 62, 1 << 62)  # not in this table (validate goes on without it): last
    tables = sorted(schema.rows)
    return sorted(episode_ids, key=lambda ep: tuple(schema.rows[t].get(ep, missing) for t in tables))


# bytes of one decoded value of a Parquet physical type (byte arrays: their encoded size is used)
_VALUE_BYTES = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}


def batch_rows(pfile: Any, group: int, columns: list[str]) -> int:
    """Rows per record batch for these columns of this group: `BATCH_BYTES` of their decoded size,
    estimated from the footer as values x value size (the encoded size alone can be 10x too small:
    dictionary-encoded samples), byte arrays at their uncompressed encoded size."""
    meta = pfile.metadata.row_group(group)
    names = set(columns)
    decoded = 0
    for i in range(meta.num_columns):
        chunk = meta.column(i)
        if chunk.path_in_schema.split(".")[0] in names:
            width = _VALUE_BYTES.get(chunk.physical_type, 0)
            decoded += max(chunk.total_uncompressed_size, chunk.num_values * width)
    per_row = decoded / max(1, meta.num_rows)
    return int(max(1, min(MAX_BATCH_ROWS, BATCH_BYTES // max(1.0, per_row))))


class RowCursor:
    """A forward-only position in one row group's columns: the record batch that holds the next rows."""

    def __init__(self, pfile: Any, group: int, columns: list[str]) -> None:
        self.pfile, self.group, self.columns = pfile, group, columns
        self._rows = batch_rows(pfile, group, columns)
        self._restart()

    def _restart(self) -> None:
        self._batches: Iterator[pa.RecordBatch] = self.pfile.iter_batches(
            batch_size=self._rows, row_groups=[self.group], columns=self.columns)
        self._batch: pa.RecordBatch | None = None
        self._start = 0  # the row (in the group) of the current batch's first row
        self._stop = 0  # one past its last row
        self._moving = False  # set while the cursor moves: still set means a move was interrupted

    def row(self, index: int) -> dict[str, pa.Array]:
        """Row `index` of the group, each column a 1-row array of its own memory.

        A move interrupted by an exception (a cancelled Ray task's KeyboardInterrupt, a lost
        connection) leaves the batch iterator spent or one batch ahead of `_start`/`_stop`: the
        cursor outlives the task in `_CURSORS`, so the next call starts a new pass instead of
        reading a wrong row or the spent iterator's StopIteration."""
        if self._moving or index < self._start:
            self._restart()  # behind the cursor, or interrupted: a new pass from the group's first row
        self._moving = True
        while index >= self._stop:
            batch = next(self._batches, None)
            if batch is None:
                raise IndexError(f"row {index} is past the end of row group {self.group} "
                                 f"({self._stop} rows)")
            self._batch, self._start, self._stop = batch, self._stop, self._stop + batch.num_rows
        self._moving = False
        assert self._batch is not None
        at = index - self._start
        if self._batch.num_rows == 1:  # the batch is the row: nothing else to let go of
            return {c: self._batch.column(c) for c in self.columns}
        # concat_arrays copies the row's values (and needs no pyarrow.compute, ~0.3 s to import per
        # worker), so what a caller keeps does not pin the whole record batch
        return {c: pa.concat_arrays([self._batch.column(c).slice(at, 1)]) for c in self.columns}


class RowReader:
    """Rows of a store's tables, each episode's row as 1-row arrays of the needed columns.

    `content_key`: the store's fingerprint, when the caller has one (the export's tasks): then cursors
    are kept in the process for the next reader of the same job (`_CURSORS`); without one (validate,
    verify) they are this reader's own."""

    def __init__(self, location: StoreLocation, content_key: str | None = None) -> None:
        self.location = location
        self.content_key = content_key
        self._files: dict[str, Any] = {}  # table -> ParquetFile, opened once: a remote footer is a GET
        self._own: dict[CursorKey, RowCursor] = {}

    def read(self, wanted: list[tuple[str, int, int, str]],
             columns: dict[str, list[str]]) -> dict[tuple[str, str], dict[str, pa.Array]]:
        """(table, episode) -> its row, for `wanted` = (table, row group, row, episode) items, reading
        `columns[table]`, in row order: one forward pass per row group."""
        out: dict[tuple[str, str], dict[str, pa.Array]] = {}
        for table, group, row, ep in sorted(wanted):
            try:
                out[table, ep] = self._cursor(table, group, columns[table]).row(row)
            except RemoteStoreError as exc:  # a store in object storage: connection lost, access denied
                self._forget(table)  # its batch iterator is spent
                raise EpisodeError(ep, None, f"table {table} cannot be read: {exc}", hint=exc.hint) from exc
        return out

    def _kept(self) -> dict[CursorKey, RowCursor]:
        return _CURSORS if self.content_key is not None else self._own

    def _cursor(self, table: str, group: int, columns: list[str]) -> RowCursor:
        kept, key = self._kept(), (self.content_key, table, group, tuple(columns))
        if key not in kept:
            if table not in self._files:
                self._files[table] = self.location.parquet(table, stream=True)
            self._forget(table)  # one cursor per table and job: the batches move forward
            kept[key] = RowCursor(self._files[table], group, columns)
            while len(kept) > CURSORS_KEPT:
                del kept[next(iter(kept))]
        return kept[key]

    def _forget(self, table: str) -> None:
        kept = self._kept()
        for key in [k for k in kept if k[:2] == (self.content_key, table)]:
            del kept[key]
