"""Store-level features end to end, against hand-computed expectations (issue 11, item 6): the
`timestamps` policy, a declared `clock`, the `start_s` / `end_s` extent columns and the `split` column."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from robowds.export.cli.main import main


def _samples(out: Path, split: str = "train") -> dict[str, dict]:
    from robowds.reader import ShardDataset
    return {s["__key__"]: s for s in ShardDataset(out, split, shuffle=False)}


def _write(root: Path, columns: dict, decl: dict | None = None) -> Path:
    root.mkdir(parents=True)
    pq.write_table(pa.table(columns), root / "t.parquet")
    if decl is not None:
        (root / "store.yaml").write_text(yaml.safe_dump({"version": 1, **decl}))
    return root


def _series(t: np.ndarray) -> list:
    return np.column_stack([t, 10 * t]).tolist()  # value = 10 x time: easy to check by hand


def _export(store: Path, out: Path, *sets: str) -> int:
    args = ["export", str(store), str(out), "--quiet", "--workers", "1", "--keep-order"]
    for s in sets:
        args += ["--set", s]
    return main(args)


def test_timestamps_repair_and_reject(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = np.arange(20) / 10.0
    bad = good.copy()
    bad[[5, 6]] = bad[[6, 5]]  # two rows out of order
    store = _write(tmp_path / "s", {"episode_id": ["a", "b"], "x": [_series(good), _series(bad)]})
    assert _export(store, tmp_path / "repaired") == 0
    report = json.loads((tmp_path / "repaired" / "manifest.json").read_text())["report"]
    assert report["repairs"] == {"x": {"unsorted": 1}}
    repaired = _samples(tmp_path / "repaired")["b_000005"]
    np.testing.assert_allclose(repaired["x"][:, 0], 10 * (0.5 + np.arange(10) / 10.0), rtol=1e-6)  # sorted back
    assert _export(store, tmp_path / "rejected", "timestamps=reject") == 2
    err = capsys.readouterr().err
    assert "episode 'b', field 'x': timestamps need repair (1 out of order, 0 duplicated)" in err
    assert _export(store, tmp_path / "skipped", "timestamps=reject", "on_bad_episode=skip") == 0
    manifest = json.loads((tmp_path / "skipped" / "manifest.json").read_text())
    assert [r["episode_id"] for r in manifest["report"]["episodes"]["rejected"]] == ["b"]
    assert sorted({k.rsplit("_", 1)[0] for k in _samples(tmp_path / "skipped")}) == ["a"]


def test_declared_clock_sets_the_extent(tmp_path: Path) -> None:
    """joints cover 0.0-1.9 s, the clock stream 0.5-1.4 s: the grid is the clock's, 10 anchors."""
    joints, clock = np.arange(20) / 10.0, 0.5 + np.arange(10) / 10.0
    store = _write(tmp_path / "s", {"episode_id": ["e"], "joints": [_series(joints)], "cmd": [_series(clock)]},
                   {"clock": "cmd"})
    assert _export(store, tmp_path / "out", "window.duration_s=0.2") == 0
    samples = _samples(tmp_path / "out")
    assert sorted(samples) == [f"e_{a:06d}" for a in range(10)]
    first, last = samples["e_000000"], samples["e_000009"]
    assert first["meta"]["t"] == 0.5 and last["meta"]["t"] == 1.4
    np.testing.assert_allclose(first["joints"][:, 0], [5.0, 6.0], rtol=1e-6)  # joints at 0.5 and 0.6 s
    assert last["cmd_mask"].tolist() == [True, False]  # 1.5 s is past the clock's last sample
    assert last["joints_mask"].tolist() == [True, False]  # and past the episode: joints there are not used
    assert main(["export", str(store), str(tmp_path / "only-joints"), "--quiet", "--workers", "1",
                 "--set", "exclude=[cmd]"]) == 0  # the clock is loaded even when not exported
    assert len(_samples(tmp_path / "only-joints")) == 10


def test_start_and_end_columns_set_the_extent(tmp_path: Path) -> None:
    t = np.arange(30) / 10.0  # 0.0-2.9 s of data
    store = _write(tmp_path / "s", {"episode_id": ["e", "f"], "x": [_series(t), _series(t)],
                                    "start_s": [1.0, None], "end_s": [2.0, 3.5]})
    assert _export(store, tmp_path / "out", "window.duration_s=0.3") == 0
    samples = _samples(tmp_path / "out")
    assert sorted(k for k in samples if k.startswith("e_")) == [f"e_{a:06d}" for a in range(11)]  # 1.0..2.0
    assert sorted(k for k in samples if k.startswith("f_")) == [f"f_{a:06d}" for a in range(36)]  # 0.0..3.5
    e_last = samples["e_000010"]  # 2.0 s: 2.1 and 2.2 are data, but outside the episode
    assert e_last["meta"]["t"] == 2.0 and e_last["x_mask"].tolist() == [True, False, False]
    np.testing.assert_allclose(samples["e_000000"]["x"][:, 0], [10.0, 11.0, 12.0], rtol=1e-6)
    f_end = samples["f_000035"]  # 3.5 s: inside the declared extent but after the last sample (2.9 s)
    assert f_end["x_mask"].tolist() == [False, False, False]
    assert samples["f_000029"]["x_mask"].tolist() == [True, False, False]


def test_split_column_assigns_episodes(tmp_path: Path) -> None:
    t = np.arange(10) / 10.0
    ids = ["a", "b", "c", "d"]
    store = _write(tmp_path / "s", {"episode_id": ids, "x": [_series(t)] * 4,
                                    "split": ["val", None, "test", "val"]})
    assert _export(store, tmp_path / "out") == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert {name: split["episodes"] for name, split in manifest["splits"].items()} == {
        "test": ["c"], "train": ["b"], "val": ["a", "d"]}  # null: the seeded rule (train: rest)
    for name, episodes in (("train", {"b"}), ("val", {"a", "d"}), ("test", {"c"})):
        samples = _samples(tmp_path / "out", name)
        assert {k.rsplit("_", 1)[0] for k in samples} == episodes and len(samples) == 10 * len(episodes)
        assert {s["meta"]["split"] for s in samples.values()} == {name}
