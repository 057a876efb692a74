"""A table written as one large row group (pyarrow's default holds up to 1M rows) is read once per
worker process and job, forward, one record batch at a time, never decoded whole: before 46a6514
each task of 8 episodes decoded the whole row group again (quadratic in the table: +27% export time
at 400 synthetic episodes, see docs/benchmarks.md), and from then until the row cursors each worker
held the whole decoded group (tests/test_export_row_group_memory.py measures that). The cursors are
keyed by the store's content hash, so a table changed between two exports in one process is read
again."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.job import run
from robowds.reader import ShardDataset


def one_row_group(store: Path) -> None:
    for path in store.glob("*.parquet"):
        pq.write_table(pq.read_table(path), path, row_group_size=1 << 20)
        assert pq.ParquetFile(path).metadata.num_row_groups == 1


def export(store: Path, out: Path) -> None:
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--set", "exclude=[overview]",
                 "--stride", "20"]) == 0


def test_one_large_row_group_is_decoded_once_per_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = write_synthetic_store(tmp_path / "store", episodes=64, seed=3).root
    one_row_group(store)
    reads: Counter[str] = Counter()
    real_iter, real_read, real_stage = pq.ParquetFile.iter_batches, pq.ParquetFile.read_row_group, run.stage_episodes

    def phase() -> str:
        return "in tasks" if reads["tasks"] > reads["tasks done"] else "planning"

    def counted(self: pq.ParquetFile, *args: object, **kwargs: object) -> Iterator[pa.RecordBatch]:
        reads[f"passes {phase()}"] += 1  # spies: the real code runs
        for batch in real_iter(self, *args, **kwargs):
            reads[f"rows {phase()}"] += batch.num_rows
            yield batch

    def whole(self: pq.ParquetFile, *args: object, **kwargs: object) -> pa.Table:
        reads[f"whole groups {phase()}"] += 1
        return real_read(self, *args, **kwargs)

    def task(args: tuple[object, list[str]]) -> object:
        reads["tasks"] += 1
        try:
            return real_stage(args)
        finally:
            reads["tasks done"] += 1

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted)
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", whole)
    monkeypatch.setattr(run, "stage_episodes", task)
    export(store, tmp_path / "out")
    tables = [p for p in store.glob("*.parquet") if p.name != "images.parquet"]  # overview is excluded
    assert reads["tasks"] == 8, reads  # 64 episodes, 8 per task, in this process (--workers 1)
    assert reads["passes in tasks"] == len(tables), reads  # one forward pass per table; 8 per table before
    assert reads["rows in tasks"] == 64 * len(tables), reads  # each row decoded once
    assert reads["whole groups in tasks"] == 0, reads  # no row group is decoded whole


def test_a_table_changed_between_two_exports_in_one_process_is_read_again(tmp_path: Path) -> None:
    store = write_synthetic_store(tmp_path / "store", episodes=16, seed=3).root
    one_row_group(store)
    export(store, tmp_path / "a")
    path = store / "trajectories.parquet"
    table = pq.read_table(path)
    joints = table.column("joints").to_pylist()
    joints = [[[row[0], *(v + 1.0 for v in row[1:])] for row in ep] for ep in joints]  # times kept
    table = table.set_column(table.schema.get_field_index("joints"), "joints",
                             pa.array(joints, type=table.schema.field("joints").type))
    pq.write_table(table, path, row_group_size=1 << 20)
    export(store, tmp_path / "b")
    first = {s["__key__"]: s for s in ShardDataset(tmp_path / "a", "train", shuffle=False)}
    second = {s["__key__"]: s for s in ShardDataset(tmp_path / "b", "train", shuffle=False)}
    assert sorted(first) == sorted(second)
    for key, sample in first.items():
        real = sample["joints_mask"]
        np.testing.assert_allclose(second[key]["joints"][real], sample["joints"][real] + 1.0, atol=1e-5)


def test_an_in_process_export_keeps_no_row_group_after_it_ends(tmp_path: Path) -> None:
    """`--workers 1` runs the tasks in this process: their row cursors are freed when the job ends (a
    notebook would otherwise hold a record batch and a Parquet file of every table)."""
    from robowds.export.store import row_stream

    store = write_synthetic_store(tmp_path / "store", episodes=16, seed=3).root
    export(store, tmp_path / "out")
    assert row_stream._CURSORS == {}


def test_validate_reads_a_table_of_integer_ids_forward_and_reports_in_id_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Episode ids sort as text ("10" before "2"), not in a table's row order of integer ids: validate
    reads the rows in row order (one forward pass: reading in id order would restart the pass at every
    step back) and still reports the episodes' problems in id order."""
    from robowds.export.store import row_stream
    from robowds.export.store.validate import validate_store

    store = tmp_path / "store"
    store.mkdir()
    steps = np.arange(20) / 10.0  # [T] seconds
    cells = [None if ep in (2, 10) else np.column_stack([steps, steps * ep]).tolist() for ep in range(100)]
    pq.write_table(pa.table({"episode_id": pa.array(range(100), pa.int64()),
                             "state": pa.array(cells, pa.list_(pa.list_(pa.float64())))}), store / "episodes.parquet")
    passes: Counter[str] = Counter()
    real_iter = pq.ParquetFile.iter_batches

    def counted(self: pq.ParquetFile, *args: object, **kwargs: object) -> Iterator[pa.RecordBatch]:
        passes["passes"] += 1
        for batch in real_iter(self, *args, **kwargs):
            passes["rows"] += batch.num_rows
            yield batch

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted)
    monkeypatch.setattr(row_stream, "BATCH_BYTES", 1000)  # record batches of 3 rows (320 bytes each)
    report = validate_store(store)
    assert passes == {"passes": 1, "rows": 100}, passes
    assert [(p.episode, p.field) for p in report.problems if p.episode] == [("10", "state"), ("2", "state")]
    assert all("not recorded in this episode" in p.message for p in report.problems if p.episode)


def _rows_table(path: Path, rows: int) -> pq.ParquetFile:
    pq.write_table(pa.table({"x": np.arange(rows, dtype=np.int64)}), path, row_group_size=rows)
    return pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 16)


@pytest.mark.parametrize("at_batch", [0, 1, 2])
def test_a_cursor_interrupted_while_moving_reads_the_right_rows_after(tmp_path: Path, at_batch: int) -> None:
    """A cursor outlives its task in the process (`_CURSORS`); a Ray task cancelled while the cursor
    moved left it with a spent iterator, and the next job's read raised StopIteration (CI, session 9).
    An interruption inside the iterator, or between taking a batch and moving the position, must
    leave the next reads exact."""
    from robowds.export.store.row_stream import RowCursor

    cursor = RowCursor(_rows_table(tmp_path / "t.parquet", 1000), 0, ["x"])
    cursor._rows = 64  # batches of 64 rows: the reads below cross several
    cursor._restart()
    assert cursor.row(10)["x"].to_pylist() == [10]
    real, taken = cursor._batches, [0]

    def interrupted() -> Iterator[pa.RecordBatch]:
        for batch in real:
            if taken[0] == at_batch:
                raise KeyboardInterrupt  # what ray.cancel raises in the task's thread
            taken[0] += 1
            yield batch

    cursor._batches = interrupted()
    with pytest.raises(KeyboardInterrupt):
        cursor.row(500)
    for index in (500, 20, 999):
        assert cursor.row(index)["x"].to_pylist() == [index]
    with pytest.raises(IndexError, match="row 1000 is past the end of row group 0"):
        cursor.row(1000)
