"""The typed time-series layout `{t: list<float64 | int64>, v: list<list<T>>}` (issue 13, item 2).

Integer and bool signals (done flags, task phases) keep their dtype and exact values through `hold`
and `nearest` while their times are float seconds: before this layout, a `[T, N+1]` row list had one
dtype for times and values, so such signals either needed integer times or came out as float32.
Real Parquet stores, real exports, read back with the reader.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from robowds.export.cli.main import main
from robowds.export.core.resample import RawSeries, clean_stream, resample

T_DONE = [0.0, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9]  # s, float times between the 10 Hz grid points
V_DONE = [False, False, True, False, True, True, False]
T_PHASE = [0.0, 0.35, 0.55, 0.9]
# int64 values float64 cannot hold (2**60 + 1 rounds to 2**60): only an int64 path keeps them
V_PHASE = [[2**60 + 1, -3], [2**60 + 2, -2], [2**62 + 7, 5], [9, 2**53 + 1]]

# grid query q = k / 10 (k = 0..9) -> index of the sample each method returns, by hand:
# hold = the last sample at or before q; nearest = the closer neighbour (ties to the earlier)
HOLD_DONE = [0, 0, 1, 2, 2, 3, 4, 4, 5, 6]
NEAR_DONE = [0, 1, 1, 2, 3, 3, 4, 5, 5, 6]
HOLD_PHASE = [0, 0, 0, 0, 1, 1, 2, 2, 2, 3]
NEAR_PHASE = [0, 0, 1, 1, 1, 2, 2, 2, 3, 3]


def _typed(leaf: pa.DataType, time: pa.DataType = pa.float64()) -> pa.StructType:
    return pa.struct([("t", pa.list_(time)), ("v", pa.list_(pa.list_(leaf)))])


def _store(root: Path, columns: dict, decl: dict | None = None) -> Path:
    root.mkdir(parents=True)
    pq.write_table(pa.table(columns), root / "t.parquet")
    if decl is not None:
        (root / "store.yaml").write_text(yaml.safe_dump({"version": 1, **decl}))
    return root


def _flags_store(root: Path) -> Path:
    """One episode: `done` (bool, hold by inference) and `phase` (int64, nearest by declaration)."""
    done = pa.array([{"t": T_DONE, "v": [[v] for v in V_DONE]}], type=_typed(pa.bool_()))
    phase = pa.array([{"t": T_PHASE, "v": V_PHASE}], type=_typed(pa.int64()))
    return _store(root, {"episode_id": ["a"], "done": done, "phase": phase},
                  {"fields": {"phase": {"interpolation": "nearest", "names": ["stage", "step"]}}})


def _export(store: Path, out: Path, *sets: str) -> int:
    args = ["export", str(store), str(out), "--quiet", "--workers", "1", "--keep-order",
            "--set", "window.duration_s=0.2"]  # 2 steps: q_k and q_k + 0.1 (past the end for k = 9)
    for s in sets:
        args += ["--set", s]
    return main(args)


def _windows(out: Path) -> dict[int, dict]:
    from robowds.reader import ShardDataset
    return {s["meta"]["anchor"]: s for s in ShardDataset(out, "train", shuffle=False)}


def _expected(values: list, picks: list[int], dtype: type) -> list[np.ndarray]:
    """Window k's [2, N] values: samples picks[k], picks[k + 1]; the step past the extent is zero."""
    rows = np.array([v if isinstance(v, list) else [v] for v in values], dtype=dtype)  # [T, N]
    padded = np.concatenate([rows[picks], np.zeros((1, rows.shape[1]), dtype)])  # [11, N]
    return [padded[k:k + 2] for k in range(10)]


@pytest.mark.parametrize("method", ["hold", "nearest"])
def test_resample_keeps_bool_and_int64_values_exact(method: str) -> None:
    q = np.arange(10) / 10.0  # [10]
    done = clean_stream(RawSeries(np.array(T_DONE), np.array(V_DONE)[:, None]), method)
    phase = clean_stream(RawSeries(np.array(T_PHASE), np.array(V_PHASE, dtype=np.int64)), method)
    got_done, valid = resample(done, q, method)
    got_phase, _ = resample(phase, q, method)
    assert got_done.dtype == np.bool_ and got_phase.dtype == np.int64 and valid.all()
    picks_done, picks_phase = (HOLD_DONE, HOLD_PHASE) if method == "hold" else (NEAR_DONE, NEAR_PHASE)
    assert got_done[:, 0].tolist() == [V_DONE[i] for i in picks_done]
    assert got_phase.tolist() == [V_PHASE[i] for i in picks_phase]  # exact Python ints, no float rounding


def test_linear_on_integer_values_computes_in_float64() -> None:
    """The integer rule of the `[T, N+1]` layout holds for the typed one: linear interpolates in
    float64 (and the export writes `float_dtype`)."""
    stream = clean_stream(RawSeries(np.array([0.0, 1.0]), np.array([[0], [10]], dtype=np.int64)), "linear")
    got, _ = resample(stream, np.array([0.25]), "linear")
    assert got.dtype == np.float64 and got.tolist() == [[2.5]]


