"""`ShardDataset.stats` and `Normalize` (issue 24 items 1, 2 and 6): the three formulas against a
hand computation from the manifest's statistics, the per-field mode map, padded steps kept bit for
bit, the inverse, the same bits on a sample (numpy) and on a collated torch batch, the errors, pickling
and a real spawn DataLoader over a tiny synthetic export."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from exports import export_synthetic
from robowds.reader import Mixture, ShardDataset, collate
from robowds.reader.transforms import Normalize

FIELDS = ["actions", "gripper_cmd", "imu", "joints", "orientation"]  # the synthetic store's time series
F32 = 2.0 ** -24  # float32 unit roundoff


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 episodes, stride 4: 51 windows, some with padded steps (imu has masked steps inside too)."""
    return export_synthetic(tmp_path_factory.mktemp("normalize"), 2, 0, "--stride", "4")


@pytest.fixture(scope="module")
def samples(out: Path) -> list[dict[str, Any]]:
    return list(ShardDataset(out, "train", shuffle=False, exclude=["overview"]))


@pytest.fixture(scope="module")
def stats(out: Path) -> dict[str, Any]:
    return ShardDataset(out, "train").stats


def by_hand(x: np.ndarray, entry: dict[str, list[float]], mode: str, eps: float = 1e-8) -> np.ndarray:
    """The issue's formula in float64, straight from the statistics dict."""
    x = x.astype(np.float64)
    if mode == "mean_std":
        return (x - np.array(entry["mean"])) / (np.array(entry["std"]) + eps)
    lo, hi = (np.array(entry["min"]), np.array(entry["max"])) if mode == "min_max" else \
        (np.array(entry["q01"]), np.array(entry["q99"]))
    return 2 * (x - lo) / (hi - lo + eps) - 1


def bound(entry: dict[str, list[float]], mode: str, expected: np.ndarray) -> np.ndarray:
    """float32 error bound of ((x - shift) * scale) + bias: the shift's rounding times the scale, plus
    the subtraction's, the scale's, the product's and the bias addition's rounding."""
    lo, hi = {"mean_std": ("mean", "std"), "min_max": ("min", "max"), "quantile": ("q01", "q99")}[mode]
    shift, hi = np.array(entry[lo]), np.array(entry[hi])
    scale = 1 / (hi + 1e-8) if mode == "mean_std" else 2 / (hi - shift + 1e-8)
    return 2 * F32 * (np.abs(shift) * scale + 3 * (np.abs(expected) + 1)) + 1e-30


def padded(samples: list[dict[str, Any]], field: str) -> dict[str, Any]:
    return next(s for s in samples if not s[field + "_mask"].all() and s[field + "_mask"].any())


# -- item 1: ShardDataset.stats ------------------------------------------------------------------
def test_dataset_stats_are_the_manifests_split_statistics(out: Path, stats: dict[str, Any]) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    assert stats == manifest["stats"]["train"] and sorted(stats) == FIELDS
    assert set(stats["joints"]) == {"count", "mean", "std", "min", "max", "q01", "q99"}
    mix = Mixture([ShardDataset(out, "train")], [1.0], names=["a"], rank=0, world_size=1)
    assert mix.stats("a") == stats


# -- item 2: the formulas --------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["mean_std", "min_max", "quantile"])
def test_each_mode_is_its_formula_on_real_steps_and_leaves_padded_steps(
        samples: list[dict[str, Any]], stats: dict[str, Any], mode: str) -> None:
    norm = Normalize(stats, mode=mode)
    assert norm.modes == dict.fromkeys(FIELDS, mode)
    for sample in [padded(samples, "joints"), padded(samples, "imu"), samples[0]]:
        got = norm(sample, np.random.default_rng(0))
        assert got is not sample and got["task"] == sample["task"] and got["__key__"] == sample["__key__"]
        for field in FIELDS:
            x, y, mask = sample[field], got[field], sample[field + "_mask"]
            assert y.dtype == np.float32 and y.shape == x.shape
            expected = by_hand(x, stats[field], mode)
            err = np.abs(y.astype(np.float64) - expected)[mask]
            assert (err <= bound(stats[field], mode, expected)[mask]).all(), (field, err.max())
            assert y[~mask].tobytes() == x[~mask].tobytes()  # padded steps: as exported, bit for bit


