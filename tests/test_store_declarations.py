"""Declarations that do not fit the data are errors in validate and export alike (issue 10, items 2
and 3): a time series stored as a JSON string, and names/units that do not match the value columns."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from robowds.export.cli.main import main


def _store(root: Path, joints: object, decl: dict) -> Path:
    root.mkdir(parents=True)
    pq.write_table(pa.table({"episode_id": ["ep0", "ep1"], "joints": [joints, joints]}), root / "t.parquet")
    (root / "store.yaml").write_text(yaml.safe_dump({"version": 1, "fields": {"joints": decl}}))
    return root


T = np.arange(30) / 10.0
ROWS = np.column_stack([T, np.sin(T), np.cos(T), T, T, T, T, T])  # [30, 1+7]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.out + captured.err


def test_time_series_stored_as_json_string_with_series_declarations(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    store = _store(tmp_path / "s", json.dumps(ROWS.tolist()), {"names": [f"j{i}" for i in range(7)], "units": "rad"})
    code, out = _run(["validate", str(store)], capsys)
    assert code == 1
    assert ("error: field 'joints': store.yaml: declares names, units, which only a time series has, but the "
            "field is a string column (kind 'text')") in out
    assert "not a JSON string" in out
    code, out = _run(["export", str(store), str(tmp_path / "out"), "--quiet", "--workers", "1"], capsys)
    assert code == 2 and "which only a time series has" in out
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_json_looking_text_without_declarations_is_a_warning(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    store = _store(tmp_path / "s", json.dumps(ROWS.tolist()), {})
    code, out = _run(["validate", str(store)], capsys)
    assert code == 0 and "warning: field 'joints': a text field whose values look like a JSON array" in out
    (store / "store.yaml").write_text(yaml.safe_dump({"version": 1, "fields": {"joints": {"kind": "text"}}}))
    code, out = _run(["validate", str(store)], capsys)
    assert code == 0 and "JSON array" not in out  # declared text: the user meant it


@pytest.mark.parametrize("decl, message", [
    ({"names": ["a", "b", "c"]}, "declares 3 names but has 7 value columns"),
    ({"units": ["rad", "rad"]}, "declares 2 units but has 7 value columns"),
])
def test_names_and_units_must_match_the_columns_in_validate_and_export(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], decl: dict, message: str) -> None:
    store = _store(tmp_path / "s", ROWS.tolist(), decl)
    code, out = _run(["validate", str(store)], capsys)
    assert code == 1 and f"error: episode 'ep0', field 'joints': {message}" in out
    code, out = _run(["export", str(store), str(tmp_path / "out"), "--quiet", "--workers", "1"], capsys)
    assert code == 2 and f"episode 'ep0', field 'joints': {message}" in out  # export used to accept it
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_slerp_with_the_wrong_width_gets_a_quaternion_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The hint was "fix the timestamps in the store" for every stream error, this one included."""
    rows = np.column_stack([T, np.sin(T), np.cos(T)]).tolist()  # [T, 1+2]: not a quaternion
    store = _store(tmp_path / "s", rows, {"interpolation": "slerp", "quaternion_order": "xyzw"})
    code, out = _run(["validate", str(store)], capsys)
    assert code == 1
    assert ("error: episode 'ep0', field 'joints': slerp needs 4 quaternion components, got 2 "
            "(fix: store [time, x, y, z, w] rows") in out
    code, out = _run(["export", str(store), str(tmp_path / "out"), "--quiet", "--workers", "1"], capsys)
    assert code == 2 and "fix: store [time, x, y, z, w] rows" in out and "fix the timestamps" not in out
