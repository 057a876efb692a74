"""Episode loading without pyarrow's pandas layer or compute kernels (export/store/episodes.py).

`numpy_of` and `_flat` stand in for `to_numpy(zero_copy_only=False)` and `flatten()`, whose first use
imports pandas (~0.4 s) and pyarrow.compute (~0.3 s) in every export worker. They must give exactly
what those give, and a worker that stages episodes must import neither."""

from __future__ import annotations

import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.synth import write_synthetic_store
from robowds.export.job.config import load_config
from robowds.export.job.spec import resolve
from robowds.export.store.episodes import _flat, numpy_of

ARRAYS = [
    pa.array([1, 2, 3, 4, 5], pa.int32()).slice(2, 3),
    pa.array([-7, 2**40, 3], pa.int64()).slice(1),
    pa.array([0.5, 1.5, -2.25, 3.0], pa.float32()).slice(1, 2),
    pa.array([0.1, 0.2, 0.3], pa.float64()),
    pa.array([255, 0, 7], pa.uint8()).slice(2),
    pa.array([1.0, None, 3.0], pa.float64()),  # null -> NaN, by to_numpy
    pa.array([1.0, None, 3.0], pa.float64()).slice(2),  # the null sliced away
    pa.array([True, False, True], pa.bool_()).slice(1),  # bit-packed: to_numpy
    pa.array([], pa.float64()),
]


@pytest.mark.parametrize("array", ARRAYS, ids=range(len(ARRAYS)))
def test_numpy_of_equals_to_numpy(array: pa.Array) -> None:
    expected, got = array.to_numpy(zero_copy_only=False), numpy_of(array)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


LISTS = [
    pa.array([[1.0, 2.0], [3.0], [4.0, 5.0, 6.0], []], pa.list_(pa.float64())).slice(1, 2),
    pa.array([[1, 2], [3, 4], [5, 6]], pa.large_list(pa.int64())).slice(1),
    pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.int16(), 2)).slice(1, 2),
    pa.array([[1.0], None, [2.0, 3.0]], pa.list_(pa.float64())),  # a null row: flatten()
]


@pytest.mark.parametrize("rows", LISTS, ids=range(len(LISTS)))
def test_flat_equals_flatten(rows: pa.Array) -> None:
    assert _flat(rows).equals(rows.flatten())


WORKER = """
import pickle, sys
from robowds.export.job.stage import stage_episodes
job = pickle.loads(open(sys.argv[1], "rb").read())
batch = stage_episodes((job, list(job.schema.episode_ids)))
assert batch.episode_ids == list(job.schema.episode_ids) and batch.stats
print(sorted(m for m in ("pandas", "pyarrow.compute") if m in sys.modules))
"""


def _typed_store(root: Path) -> Path:
    """Three episodes of a typed (struct t/v) stream with float32 values, in one row group."""
    kind = pa.struct([("t", pa.list_(pa.float64())), ("v", pa.list_(pa.list_(pa.float32())))])
    cells = [{"t": [0.1 * k for k in range(20)], "v": [[float(e), 0.5 * k] for k in range(20)]} for e in range(3)]
    root.mkdir(parents=True)
    pq.write_table(pa.table({"episode_id": ["a", "b", "c"], "arm": pa.array(cells, kind)}), root / "t.parquet")
    return root


@pytest.mark.parametrize("layout", ["list", "typed"])
def test_a_worker_staging_episodes_imports_neither_pandas_nor_compute(tmp_path: Path, layout: str) -> None:
    pytest.importorskip("pandas")  # without pandas installed there is nothing to avoid
    if layout == "list":
        store = tmp_path / "store"
        write_synthetic_store(store, episodes=2, seed=1)
    else:
        store = _typed_store(tmp_path / "store")
    job, _ = resolve(store, load_config(None, ["window.duration_s=0.2"]))
    (tmp_path / "work").mkdir()
    (tmp_path / "job.pkl").write_bytes(pickle.dumps(replace(job, work=str(tmp_path / "work"))))
    done = subprocess.run([sys.executable, "-c", WORKER, str(tmp_path / "job.pkl")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[]"