@pytest.mark.parametrize("mode", ["mean_std", "min_max", "quantile"])
def test_exactly_representable_statistics_give_exact_values(mode: str) -> None:
    """With eps=0 and powers of two every operation is exact: the formula's exact values."""
    entry = {"mean": [1.0, -2.0], "std": [0.5, 4.0], "min": [-1.0, 0.0], "max": [3.0, 8.0],
             "q01": [0.0, -4.0], "q99": [2.0, 4.0]}
    x = np.array([[1.0, -2.0], [2.0, 6.0], [3.0, 0.0]], np.float32)  # [T, D]
    expected = {"mean_std": [[0, 0], [2, 2], [4, 0.5]], "min_max": [[0, -1.5], [0.5, 0.5], [1, -1]],
                "quantile": [[0, -0.5], [1, 1.5], [2, 0]]}[mode]
    got = Normalize({"a": entry}, mode=mode, eps=0)({"a": x}, None)["a"]
    assert got.dtype == np.float32 and got.tolist() == expected
    assert Normalize({"a": entry}, mode=mode, eps=0, clip=(-1.0, 1.0))({"a": x}, None)["a"].tolist() == \
        np.clip(expected, -1, 1).tolist()
    ints = {"a": x.astype(np.int64), "a_mask": np.array([True, True, False])}  # an integer field: float32
    assert Normalize({"a": entry}, mode=mode, eps=0)(ints, None)["a"] is ints["a"]  # only when named
    got = Normalize({"a": entry}, mode=mode, fields=["a"], eps=0)(ints, None)["a"]
    assert got.dtype == np.float32 and got.tolist() == [*expected[:2], [3.0, 0.0]]
    tensor = Normalize({"a": entry}, mode=mode, fields=["a"], eps=0).batch({k: torch.from_numpy(v) for k, v in ints.items()})
    assert tensor["a"].dtype == torch.float32 and tensor["a"].tolist() == got.tolist()


def test_the_mode_map_normalises_only_its_fields_each_its_way(samples: list[dict[str, Any]],
                                                             stats: dict[str, Any]) -> None:
    norm = Normalize(stats, mode={"joints": "mean_std", "actions": "quantile"})
    sample = padded(samples, "joints")
    got = norm(sample, None)
    for field, mode in [("joints", "mean_std"), ("actions", "quantile")]:
        assert got[field].tobytes() == Normalize(stats, mode=mode, fields=[field])(sample, None)[field].tobytes()
        assert not np.array_equal(got[field], sample[field])
    for field in ["imu", "gripper_cmd", "orientation"]:  # absent from the map: the same array
        assert got[field] is sample[field]


def test_padded_steps_keep_their_bits_whatever_they_hold() -> None:
    """NaN payloads and -0.0 on padded steps come back untouched (with clip too); the read-only input
    arrays (a mapped shard's views) are not written; float16 and float64 stay themselves."""
    entry = {"mean": [10.0, 20.0], "std": [2.0, 4.0]}
    for dtype in (np.float16, np.float32, np.float64):
        x = np.array([[11.0, 23.0], [0.0, 0.0], [12.0, 14.0]], dtype)  # [T, D]
        x[1] = [np.nan, -0.0]
        x.view(np.uint8)[1, 0] ^= 1  # x[1, 0]: a NaN with its own payload bits
        mask = np.array([True, False, True])
        x.setflags(write=False)
        got = Normalize({"a": entry}, eps=0, clip=(-1.5, 1.5))({"a": x, "a_mask": mask}, None)["a"]
        assert got.dtype == dtype and got[1].tobytes() == x[1].tobytes()
        assert got[[0, 2]].tolist() == [[0.5, 0.75], [1.0, -1.5]]


def test_a_mixed_mode_map_keeps_signed_zeros_on_both_paths() -> None:
    """mean_std fields get no `+ 0.0` when min_max fields share the sample's buffer: -0.0 stays -0.0."""
    stats = {"a": {"mean": [0.0], "std": [1.0]}, "b": {"min": [0.0], "max": [2.0]}}
    norm = Normalize(stats, mode={"a": "mean_std", "b": "min_max"}, eps=0)
    sample = {"a": np.array([[-0.0], [1.0]], np.float32), "b": np.array([[0.0], [1.0]], np.float32)}
    got, batch = norm(sample, None), norm.batch({k: torch.from_numpy(v[None]) for k, v in sample.items()})
    assert np.signbit(got["a"]).tolist() == [[True], [False]] and got["b"].tolist() == [[-1.0], [0.0]]
    assert all(batch[f][0].numpy().tobytes() == got[f].tobytes() for f in "ab")


