"""The store example of docs/store.md works as written, and real third-party robot data exports exactly."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.main import main
from robowds.reader.format import decode_npy, group_samples, iter_members
from robowds.reader.manifest import parse_manifest, shards_of

from realdata import G1, G1_EPISODES, G1_LENGTHS, REAL_DATA, g1, g1_parquet, real_path
from reference import Config, StreamConfig, assert_export_matches, expected_export

ROOT = Path(__file__).resolve().parents[1]


def read_samples(out: Path, split: str = "train") -> dict[str, dict[str, bytes]]:
    manifest = parse_manifest((out / "manifest.json").read_bytes())
    samples = {}
    for shard in shards_of(manifest, split):
        data = (out / shard.path).read_bytes()
        samples.update({k: {n: bytes(v) for n, v in m.items()} for k, _, m in group_samples(iter_members(data))})
    return samples


def test_readme_example_store_exports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readme = (ROOT / "docs" / "store.md").read_text()
    section = readme[readme.index("## A complete small example"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/store.md example", "exec"), {})
    store = tmp_path / "my_store"
    assert main(["validate", str(store)]) == 0
    assert main(["export", str(store), str(tmp_path / "out"), "--quiet", "--keep-order"]) == 0
    samples = read_samples(tmp_path / "out")
    # ep0: 120 joint samples at 50 Hz = 2.38 s -> grid frames at 10 Hz: 0..23
    assert sorted(k for k in samples if k.startswith("ep0_")) == [f"ep0_{a:06d}" for a in range(24)]
    first = samples["ep0_000000"]
    t = np.arange(10) / 10.0
    np.testing.assert_allclose(decode_npy(first["joints.npy"]), np.column_stack([np.sin(t), np.cos(t)]), rtol=1e-6)
    assert decode_npy(first["gripper_cmd.npy"]).ravel().tolist() == [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]
    assert first["task.txt"] == b"pick the cube"
    last = samples["ep0_000023"]  # t = 2.3 s: steps at 2.3, 2.4 (> 2.38 end) ... are padding
    assert decode_npy(last["joints_mask.npy"]).tolist() == [True] + [False] * 9
    assert not decode_npy(last["joints.npy"])[1:].any()  # zero padding


def lerobot_to_store(paths: list[Path], dst: Path) -> list[np.ndarray]:
    """A small test-side adapter (the real converter comes later): LeRobot v2.1 parquet -> store.

    Times: frame_index / fps in float64 (the float32 `timestamp` column is rounded)."""
    fps = json.loads(g1("meta", "info.json").read_text())["fps"]
    rows, states = [], []
    for path in paths:
        table = pq.read_table(path)
        t = table.column("frame_index").to_numpy() / fps  # [T]
        state = np.stack(table.column("observation.state").to_numpy(zero_copy_only=False)).astype(np.float64)
        action = np.stack(table.column("action").to_numpy(zero_copy_only=False)).astype(np.float64)
        states.append(state)
        rows.append({"episode_id": path.stem, "state": np.column_stack([t, state]).tolist(),
                     "action": np.column_stack([t, action]).tolist(), "task": "Pick up the yellow bottle on the table."})
    dst.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), dst / "episodes.parquet")
    return states


def test_real_lerobot_data_exports_exactly(tmp_path: Path) -> None:
    store, out = tmp_path / "g1", tmp_path / "out"
    paths = [g1_parquet(e) for e in G1_EPISODES]
    states = lerobot_to_store(paths, store)
    assert main(["validate", str(store)]) == 0
    # 30 Hz grid, 1 s of state history + 1 s of future actions, stride 5
    assert main(["export", str(store), str(out), "--quiet", "--fps", "30", "--stride", "5",
                 "--set", "streams.state.offset_s=-1.0", "--set", "streams.action.duration_s=1.0",
                 "--set", "window.rate_hz=30"]) == 0
    assert main(["verify", str(out), "--store", str(store), "--check-windows", "64", "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    lengths = [len(s) for s in states]
    assert lengths == [G1_LENGTHS[e] for e in G1_EPISODES] == [393, 343]
    assert manifest["report"]["windows"]["emitted"] == sum(-(-n // 5) for n in lengths) == 79 + 69
    samples = read_samples(out)
    assert sorted(samples) == [f"{e}_{a:06d}" for e, n in zip(G1_EPISODES, lengths) for a in range(0, n, 5)]
    by_episode = {p.stem: s for p, s in zip(paths, states)}
    for key, sample in samples.items():  # every window of both episodes
        episode, anchor = key.rsplit("_", 1)
        anchor = int(anchor)
        state = decode_npy(sample["state.npy"])  # [30, 26]: frames anchor-30 .. anchor-1
        mask = decode_npy(sample["state_mask.npy"])
        frames = np.arange(anchor - 30, anchor)
        real = frames >= 0
        np.testing.assert_array_equal(mask, real)
        # grid times hit the recorded frames exactly: values are the float32 recordings, bit for bit
        np.testing.assert_array_equal(state[real], by_episode[episode][frames[real]].astype(np.float32))
        assert not state[~real].any()
    # both streams of every window, action included (1 s of future: padded past the episode end),
    # against the independent reference, not only verify's recomputation with the exporter's code
    config = Config(fps=30.0, stride=5, streams={"state": StreamConfig("linear", rate_hz=30, duration_s=1.0, offset_s=-1.0),
                                                 "action": StreamConfig("linear", rate_hz=30, duration_s=1.0)})
    expected = expected_export(store, config)
    assert assert_export_matches(out, config, expected) == 79 + 69
    last = expected["episode_000002"][-1]  # anchor 340 of 343 frames: 3 real future actions
    assert last.anchor == 340 and last.masks["action"].tolist() == [True] * 3 + [False] * 27


def test_vendored_real_data_is_the_upstream_bytes_and_nothing_else() -> None:
    """Every copied file is present with the bytes its SHA256SUMS records (no LFS pointer, no end-of-line
    conversion), and the folder holds nothing unlisted beyond its provenance."""
    listed = dict(line.split("  ", 1)[::-1] for line in g1("SHA256SUMS").read_text().splitlines())  # path -> sha256
    assert len(listed) == 8 and "LICENSE" in listed
    for name, digest in listed.items():
        assert hashlib.sha256(g1(name).read_bytes()).hexdigest() == digest, name
    present = {p.relative_to(g1()).as_posix() for p in g1().rglob("*") if p.is_file()}
    assert present == set(listed) | {"SHA256SUMS", "PROVENANCE.md"}
    assert set(listed) >= {f"data/chunk-000/{e}.parquet" for e in G1_EPISODES}
    assert (REAL_DATA.parent / "README.md").is_file() and G1 in (REAL_DATA.parent / "README.md").read_text()


@pytest.mark.parametrize("folder", sorted(p.name for p in REAL_DATA.iterdir() if p.is_dir()))
def test_every_vendored_folder_is_its_listed_bytes_with_provenance_and_licence(folder: str) -> None:
    root = real_path(folder)
    listed = dict(line.split("  ", 1)[::-1] for line in (root / "SHA256SUMS").read_text().splitlines())
    for name, digest in listed.items():
        assert hashlib.sha256((root / name).read_bytes()).hexdigest() == digest, name
    present = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert present == set(listed) | {"SHA256SUMS", "PROVENANCE.md"}
    provenance = (root / "PROVENANCE.md").read_text()
    assert any(name.startswith("LICENSE") for name in present) or "## Licence" in provenance
    assert f"real/{folder}/" in (REAL_DATA.parent / "README.md").read_text()  # listed with its licence and size


def test_a_missing_vendored_file_fails_the_test_rather_than_skipping_it() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"vendored real data missing: .*episode_000099\.mp4"):
        real_path(G1, "videos", "episode_000099.mp4")


def test_no_test_reads_real_data_outside_the_vendored_copy() -> None:
    """A test that builds a path into ../shared would skip (or fail) in a clean clone: all real data goes
    through tests/realdata.py."""
    pattern = re.compile(r"""["']shared["']\s*/|shared[/]data[/]real""")  # written so as not to match itself
    offenders = [f"{path.name}:{n}" for path in sorted((ROOT / "tests").glob("*.py"))
                 for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []
