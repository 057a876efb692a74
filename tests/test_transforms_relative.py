"""Relative actions (issue 24, item 3): the export's `stats.relative` entry against a hand computation
from the exported samples, its bytes for any worker count, its config errors, and the reader transform
`RelativeActions` (forward, inverse, numpy = torch, `from_stats`, `stats`) on real exported samples.

The synthetic store has `actions` (joint targets 0.1 s ahead, 7 dims) and `joints` (7 dims), the
pair a relative action is made of; `joints` relative to `imu` (6 dims, a partial mapping) adds
windows whose state at the anchor is padding (the IMU starts a few ms after the joints and drops
out mid-episode), which the statistics must skip."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.reader import ShardDataset
from robowds.reader.transforms import RelativeActions

CONFIG = """\
include: [actions, joints, imu]
float_dtype: float64          # the exported values are the ones the statistics were computed from
streams:
  joints: {offset_s: -0.2, duration_s: 0.3}   # 2 steps of history: the anchor is step 2
stats:
  relative:
    actions: joints
    joints: {state: imu, dims: [0, 2, 4], state_dims: [5, 3, 1]}
"""


def export(store: Path, out: Path, *options: str, config: str = CONFIG) -> dict[str, Any]:
    path = out.parent / f"{out.name}.yaml"
    path.write_text(config)
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--config", str(path), *options]) == 0
    return json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("relative") / "store"
    write_synthetic_store(root, episodes=3, seed=3)
    return root


@pytest.fixture(scope="module")
def exported(store: Path) -> Path:
    export(store, store.parent / "out")
    return store.parent / "out"


@pytest.fixture(scope="module")
def samples(exported: Path) -> list[dict[str, Any]]:
    return list(ShardDataset(exported, "train", shuffle=False))


def manifest_of(out: Path) -> dict[str, Any]:
    return json.loads((out / "manifest.json").read_text())


def hand_relative(samples: list[dict[str, Any]], action: str, state: str, dims: list[int], state_dims: list[int],
                  anchor: int) -> np.ndarray:
    """action[t, dims] - state[anchor, state_dims] at every real action step of every window whose state
    at the anchor is real, the other dimensions absolute: [M, D] float64."""
    rows = []
    for s in samples:
        if s[f"{state}_mask"][anchor]:
            a = s[action].astype(np.float64)  # [T, D]
            a[:, dims] -= s[state][anchor, state_dims].astype(np.float64)
            rows.append(a[s[f"{action}_mask"]])
    return np.concatenate(rows)


def assert_entry_equals(entry: dict[str, Any], values: np.ndarray) -> None:
    """count/min/max exact, mean/std to 1e-12 relative, q01/q99 within the histogram's documented value
    error (export/core/stats.py: at most the width of the bucket holding each order statistic, <= 2**-8
    of its binade's lower bound, so <= 2**-8 |x|)."""
    assert entry["count"] == len(values)
    assert entry["min"] == values.min(axis=0).tolist() and entry["max"] == values.max(axis=0).tolist()
    np.testing.assert_allclose(entry["mean"], values.mean(axis=0), rtol=1e-12, atol=0)
    np.testing.assert_allclose(entry["std"], values.std(axis=0), rtol=1e-12, atol=0)
    ordered = np.sort(values, axis=0)  # [M, D]
    for name, q in (("q01", 0.01), ("q99", 0.99)):
        pos = (len(values) - 1) * q
        near = np.abs(ordered[[int(np.floor(pos)), int(np.ceil(pos))]]).max(axis=0)  # [D]
        error = np.abs(np.array(entry[name]) - np.quantile(values, q, axis=0))
        assert (error <= 2.0 ** -8 * near).all(), (name, error, near)


# ------------------------------------------------------------------------------------------ export side
def test_manifest_entries_equal_the_hand_computation(exported: Path, samples: list[dict[str, Any]]) -> None:
    manifest = manifest_of(exported)
    stats = manifest["stats"]["train"]
    assert sorted(stats) == ["actions", "actions.relative", "imu", "joints", "joints.relative"]
    assert stats["actions.relative"]["relative_to"] == {"state": "joints", "dims": list(range(7)),
                                                         "state_dims": list(range(7)), "anchor": 2}
    assert stats["joints.relative"]["relative_to"] == {"state": "imu", "dims": [0, 2, 4], "state_dims": [5, 3, 1],
                                                        "anchor": 0}
    assert manifest["config"]["stats"] == {"relative": {  # the long form: one config however it was written
        "actions": {"state": "joints", "dims": list(range(7)), "state_dims": list(range(7))},
        "joints": {"state": "imu", "dims": [0, 2, 4], "state_dims": [5, 3, 1]}}}
    actions = hand_relative(samples, "actions", "joints", list(range(7)), list(range(7)), 2)
    assert_entry_equals(stats["actions.relative"], actions)
    joints = hand_relative(samples, "joints", "imu", [0, 2, 4], [5, 3, 1], 0)
    assert_entry_equals(stats["joints.relative"], joints)
    # windows whose IMU at the anchor is padding are skipped (the first anchor of each episode, the dropout)
    skipped = [s for s in samples if not s["imu_mask"][0]]
    assert len({s["meta"]["episode_id"] for s in skipped}) == 3 and len(skipped) > 3
    assert stats["joints.relative"]["count"] == stats["joints"]["count"] - sum(int(s["joints_mask"].sum())
                                                                             for s in skipped)
    # the dimensions not taken relative are the absolute values over those steps
    assert stats["joints.relative"]["max"][1] == joints[:, 1].max()


def test_verify_checks_the_relative_entries_against_the_saved_state(exported: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """verify recomputes every statistics entry from stats-state.msgpack: a relative entry's
    `relative_to` record comes from the config, the rest must match (a changed value is found)."""
    assert main(["verify", str(exported), "--quiet"]) == 0
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    manifest = manifest_of(copy)
    manifest["stats"]["train"]["actions.relative"]["mean"][0] += 1.0
    (copy / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["verify", str(copy), "--quiet"]) == 1
    assert ("file stats-state.msgpack: the statistics it gives differ from the manifest's stats for "
            "train/actions.relative\n") in capsys.readouterr().out


def test_entry_bytes_do_not_depend_on_the_worker_count(store: Path, exported: Path) -> None:
    out = store.parent / "two_workers"
    export(store, out, "--workers", "2")
    assert (out / "manifest.json").read_bytes() == (exported / "manifest.json").read_bytes()


def test_without_the_option_the_manifest_is_unchanged(store: Path, exported: Path) -> None:
    """An empty `stats` section is the config without it: same manifest bytes and job id; the option
    itself is part of the config (another job id)."""
    plain = CONFIG.split("stats:")[0]
    without = export(store, store.parent / "plain", config=plain)
    empty = export(store, store.parent / "empty", config=plain + "stats: {relative: {}}\n")
    assert (store.parent / "plain" / "manifest.json").read_bytes() == (store.parent / "empty" / "manifest.json").read_bytes()
    assert "stats" not in without["config"] and sorted(without["stats"]["train"]) == ["actions", "imu", "joints"]
    assert without["job_id"] == empty["job_id"] != manifest_of(exported)["job_id"]
    assert without["stats"]["train"] == {k: v for k, v in manifest_of(exported)["stats"]["train"].items() if "." not in k}


@pytest.mark.parametrize("options, message, fix", [
    (["--set", "stats.relative.actions=gripper_cmd"],
     "config stats.relative.actions: 'actions' has 7 dimensions but 'gripper_cmd' has 1, so the dimensions "
     "cannot be paired one to one", "fix: name the dimensions that correspond, e.g. stats.relative.actions: "
     "{state: gripper_cmd, dims: [0]}"),
    (["--set", "stats.relative.actions=task"], "config stats.relative.actions: field 'task' is a text field, "
     "not a time series", "fix: name an exported float time series; this export's: actions, gripper_cmd, imu, "
     "joints, orientation"),
    (["--set", "stats.relative.actions=joints", "--set", "exclude=[joints]"],
     "config stats.relative.actions: field 'joints' is not exported (see include / exclude)", "fix: name an "),
    (["--set", "stats.relative.grip=joints"], "config stats.relative.grip: field 'grip' is not in the store",
     "fix: name an exported float time series"),
    (["--set", "stats.relative.actions={state: joints, dims: [0, 9]}"],
     "config stats.relative.actions.dims must be indices below 7 ('actions' has 7 dimensions), got [0, 9]",
     "e.g. --set 'stats.relative.actions.dims=[0]'"),
    (["--set", "stats.relative.actions={state: joints, dims: [1, 0, 1]}"],
     "config stats.relative.actions.dims must be a list of distinct dimension indices, got [1, 0, 1]",
     "([1] appear more than once)"),
    (["--set", "stats.relative.actions={state: joints, dims: [0, 1], state_dims: [1]}"],
     "config stats.relative.actions.state_dims must be a list as long as dims (2 entries), got [1]",
     "e.g. --set 'stats.relative.actions.state_dims=[0, 1]'"),
    (["--set", "stats.relative.actions={stat: joints}"], "unknown config key 'stats.relative.actions.stat'",
     "fix: did you mean stats.relative.actions.state? known keys here: state, dims, state_dims"),
    (["--set", "stats.relatve.actions=joints"], "unknown config key 'stats.relatve'",
     "fix: did you mean stats.relative? known keys here: relative"),
    (["--set", "stats.relative.actions=joints", "--set", "streams.joints.offset_s=0.1"],
     "config stats.relative.actions: the window of 'joints' (offset_s 0.1 s, 10 steps at 10 Hz) has no step "
     "at the anchor time", "fix: give streams.joints.offset_s a whole number of steps in (-duration_s, 0]"),
])
def test_config_errors(store: Path, tmp_path: Path, options: list[str], message: str, fix: str,
                       capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["export", str(store), str(tmp_path / "out"), "--quiet", *options])
    err = capsys.readouterr().err
    assert code == 2 and f"robowds export: error: {message}" in err and fix in err, err
    assert not (tmp_path / "out").exists()


def test_episode_without_the_state_counts_nothing_and_a_narrower_one_is_an_episode_error() -> None:
    from robowds.export.core.relative import RelativeSpec, relative_stats
    from robowds.export.errors import EpisodeError

    spec = RelativeSpec("a", "s", dims=(0, 2), state_dims=(1, 0), anchor=1, key="a.relative")
    action, state = np.arange(24.0).reshape(2, 3, 4), np.arange(12.0).reshape(2, 3, 2) * 10  # [W, n, N]
    mask = np.array([[True, False, True], [True, True, True]])  # [W, n]
    state_mask = np.array([[True, True, False], [False, False, True]])  # [W, m]: window 1's anchor is padding
    got = relative_stats("ep", (spec,), {"a": (action, mask), "s": (state, state_mask)})["a.relative"]
    want = action[0][[0, 2]].copy()  # window 0's real steps
    want[:, [0, 2]] -= state[0, 1, [1, 0]]
    assert got.count == 2 and got.min.tolist() == want.min(axis=0).tolist()
    assert got.max.tolist() == want.max(axis=0).tolist() == [-22.0, 9.0, -10.0, 11.0]
    assert relative_stats("ep", (spec,), {"a": (action, mask)}) == {}  # the episode did not record the state
    with pytest.raises(EpisodeError, match=r"has 1 dimensions in this episode, but stats.relative.a takes its "
                                           r"dimension 1"):
        relative_stats("ep", (spec,), {"a": (action, mask), "s": (state[:, :, :1], state_mask)})


def test_set_refines_the_short_form(tmp_path: Path) -> None:
    from robowds.export.job.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("stats: {relative: {actions: joints}}\n")
    config = load_config(path, ["stats.relative.actions.dims=[0, 1]"])
    assert config["stats"] == {"relative": {"actions": {"state": "joints", "dims": [0, 1]}}}
    assert load_config(None, ["stats.relative.actions=joints"])["stats"] == {"relative": {"actions": "joints"}}
    assert "stats" not in load_config(None, ["stats.relative={}"])


# ------------------------------------------------------------------------------------------ reader side
def test_transform_from_stats_on_real_samples(exported: Path, samples: list[dict[str, Any]]) -> None:
    stats = manifest_of(exported)["stats"]["train"]
    rel = RelativeActions.from_stats(stats, action="actions")
    assert (rel.state, rel.dims, rel.state_dims, rel.anchor) == ("joints", tuple(range(7)), tuple(range(7)), 2)
    valid = []
    for s in samples:
        out = rel(s, np.random.default_rng(0))
        a, m, state = s["actions"], s["actions_mask"], s["joints"]
        assert out["actions"].dtype == a.dtype and out["joints"] is state and out["meta"] is s["meta"]
        np.testing.assert_array_equal(out["actions"][m], a[m] - state[2])
        assert out["actions"][~m].tobytes() == a[~m].tobytes()  # padded steps: as exported, bit for bit
        if s["joints_mask"][2]:
            valid.append(out["actions"][m])
    # the entry is the statistics of exactly what the transform outputs
    assert_entry_equals(stats["actions.relative"], np.concatenate(valid))
    partial = RelativeActions.from_stats(stats, action="joints")
    out = partial(samples[5], None)["joints"]
    np.testing.assert_array_equal(out[:, [1, 3, 5, 6]], samples[5]["joints"][:, [1, 3, 5, 6]])
    np.testing.assert_array_equal(out[:, [0, 2, 4]][samples[5]["joints_mask"]],
                                  (samples[5]["joints"][:, [0, 2, 4]] - samples[5]["imu"][0, [5, 3, 1]])[
                                      samples[5]["joints_mask"]])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_inverse_gives_back_the_absolute_actions(samples: list[dict[str, Any]], dtype: type) -> None:
    """(a - s) + s is a exactly when the subtraction was exact (Sterbenz), else within one rounding of
    max(|a|, |s|): the dtype's own precision."""
    rel = RelativeActions("actions", "joints", anchor=2)
    for s in samples[:40]:
        a, state, m = s["actions"].astype(dtype), s["joints"].astype(dtype), s["actions_mask"]
        forward = rel({**s, "actions": a, "joints": state}, None)["actions"]
        back = rel.inverse(forward, state, m)
        scale = np.maximum(np.abs(a), np.abs(state[2]))  # [T, D]
        assert back.dtype == dtype and (np.abs(back - a) <= np.spacing(scale)).all()
        same_sign = (a * state[2] > 0) & (np.abs(a) <= 2 * np.abs(state[2])) & (np.abs(state[2]) <= 2 * np.abs(a))
        assert (back[same_sign] == a[same_sign]).all()
        assert back[~m].tobytes() == a[~m].tobytes()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_numpy_and_torch_batches_are_equal(exported: Path, samples: list[dict[str, Any]], dtype: torch.dtype) -> None:
    stats = manifest_of(exported)["stats"]["train"]
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    for action in ("actions", "joints"):
        rel = RelativeActions.from_stats(stats, action=action)
        chunk = [{k: (v.astype(np_dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
                  for k, v in s.items()} for s in samples[:16]]
        batch = {k: torch.from_numpy(np.stack([s[k] for s in chunk])) for k in ("actions", "actions_mask", "joints",
                                                                                  "joints_mask", "imu")}
        out = rel.batch(batch)
        expected = np.stack([rel(s, None)[action] for s in chunk])
        assert out[action].dtype == dtype and out[action].numpy().tobytes() == expected.tobytes()
        assert rel.batch({k: v.numpy() for k, v in batch.items()})[action].tobytes() == expected.tobytes()
        state = batch[rel.state]
        back = rel.inverse(out[action], state, batch[f"{action}_mask"])
        assert back.numpy().tobytes() == rel.inverse(expected, state.numpy(), batch[f"{action}_mask"].numpy()).tobytes()


def test_stats_swaps_in_the_relative_entry(exported: Path) -> None:
    stats = manifest_of(exported)["stats"]["train"]
    before = json.dumps(stats, sort_keys=True)
    rel = RelativeActions.from_stats(stats, action="actions")
    swapped = rel.stats(stats)
    assert swapped["actions"] is stats["actions.relative"] and swapped["joints"] is stats["joints"]
    assert json.dumps(stats, sort_keys=True) == before  # a copy: the dataset's statistics are untouched
    with pytest.raises(ValueError, match=r"are relative to .*'anchor': 2.*this transform to .*'anchor': 0"):
        RelativeActions("actions", "joints", anchor=0).stats(stats)
    plain = {k: v for k, v in stats.items() if "." not in k}
    for call in (lambda: rel.stats(plain), lambda: RelativeActions.from_stats(plain, action="actions")):
        with pytest.raises(ValueError, match=r"no entry 'actions.relative' \(relative entries: none\); export with "
                                             r"the option stats: \{relative: \{actions: <state field>\}\}"):
            call()


def test_arguments_and_pickling(samples: list[dict[str, Any]]) -> None:
    with pytest.raises(ValueError, match=r"anchor .* is needed: build it from the export's statistics"):
        RelativeActions("actions", "joints")
    with pytest.raises(ValueError, match=r"dims must be distinct dimension indices >= 0, got \[0, 0\]"):
        RelativeActions("actions", "joints", dims=[0, 0], anchor=0)
    with pytest.raises(ValueError, match=r"anchor step 3 is outside 'joints''s window of 3 steps"):
        RelativeActions("actions", "joints", anchor=3)(samples[0], None)
    rel = RelativeActions("actions", "joints", dims=[1, 2], state_dims=[2, 1], anchor=1)
    copy = pickle.loads(pickle.dumps(rel))
    assert copy(samples[7], None)["actions"].tobytes() == rel(samples[7], None)["actions"].tobytes()
    # no torch at import: the export imports this module (export/job/stats_config.py), and
    # tests/test_reader_imports.py checks that importing the export's CLI does not import torch