# -- the inverse -----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["mean_std", "min_max", "quantile"])
def test_inverse_gives_back_the_values(stats: dict[str, Any], mode: str) -> None:
    """Random float32 values over twice each dimension's range, numpy and torch, within 1e-5 of the
    field's scale; a constant dimension (std 0, max == min, q01 == q99) stays finite and comes back."""
    rng = np.random.default_rng(1)
    flat = {**stats, "flat": {"count": 9, "mean": [3.25, 0.0], "std": [0.0, 0.0], "min": [3.25, 0.0],
                              "max": [3.25, 0.0], "q01": [3.25, 0.0], "q99": [3.25, 0.0]}}
    norm = Normalize(flat, mode=mode)
    for field in [*FIELDS, "flat"]:
        lo, hi = np.array(flat[field]["min"]), np.array(flat[field]["max"])
        span = hi - lo
        x = rng.uniform(lo - span / 2, hi + span / 2, (4, 10, len(lo))).astype(np.float32)  # [B, T, D]
        y = norm({field: x}, None)[field]
        assert np.isfinite(y).all()
        back = norm.inverse(y, field)
        scale = np.maximum(np.abs(x), np.maximum(span, np.abs(lo)))
        assert back.dtype == np.float32 and (np.abs(back - x) <= 1e-5 * scale).all(), field
        tensor = norm.inverse(torch.from_numpy(y), field)
        assert tensor.dtype == torch.float32 and np.array_equal(tensor.numpy(), back)
    constant = np.array([[3.25, 0.0]] * 3, np.float32)
    y = norm({"flat": constant}, None)["flat"]  # 0 (mean_std) or -1: finite
    assert y.tolist() == [[0.0 if mode == "mean_std" else -1.0] * 2] * 3  # the formula's value
    assert norm.inverse(y, "flat").tolist() == constant.tolist()


# -- numpy sample vs torch batch -------------------------------------------------------------------
@pytest.mark.parametrize("options", [{}, {"mode": "quantile", "clip": (-1.0, 1.0)},
                                     {"mode": {"imu": "min_max", "actions": "mean_std"}}])
def test_a_collated_torch_batch_gets_the_samples_bits(samples: list[dict[str, Any]], stats: dict[str, Any],
                                                      options: dict[str, Any]) -> None:
    norm = Normalize(stats, **options)
    one = [norm(s, None) for s in samples[:16]]
    batch = norm.batch(collate(samples[:16]))
    for field in FIELDS:
        assert batch[field].dtype == torch.float32
        assert batch[field].numpy().tobytes() == np.stack([s[field] for s in one]).tobytes(), field
    for field in norm.modes:
        assert norm.inverse(batch[field], field).numpy().tobytes() == norm.inverse(batch[field].numpy(), field).tobytes()
    doubles = {f: torch.from_numpy(np.stack([s[f] for s in samples[:4]]).astype(np.float64)) for f in FIELDS}
    got, by_numpy = norm.batch(doubles), norm({f: v.numpy() for f, v in doubles.items()}, None)
    assert all(got[f].dtype == torch.float64 and got[f].numpy().tobytes() == by_numpy[f].tobytes() for f in FIELDS)


