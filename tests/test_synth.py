"""Tests for the synthetic episode store generator (export/cli/synth.py)."""
from __future__ import annotations

import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from robowds.export.cli.synth import IMAGE_H, IMAGE_W, SynthSummary, write_synthetic_store

SERIES = pa.list_(pa.list_(pa.float64()))


def _files(root: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _cells(root: pathlib.Path, table: str, column: str) -> list[np.ndarray]:
    col = pq.read_table(root / table).column(column).to_pylist()
    return [np.asarray(cell, dtype=np.float64) for cell in col]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> SynthSummary:
    return write_synthetic_store(tmp_path_factory.mktemp("synth") / "store", episodes=6, seed=3)


def test_same_seed_is_byte_identical_and_other_seed_differs(tmp_path: pathlib.Path) -> None:
    a = _files(write_synthetic_store(tmp_path / "a", episodes=5, seed=11).root)
    b = _files(write_synthetic_store(tmp_path / "b", episodes=5, seed=11).root)
    c = _files(write_synthetic_store(tmp_path / "c", episodes=5, seed=12).root)
    assert a.keys() == b.keys() == c.keys()
    assert "store.yaml" in a and "media/overview/ep_0004.png" in a
    for name in a:
        assert a[name] == b[name], name
    assert a["trajectories.parquet"] != c["trajectories.parquet"]
    assert a["sensors.parquet"] != c["sensors.parquet"]


def test_summary_and_tables(store: SynthSummary) -> None:
    root = store.root
    assert store.episodes == 6
    assert store.episode_ids == tuple(f"ep_{i:04d}" for i in range(6))
    expected = {
        "trajectories.parquet": {"joints", "actions", "gripper_cmd", "orientation"},
        "sensors.parquet": {"imu"},
        "text.parquet": {"task"},
        "images.parquet": {"overview"},
    }
    assert {p.name for p in root.glob("*.parquet")} == set(expected)
    for table, fields in expected.items():
        t = pq.read_table(root / table)
        assert set(t.column_names) == fields | {"episode_id"}
        assert t.schema.field("episode_id").type == pa.string()
        assert t.column("episode_id").to_pylist() == list(store.episode_ids)
        for f in fields:
            want = pa.string() if f in ("task", "overview") else SERIES
            assert t.schema.field(f).type == want, (table, f)
    durations = [c[-1, 0] - c[0, 0] for c in _cells(root, "trajectories.parquet", "joints")]
    assert store.total_seconds == pytest.approx(sum(durations))


def test_store_yaml(store: SynthSummary) -> None:
    decl = yaml.safe_load((store.root / "store.yaml").read_text())
    assert decl["version"] == 1
    f = decl["fields"]
    assert f["joints"]["names"] == [f"j{i}" for i in range(7)] and f["joints"]["units"] == "rad"
    assert len(f["actions"]["names"]) == 7
    assert f["gripper_cmd"] == {"interpolation": "hold", "names": ["closed"]}
    assert f["orientation"]["interpolation"] == "slerp" and f["orientation"]["quaternion_order"] == "xyzw"
    assert f["imu"]["names"] == ["ax", "ay", "az", "gx", "gy", "gz"]
    assert f["overview"] == {"kind": "image"} and f["task"] == {"kind": "text"}


def test_joint_rate_streams(store: SynthSummary) -> None:
    root = store.root
    joints = _cells(root, "trajectories.parquet", "joints")
    actions = _cells(root, "trajectories.parquet", "actions")
    quats = _cells(root, "trajectories.parquet", "orientation")
    lengths = set()
    for j, a, q in zip(joints, actions, quats):
        assert j.ndim == 2 and j.shape[1] == 8 and a.shape == j.shape and q.shape == (j.shape[0], 5)
        t = j[:, 0]
        assert t[0] == 0.0
        np.testing.assert_array_equal(t, np.arange(t.size) / 50.0)  # computed, not accumulated
        np.testing.assert_array_equal(a[:, 0], t)
        np.testing.assert_array_equal(q[:, 0], t)
        assert 4.0 <= t[-1] <= 12.0 + 1e-9
        assert np.max(np.abs(np.diff(j[:, 1:], axis=0))) < 0.2  # smooth
        np.testing.assert_allclose(np.linalg.norm(q[:, 1:], axis=1), 1.0, atol=1e-12)
        dots = np.sum(q[1:, 1:] * q[:-1, 1:], axis=1)
        assert np.any(dots < -0.9), "expected at least one q -> -q sign flip"
        lengths.add(j.shape[0])
    assert len(lengths) == len(joints), "episode lengths should differ"


def test_gripper_cmd(store: SynthSummary) -> None:
    joints = _cells(store.root, "trajectories.parquet", "joints")
    for g, j in zip(_cells(store.root, "trajectories.parquet", "gripper_cmd"), joints):
        assert g.shape[1] == 2
        np.testing.assert_array_equal(g[:, 0], np.arange(g.shape[0]) / 10.0)
        assert set(np.unique(g[:, 1])) <= {0.0, 1.0}
        assert set(np.unique(g[:, 1])) == {0.0, 1.0}
        assert j[-1, 0] - 0.1 < g[-1, 0] <= j[-1, 0]


def test_imu(store: SynthSummary) -> None:
    joints = _cells(store.root, "trajectories.parquet", "joints")
    for imu, j in zip(_cells(store.root, "sensors.parquet", "imu"), joints):
        assert imu.shape[1] == 7
        t = imu[:, 0]
        dt = np.diff(t)
        assert np.all(dt > 0)
        assert j[0, 0] < t[0] < 0.02 and j[-1, 0] - 0.02 < t[-1] < j[-1, 0]
        assert np.count_nonzero(dt > 0.1) == 1, "expected exactly one dropout"
        assert 0.15 <= dt.max() <= 0.31
        regular = dt[dt < 0.1]
        assert np.median(regular) == pytest.approx(1 / 200, abs=2e-4)
        assert np.ptp(regular) > 1e-4, "IMU intervals should jitter"
        assert np.all(np.abs(regular - 0.005) <= 0.0008 + 1e-12)
        accel_norm = np.linalg.norm(imu[:, 1:4], axis=1)
        assert 8.5 < np.median(accel_norm) < 11.0  # gravity is there


def test_text_and_images(store: SynthSummary) -> None:
    tasks = pq.read_table(store.root / "text.parquet").column("task").to_pylist()
    assert all(isinstance(x, str) and len(x) > 5 for x in tasks)
    paths = pq.read_table(store.root / "images.parquet").column("overview").to_pylist()
    assert paths == [f"media/overview/{e}.png" for e in store.episode_ids]
    pixels = []
    for rel in paths:
        with Image.open(store.root / rel) as im:
            assert im.format == "PNG" and im.size == (IMAGE_W, IMAGE_H) and im.mode == "RGB"
            pixels.append(np.asarray(im).tobytes())
    assert len(set(pixels)) == len(pixels), "images should differ per episode"


def test_episodes_independent_of_count(tmp_path: pathlib.Path) -> None:
    small = write_synthetic_store(tmp_path / "s", episodes=2, seed=5).root
    big = write_synthetic_store(tmp_path / "b", episodes=4, seed=5).root
    for a, b in zip(_cells(small, "sensors.parquet", "imu"), _cells(big, "sensors.parquet", "imu")):
        np.testing.assert_array_equal(a, b)
    assert (small / "media/overview/ep_0001.png").read_bytes() == (big / "media/overview/ep_0001.png").read_bytes()


def test_refuses_non_empty_root(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    (root / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not an empty folder"):
        write_synthetic_store(root)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert write_synthetic_store(empty, episodes=1).episodes == 1
    with pytest.raises(FileExistsError):
        write_synthetic_store(empty, episodes=1)
    with pytest.raises(ValueError):
        write_synthetic_store(tmp_path / "zero", episodes=0)