@pytest.mark.parametrize("swap", [False, True])
def test_export_keeps_bool_and_int64_exact_under_hold_and_nearest(tmp_path: Path, swap: bool) -> None:
    store = _flags_store(tmp_path / "s")
    sets = ["streams.done.interpolation=nearest", "streams.phase.interpolation=hold"] if swap else []
    assert _export(store, tmp_path / "out", *sets) == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    schema = manifest["schema"]
    assert (schema["done"]["dtype"], schema["phase"]["dtype"]) == ("bool", "int64")
    assert schema["phase"]["names"] == ["stage", "step"] and schema["phase"]["shape"] == [2, 2]
    assert (schema["done"]["interpolation"], schema["phase"]["interpolation"]) == (
        ("nearest", "hold") if swap else ("hold", "nearest"))
    want_done = _expected(V_DONE, NEAR_DONE if swap else HOLD_DONE, np.bool_)
    want_phase = _expected(V_PHASE, HOLD_PHASE if swap else NEAR_PHASE, np.int64)
    windows = _windows(tmp_path / "out")
    assert sorted(windows) == list(range(10))
    for k, sample in windows.items():
        assert sample["done"].dtype == np.bool_ and sample["phase"].dtype == np.int64
        assert sample["done"].tolist() == want_done[k].tolist(), k
        assert sample["phase"].tolist() == want_phase[k].tolist(), k
        assert sample["done_mask"].tolist() == [True, k < 9] == sample["phase_mask"].tolist()


def test_typed_float_values_with_ns_times(tmp_path: Path) -> None:
    """int64 ns times with `time_unit: ns`; the values stay as stored (float32 here, which the `[T, N+1]`
    layout refuses because its times would be float32 too)."""
    t0 = 1_700_000_000_123_456_789
    times = [t0 + k * 100_000_000 for k in range(5)]  # 10 Hz
    vel = pa.array([{"t": times, "v": [[0.5 * k] for k in range(5)]}], type=_typed(pa.float32(), pa.int64()))
    grip = pa.array([{"t": times, "v": [[k % 2] for k in range(5)]}], type=_typed(pa.uint8(), pa.int64()))
    store = _store(tmp_path / "s", {"episode_id": ["a"], "vel": vel, "grip": grip},
                   {"fields": {"vel": {"time_unit": "ns"}, "grip": {"time_unit": "ns"}}})
    assert main(["export", str(store), str(tmp_path / "out"), "--quiet", "--keep-order",
                 "--set", "window.duration_s=0.1"]) == 0
    windows = _windows(tmp_path / "out")
    assert [w["meta"]["t_ns"] for w in windows.values()] == times
    assert [w["grip"].tolist() for w in windows.values()] == [[[k % 2]] for k in range(5)]
    assert windows[0]["grip"].dtype == np.uint8 and windows[0]["vel"].dtype == np.float32
    assert [w["vel"].tolist() for w in windows.values()] == [[[0.5 * k]] for k in range(5)]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


MALFORMED = {
    "lengths": ({"t": [0.0, 0.1, 0.2], "v": [[1, 2], [3, 4]]},
                "episode 'b', field 'phase': t has 3 times but v has 2 rows "
                "(fix: give v exactly one row of values per time in t)"),
    "widths": ({"t": [0.0, 0.1, 0.2], "v": [[1, 2], [3], [5, 6]]},
               "episode 'b', field 'phase': v row 1 has 1 value(s), row 0 has 2 "
               "(fix: every row of v must hold the same N values)"),
    "null_v": ({"t": [0.0, 0.1], "v": None},
               "episode 'b', field 'phase': v is null (fix: store both t and v for every episode)"),
    "null_value": ({"t": [0.0, 0.1], "v": [[1, 2], [3, None]]},
                   "episode 'b', field 'phase': v has null int64 values "
                   "(fix: write every value (only float values may be NaN: missing))"),
}


@pytest.mark.parametrize("fault", sorted(MALFORMED))
def test_malformed_typed_cell_is_one_clear_error(fault: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cell, message = MALFORMED[fault]
    good = {"t": [0.0, 0.1, 0.2], "v": [[1, 2], [3, 4], [5, 6]]}
    store = _store(tmp_path / "s", {"episode_id": ["a", "b"],
                                    "phase": pa.array([good, cell], type=_typed(pa.int64()))})
    rc, out = _run(["validate", str(store)], capsys)
    assert rc == 1 and f"error: {message}" in out.splitlines()[-2]
    rc, out = _run(["export", str(store), str(tmp_path / "out"), "--quiet"], capsys)
    assert rc == 2 and "Traceback" not in out
    assert out.startswith(f"robowds export: error: 1 episode(s) cannot be exported:\n  {message.split(' (fix')[0]}\n")


SCHEMA_FAULTS = {
    "float32_times": (_typed(pa.int64(), pa.float32()),
                      "field 'x': typed time series with float times: they would lose precision"),
    "string_values": (_typed(pa.string()),
                      "field 'x': a typed time series must be {t: list<float64 | int64>, v: list<list<T>>}"),
}


@pytest.mark.parametrize("fault", sorted(SCHEMA_FAULTS))
def test_typed_column_of_wrong_types_is_a_schema_error(fault: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    typ, message = SCHEMA_FAULTS[fault]
    store = _store(tmp_path / "s", {"episode_id": ["a"], "x": pa.array([None], type=typ)})
    rc, out = _run(["validate", str(store)], capsys)
    assert rc == 1 and message in out


def test_linear_interpolation_of_bool_values_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _flags_store(tmp_path / "s")
    rc, out = _run(["export", str(store), str(tmp_path / "out"), "--quiet",
                    "--set", "streams.done.interpolation=linear"], capsys)
    assert rc == 2 and out == ("robowds export: error: config streams.done.interpolation is linear, but 'done' "
                               "holds bool values: it would export fractions between false and true\n"
                               "  fix: use hold or nearest for 'done'\n")
    (store / "store.yaml").write_text(yaml.safe_dump({"version": 1, "fields": {"done": {"interpolation": "linear"}}}))
    rc, out = _run(["validate", str(store)], capsys)
    assert rc == 1 and ("error: field 'done': linear interpolation of bool values would export fractions between "
                        "false and true (fix: declare interpolation: hold or nearest for it in store.yaml)") in out