# -- errors ----------------------------------------------------------------------------------------
def test_errors_say_what_and_how_to_fix(samples: list[dict[str, Any]], stats: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"unknown mode 'zscore'; use one of mean_std, min_max, quantile"):
        Normalize(stats, mode="zscore")
    with pytest.raises(ValueError, match=r"unknown mode 'z' for field 'imu'"):
        Normalize(stats, mode={"imu": "z"})
    with pytest.raises(ValueError, match=r"field 'state' has no statistics \(fields with statistics: actions, "
                                         r"gripper_cmd, imu, joints, orientation\)"):
        Normalize(stats, fields=["joints", "state"])
    with pytest.raises(ValueError, match=r"field 'state' has no statistics"):
        Normalize(stats, mode={"state": "quantile"})
    with pytest.raises(ValueError, match=r"field 'none' has no statistics \(fields with statistics: a\)"):
        Normalize({"a": {"mean": [0.0], "std": [1.0]}, "none": None}, fields=["none"])
    norm = Normalize({"joints": stats["imu"]})
    with pytest.raises(ValueError, match=r"field 'joints' has shape \[10, 7\] \(last dimension 7\) but its "
                                         r"statistics have 6 values \(one per dimension\); pass the statistics"):
        norm(samples[0], None)
    with pytest.raises(ValueError, match=r"field 'joints' has shape \[1, 10, 7\]"):
        norm.batch(collate(samples[:1]))
    with pytest.raises(ValueError, match=r"last dimension 7\) but its statistics have 6"):
        norm.inverse(np.zeros((2, 7), np.float32), "joints")
    with pytest.raises(ValueError, match=r"field 'imu' is not normalised by this transform \(it normalises joints\)"):
        norm.inverse(np.zeros((2, 6), np.float32), "imu")
    with pytest.raises(ValueError, match=r"field\(s\) \['joints'\] named in fields / the mode map are not in the sample"):
        Normalize(stats, fields=["joints"])({"imu": samples[0]["imu"]}, None)
    with pytest.raises(ValueError, match=r"fields \['imu'\] and the mode map's fields \['joints'\] differ"):
        Normalize(stats, mode={"joints": "mean_std"}, fields=["imu"])
    with pytest.raises(ValueError, match=r"statistics of field 'joints' have no 'q01'"):
        Normalize({"joints": {"mean": [0.0], "std": [1.0]}}, mode="quantile")
    with pytest.raises(ValueError, match=r"dimensions \[0\] have a zero or negative std \+ eps .* pass eps > 0"):
        Normalize({"a": {"mean": [0.0], "std": [0.0]}}, eps=0)
    with pytest.raises(ValueError, match=r"clip must be None or \(lo, hi\) with lo < hi"):
        Normalize(stats, clip=(1.0, -1.0))
    with pytest.raises(ValueError, match=r"write fields=\['joints'\]"):
        Normalize(stats, fields="joints")


# -- pickling, import cost and a real spawn DataLoader ---------------------------------------------
def test_pickles_without_its_torch_constants(samples: list[dict[str, Any]], stats: dict[str, Any]) -> None:
    norm = Normalize(stats, mode={"joints": "quantile", "imu": "min_max"}, clip=(-2.0, 2.0))
    norm.batch(collate(samples[:2]))  # fills the per-device constants
    again = pickle.loads(pickle.dumps(norm))
    assert again._torch == {} and again.modes == norm.modes and again.clip == (-2.0, 2.0)
    assert all(again(samples[3], None)[f].tobytes() == norm(samples[3], None)[f].tobytes() for f in FIELDS)


def test_importing_the_module_does_not_import_torch() -> None:
    code = ("import sys\nimport robowds.reader.transforms.normalize\nfrom robowds.reader.transforms import Normalize\n"
            "Normalize({'a': {'mean': [0.0], 'std': [1.0]}})({'a': __import__('numpy').zeros((2, 1))}, None)\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_a_spawn_dataloader_gives_the_hand_normalised_samples(out: Path, samples: list[dict[str, Any]]) -> None:
    plain = ShardDataset(out, "train", shuffle=False, exclude=["overview"])
    norm = Normalize(plain.stats, mode={"joints": "mean_std", "actions": "quantile", "imu": "min_max"})
    ds = ShardDataset(out, "train", shuffle=False, exclude=["overview"], transform=norm).set_batching(8)
    loader = DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="spawn")
    got = [b for b in loader]
    keys = [k for b in got for k in b["__key__"]]
    assert keys == [s["__key__"] for s in samples]
    for field, mode in norm.modes.items():
        y = torch.cat([b[field] for b in got]).numpy()  # [N, T, D]
        x = np.stack([s[field] for s in samples])
        mask = np.stack([s[field + "_mask"] for s in samples])  # [N, T]
        expected = by_hand(x, plain.stats[field], mode)
        assert (np.abs(y - expected)[mask] <= bound(plain.stats[field], mode, expected)[mask]).all(), field
        assert y[~mask].tobytes() == x[~mask].tobytes() and (~mask).any()
        assert y.tobytes() == np.stack([norm(s, None)[field] for s in samples]).tobytes()
    assert torch.cat([b["gripper_cmd"] for b in got]).numpy().tobytes() == \
        np.stack([s["gripper_cmd"] for s in samples]).tobytes()
