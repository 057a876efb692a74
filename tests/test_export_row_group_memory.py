"""A table written as one row group exports in the memory of the same table in small row groups,
measured from outside: the peak RSS of the whole process tree of a real `robowds export --workers 2`
(the main process, the pool's workers and their helpers, summed at each sample).

Why from outside and summed: what grew was spread over processes (issue 22, item 11): the main
process decoded the whole table in `series_widths`, and each worker kept the whole decoded row group
for its next task; at 20k synthetic episodes 6.8 GB together against 0.6 GB with groups of 64.
`wait4`'s peak (tests/test_export_memory.py) covers one process, not the sum of several at once, so
a thread samples the tree every 20 ms (a decoded row group is held for the whole map phase: seconds).

The store: 120 episodes of one typed stream (int64 values, held: no float work per sample, so the
export stays quick) of 12,000 steps x 7 values, 768 KB an episode decoded and 92 MB for the table,
written with repeating values so the file is ~3 MB. The bound comes from the episode's size (what a
worker may hold: `LOAD_AHEAD` episodes' rows, a copy of them, a few in flight), not the table's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

EPISODES, STEPS, VALUES = 120, 12_000, 7
EPISODE_BYTES = STEPS * 8 + STEPS * VALUES * 8  # t float64 [T] + v int64 [T, 7], decoded: 768,000
WORKERS = 2
MIB = 2**20
LOAD_AHEAD = 8  # episodes whose rows a loader holds at once (export/store/episodes.py)
BATCH_BYTES = 4 * MIB  # a record batch of the row cursor, decoded (export/store/row_stream.py)


def write_store(root: Path, row_group_rows: int) -> Path:
    """The store, its table in row groups of `row_group_rows` episodes (as `pq.write_table` makes them)."""
    root.mkdir(parents=True)
    offsets = pa.array(np.arange(EPISODES + 1) * STEPS, pa.int32())
    times = np.tile(np.arange(STEPS) / 100.0, EPISODES)  # 100 Hz, [E * T]
    values = (np.arange(EPISODES)[:, None, None] % 7 + np.arange(VALUES)[None, None, :]
              + np.zeros((1, STEPS, 1), np.int64))  # [E, T, 7]: few distinct values, a small file
    state = pa.StructArray.from_arrays(
        [pa.ListArray.from_arrays(offsets, pa.array(times)),
         pa.ListArray.from_arrays(offsets, pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), VALUES))],
        names=["t", "v"])
    ids = pa.array([f"ep_{i:04d}" for i in range(EPISODES)])
    pq.write_table(pa.table({"episode_id": ids, "state": state}), root / "episodes.parquet",
                   row_group_size=row_group_rows)
    return root


def tree_rss(process: psutil.Process) -> int:
    """RSS of a process and all its descendants now (processes that end meanwhile count as 0)."""
    total = 0
    try:
        family = [process, *process.children(recursive=True)]
    except psutil.Error:
        return 0
    for member in family:
        try:
            total += member.memory_info().rss
        except psutil.Error:
            pass
    return total


def export_peak_rss(store: Path, out: Path) -> int:
    """Peak of the summed RSS of `robowds export --workers 2`'s process tree, sampled every 20 ms."""
    cmd = [sys.executable, "-m", "robowds.export", str(store), str(out), "--quiet", "--workers", str(WORKERS),
           "--stride", "1000000"]  # one window per episode: the test is about reading, not windows
    proc = subprocess.Popen(cmd, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, watched = 0, psutil.Process(proc.pid)

    def sample() -> None:
        nonlocal peak
        while proc.poll() is None:
            peak = max(peak, tree_rss(watched))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    stdout, stderr = proc.communicate(timeout=300)
    sampler.join()
    assert proc.returncode == 0, stderr
    assert "exported 120 episodes (0 rejected) -> 120 windows" in stdout, stdout
    return peak


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_one_row_group_exports_in_the_memory_of_small_row_groups(tmp_path: Path) -> None:
    one = write_store(tmp_path / "one", 1 << 20)
    small = write_store(tmp_path / "small", LOAD_AHEAD)
    assert pq.ParquetFile(one / "episodes.parquet").metadata.num_row_groups == 1
    table_bytes = EPISODES * EPISODE_BYTES  # 88 MiB decoded (plus list offsets)
    assert EPISODE_BYTES < 1 * MIB

    small_rss = export_peak_rss(small, tmp_path / "small_out")
    one_rss = export_peak_rss(one, tmp_path / "one_out")
    # per worker: LOAD_AHEAD episodes' rows, their copies out of a record batch, a few episodes in
    # flight (arrays of the one being built), one record batch; then the allocators' slack
    bound = WORKERS * ((2 * LOAD_AHEAD + 4) * EPISODE_BYTES + BATCH_BYTES) + 16 * MIB
    print(f"peak RSS of the process tree: one row group {one_rss / MIB:.0f} MiB, row groups of {LOAD_AHEAD} "
          f"{small_rss / MIB:.0f} MiB (bound +{bound / MIB:.0f} MiB; the table decoded: {table_bytes / MIB:.0f} MiB)")
    assert one_rss - small_rss < bound, (one_rss, small_rss, bound)
    assert bound < table_bytes  # the bound is about episodes: one decode of the table breaks it

    # the same bytes, whatever the row groups (manifest included: the store's fingerprint is its
    # content, which differs, so only the shards and their indexes are compared byte for byte)
    one_files, small_files = shard_bytes(tmp_path / "one_out"), shard_bytes(tmp_path / "small_out")
    assert sorted(one_files) == sorted(small_files)
    shards = [name for name in one_files if name.endswith(".tar")]
    assert len(shards) == 8
    for name in one_files:
        if name != "manifest.json":
            assert one_files[name] == small_files[name], name


def test_series_widths_reads_a_batch_not_the_row_group(tmp_path: Path) -> None:
    """The main process finds each stream's width (for episodes that lack it) from its first rows: it
    reads them in one record batch, not the row group (88 MiB decoded here; 111 MiB of pyarrow's peak
    allocation before). Measured as pyarrow's own peak allocation in a fresh interpreter: exact, with
    no sampling."""
    store = write_store(tmp_path / "one", 1 << 20)
    code = ("import sys, pyarrow as pa; from robowds.export.store.schema import open_store; "
            "from robowds.export.store.episodes import series_widths; schema = open_store(sys.argv[1]); "
            "before = pa.default_memory_pool().max_memory(); widths = series_widths(schema, ['state']); "
            "print(widths['state'], before, pa.default_memory_pool().max_memory())")
    done = subprocess.run([sys.executable, "-c", code, str(store)], env=dict(os.environ), capture_output=True,
                          text=True, check=True)
    width, before, peak = map(int, done.stdout.split())
    assert width == VALUES
    assert before < 1 * MIB  # opening the store reads the episode ids only
    # one record batch of ~4 MiB decoded (5 episodes here), the builders' growth and a data page
    assert peak < 4 * BATCH_BYTES, peak
