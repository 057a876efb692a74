"""A stream one episode did not record (issue 13, item 1): a null or empty cell. That episode's windows
carry the field zero-padded with an all-false mask (its shape and dtype as everywhere else), the report
counts it, validate notes it; a field recorded by no episode stays an error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.store.validate import validate_store

from exports import export_members, npy

SETTINGS = ["--quiet", "--workers", "1", "--keep-order", "--set", "streams.imu.rate_hz=100",
            "--set", "streams.imu.duration_s=0.5"]


def _without_imu(src: Path, dst: Path, episodes: set[str], empty: bool = False) -> Path:
    """A copy of `src` whose `imu` cell is null (or an empty list) for `episodes`."""
    shutil.copytree(src, dst)
    table = pq.read_table(dst / "sensors.parquet")
    cells = [([] if empty else None) if ep in episodes else cell
             for ep, cell in zip(table.column("episode_id").to_pylist(), table.column("imu").to_pylist())]
    column = pa.array(cells, type=table.schema.field("imu").type)
    pq.write_table(table.set_column(table.schema.get_field_index("imu"), "imu", column), dst / "sensors.parquet")
    return dst






@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("missing")
    write_synthetic_store(root / "full", episodes=3, seed=0)
    return {"full": root / "full", "null": _without_imu(root / "full", root / "null", {"ep_0001"}),
            "empty": _without_imu(root / "full", root / "empty", {"ep_0001"}, empty=True),
            "none": _without_imu(root / "full", root / "none", {"ep_0000", "ep_0001", "ep_0002"}), "root": root}


def test_the_episode_carries_zeros_and_a_false_mask_the_others_are_unchanged(
        stores: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    root = stores["root"]
    assert main(["export", str(stores["full"]), str(root / "out_full"), *SETTINGS]) == 0
    assert main(["export", str(stores["null"]), str(root / "out_null"), *SETTINGS]) == 0
    printed = capsys.readouterr().out
    assert ("warning: field 'imu' was not recorded in 1 episode(s) ('ep_0001'): their windows carry it as zeros "
            "with an all-false mask (report.missing_streams.imu in the manifest)") in printed
    full, null = export_members(root / "out_full"), export_members(root / "out_null")
    for key in (k for k in full if not k.startswith("ep_0001")):
        assert null[key] == full[key], key  # other episodes: byte for byte
    ours = sorted(k for k in null if k.startswith("ep_0001"))
    assert ours and set(ours) <= {k for k in full if k.startswith("ep_0001")}
    reference_imu = npy(full[ours[0]]["imu.npy"])
    for key in ours:
        imu, mask = npy(null[key]["imu.npy"]), npy(null[key]["imu_mask.npy"])
        assert imu.dtype == reference_imu.dtype and imu.shape == reference_imu.shape == (50, 6)
        assert not imu.any() and mask.dtype == bool and mask.shape == (50,) and not mask.any()
        for member in ("joints.npy", "joints_mask.npy", "actions.npy", "task.txt"):
            assert null[key][member] == full[key][member], (key, member)
    manifest = json.loads((root / "out_null" / "manifest.json").read_text())
    assert manifest["report"]["missing_streams"] == {"imu": {"episodes": 1, "episode_ids": ["ep_0001"]}}
    assert manifest["schema"]["imu"]["shape"] == [50, 6]
    full_manifest = json.loads((root / "out_full" / "manifest.json").read_text())
    assert "missing_streams" not in full_manifest["report"]
    # statistics count only recorded steps: fewer than with ep_0001's imu
    assert manifest["stats"]["train"]["imu"]["count"] < full_manifest["stats"]["train"]["imu"]["count"]
    assert main(["verify", str(root / "out_null"), "--store", str(stores["null"]), "--quiet"]) == 0


def test_an_empty_list_is_the_same_as_null(stores: dict[str, Path]) -> None:
    root = stores["root"]
    assert main(["export", str(stores["empty"]), str(root / "out_empty"), *SETTINGS]) == 0
    if not (root / "out_null").exists():
        assert main(["export", str(stores["null"]), str(root / "out_null"), *SETTINGS]) == 0
    assert export_members(root / "out_empty") == export_members(root / "out_null")


def test_validate_notes_the_episode_and_stays_exportable(stores: dict[str, Path]) -> None:
    report = validate_store(stores["null"])
    assert report.exportable
    notes = [p for p in report.problems if p.field == "imu"]
    assert [(p.severity, p.episode) for p in notes] == [("warning", "ep_0001")]
    assert notes[0].message.startswith("not recorded in this episode (a null or empty cell)")
    assert set(report.rates["imu"]) == {"ep_0000", "ep_0002"}


def test_a_field_recorded_by_no_episode_is_an_error(stores: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    report = validate_store(stores["none"])
    assert not report.exportable
    (error,) = [p for p in report.problems if p.severity == "error"]
    assert (error.field, error.message) == ("imu", "not recorded in any episode (every cell is null or empty)")
    assert main(["export", str(stores["none"]), str(stores["root"] / "out_none"), *SETTINGS]) == 2
    err = capsys.readouterr().err
    assert err.startswith("robowds export: error: time-series field 'imu' has no samples in any episode\n"), err
    assert "--set exclude=[imu]" in err
