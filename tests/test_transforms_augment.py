"""Camera augmentation (issue 24, item 4): one draw per window (every frame the same crop, shift and
jitter), `shared` draws across cameras, the draws' distributions (KS tests), the torch batch path equal
to the worker path for the same parameters in both layouts, identical bytes through real DataLoader
workers (0, 1, 2, spawn) and after a resume, and imports that cost no torch."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.reader import ShardDataset, ShardLoader
from robowds.reader.transforms import (ColorJitter, Compose, RandomChoice, RandomResizedCrop, RandomShift,
                                       Resize)
from robowds.reader.transforms._images import numpy_rng
from robowds.reader.transforms.color import JitterFactors
from robowds.reader.transforms.geometry import CropBox

from videos import write_frames

H, W = 48, 64


def window(t: int = 4, seed: int = 0) -> np.ndarray:
    """[T, H, W, 3] uint8: frame k = base + 10 k, base noise in 0..200 (never clipped)."""
    base = np.random.default_rng(seed).integers(0, 201, (H, W, 3), dtype=np.uint8)
    return np.stack([base + 10 * k for k in range(t)]).astype(np.uint8)


def offsets(out: np.ndarray) -> np.ndarray:
    """out[k] - out[0] - 10 k for every frame k: 0 where every frame got the same geometry."""
    diff = out.astype(np.int64) - out[:1].astype(np.int64)
    return diff - 10 * np.arange(len(out))[:, None, None, None]


def test_every_frame_of_a_window_gets_the_same_crop_and_shift() -> None:
    frames = window()
    crop = RandomResizedCrop((24, 40), scale=(0.2, 0.6))
    for seed in range(5):
        out = crop({"cam": frames}, np.random.default_rng(seed))["cam"]
        assert out.shape == (4, 24, 40, 3) and out.dtype == np.uint8
        assert np.abs(offsets(out)).max() <= 1  # one box: the frames differ by their offsets (+-1 rounding)
        box = crop.draw_params(np.random.default_rng(seed), H, W)
        assert np.array_equal(out, crop.apply(frames, box))  # the box `draw_params` gives is the one applied
    # the premise: a box drawn per frame would not keep the offsets
    per_frame = np.stack([crop.apply(frames[k:k + 1], crop.draw_params(np.random.default_rng(k), H, W))[0]
                          for k in range(4)])
    assert np.abs(offsets(per_frame)).max() > 50
    shift = RandomShift(6)
    for seed in range(5):
        out = shift({"cam": frames}, np.random.default_rng(seed))["cam"]
        assert out.shape == frames.shape and not offsets(out).any()  # exact: no resampling
        dy, dx = shift.draw_params(np.random.default_rng(seed), H, W).__dict__.values()
        rows, cols = np.clip(np.arange(H) + dy, 0, H - 1), np.clip(np.arange(W) + dx, 0, W - 1)
        assert np.array_equal(out, frames[:, rows][:, :, cols])  # replicate-padded by 6, cropped back


def test_shared_draws_give_identical_cameras_identical_outputs() -> None:
    frames = window(3)
    for t in (RandomResizedCrop(16), RandomShift(4), ColorJitter(0.4, 0.4, 0.4, 0.1)):
        sample = {"left": frames, "right": frames.copy(), "state": np.zeros((3, 7), np.float32)}
        out = type(t)(**{**_args(t), "shared": True})(sample, np.random.default_rng(1))
        assert np.array_equal(out["left"], out["right"]) and out["state"] is sample["state"]
        out = t(sample, np.random.default_rng(1))  # shared=False (the default): one draw per camera
        assert not np.array_equal(out["left"], out["right"])


def _args(t: Any) -> dict[str, Any]:
    if isinstance(t, RandomResizedCrop):
        return {"size": t.size, "scale": t.scale, "ratio": t.ratio}
    if isinstance(t, RandomShift):
        return {"pad": t.pad}
    return {k: getattr(t, k) for k in ("brightness", "contrast", "saturation", "hue")}


@pytest.mark.filterwarnings("error")  # no warning about read-only arrays
def test_fields_layouts_and_images() -> None:
    """cameras=None: every uint8 [T, H, W, 3] window, not images, masks or state; TCHW windows give the
    THWC result transposed; a named [H, W, 3] image is a window of one frame; a wrong name is refused;
    read-only frames (a mapped shard's) are fine."""
    frames = window(2)
    frames.setflags(write=False)  # as a sample's arrays from a mapped shard are
    sample = {"cam": frames, "cam_mask": np.ones(2, bool), "overview": frames[0].copy(),
              "depth": np.zeros((2, H, W, 1), np.uint8), "joints": np.zeros((2, 7), np.float32)}
    t = RandomResizedCrop(8)
    out = t(sample, np.random.default_rng(0))
    assert out["cam"].shape == (2, 8, 8, 3) and all(out[k] is sample[k] for k in sample if k != "cam")
    tchw = RandomResizedCrop(8, layout="TCHW")({**sample, "cam": frames.transpose(0, 3, 1, 2)},
                                               np.random.default_rng(0))
    assert np.array_equal(tchw["cam"], out["cam"].transpose(0, 3, 1, 2))
    named = RandomResizedCrop(8, cameras=["overview"])(sample, np.random.default_rng(0))
    assert np.array_equal(named["overview"], out["cam"][0]) and named["cam"] is frames  # the same first draw
    images = torch.from_numpy(np.stack([frames[0], frames[1]]))  # [B, H, W, 3]: named, a window of one frame
    batch = RandomResizedCrop(8, cameras=["overview"]).batch({"overview": images}, torch.Generator().manual_seed(1))
    rng = numpy_rng(torch.Generator().manual_seed(1))
    crop = RandomResizedCrop(8)
    assert batch["overview"].shape == (2, 8, 8, 3) and all(
        np.array_equal(batch["overview"][b].numpy(), crop.apply(frames[b:b + 1], crop.draw_params(rng, H, W))[0])
        for b in range(2))
    with pytest.raises(ValueError, match=r"camera field 'joints' is float32 \(2, 7\), not a uint8 window"):
        RandomShift(2, cameras=["joints"])(sample, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"camera field 'wrist' is not in the sample"):
        RandomShift(2, cameras=["wrist"])(sample, np.random.default_rng(0))


def ks_statistic(draws: np.ndarray, cdf: Any) -> float:
    """Kolmogorov-Smirnov distance between the empirical CDF of `draws` and `cdf`."""
    x = np.sort(draws)
    n = len(x)
    f = cdf(x)
    return float(max((np.arange(1, n + 1) / n - f).max(), (f - np.arange(n) / n).max()))


def uniform_cdf(lo: float, hi: float) -> Any:
    return lambda x: np.clip((x - lo) / (hi - lo), 0.0, 1.0)


def test_draws_follow_their_parameters() -> None:
    """2,000 draws each, KS distance below the 0.001 critical value 1.95 / sqrt(n); the same test
    rejects a wrong range (the premise: it can fail). A 1000 x 1000 frame with scale up to 0.5 fits
    every first try, so the area fraction and log ratio are the raw uniform draws (rounded to pixels)."""
    n, rng = 2000, np.random.default_rng(7)
    critical = 1.95 / math.sqrt(n)
    crop = RandomResizedCrop(8, scale=(0.08, 0.5))
    boxes = [crop.draw_params(rng, 1000, 1000) for _ in range(n)]
    area = np.array([b.height * b.width / 1e6 for b in boxes])
    log_ratio = np.array([math.log(b.width / b.height) for b in boxes])
    assert ks_statistic(area, uniform_cdf(0.08, 0.5)) < critical
    assert ks_statistic(log_ratio, uniform_cdf(math.log(3 / 4), math.log(4 / 3))) < critical
    assert ks_statistic(area, uniform_cdf(0.08, 0.6)) > critical
    tops = np.array([b.top / (1000 - b.height) for b in boxes if b.height < 1000])  # placed uniformly
    assert ks_statistic(tops, uniform_cdf(0.0, 1.0)) < 1.95 / math.sqrt(len(tops)) + 0.01
    jitter = ColorJitter(brightness=0.4, contrast=(0.5, 0.9), saturation=0.2, hue=0.1)
    factors = np.array([list(jitter.draw_params(rng, 4, 4).__dict__.values()) for _ in range(n)])  # [n, 4]
    for column, (lo, hi) in enumerate([(0.6, 1.4), (0.5, 0.9), (0.8, 1.2), (-0.1, 0.1)]):
        assert ks_statistic(factors[:, column], uniform_cdf(lo, hi)) < critical
    shifts = np.array([list(RandomShift(3).draw_params(rng, 8, 8).__dict__.values()) for _ in range(n)])
    counts = np.stack([np.bincount(shifts[:, i] + 3, minlength=7) for i in range(2)])  # [2, 7]
    assert counts.shape == (2, 7) and counts.min() > n / 7 * 0.75  # every offset -3..3, about equally


def test_the_fallback_is_a_centre_crop_at_the_nearest_ratio() -> None:
    """No try fits (area 2-3 times the frame): the whole frame cut to the ratio range, centred."""
    rng = np.random.default_rng(0)
    assert RandomResizedCrop(8, scale=(2, 3), ratio=(1, 1)).draw_params(rng, H, W) == CropBox(0, 8, 48, 48, (8, 8))
    assert RandomResizedCrop(8, scale=(2, 3), ratio=(0.5, 0.5)).draw_params(rng, H, W) == CropBox(0, 20, 48, 24, (8, 8))
    assert RandomResizedCrop(8, scale=(2, 3)).draw_params(rng, H, W) == CropBox(0, 0, 48, 64, (8, 8))
    assert Resize(24).draw_params(rng, H, W) == CropBox(0, 0, 48, 64, (24, 32))  # shorter edge, no draw
    assert Resize(24).draw_params(rng, 64, 48) == CropBox(0, 0, 64, 48, (32, 24))


def test_the_colour_maths() -> None:
    """Each factor alone against its formula (float64 by hand, rounded half up, clipped): brightness
    scales, contrast pulls to the frame's mean luma, saturation 0 is the luma grey, a hue turn keeps
    luma; off factors are the identity and a black (padded) frame stays black."""
    frames = np.random.default_rng(5).integers(0, 256, (2, 6, 5, 3), dtype=np.uint8)
    frames[1] = 0  # a padded frame
    x = frames.astype(np.float64)
    luma = x @ np.array([0.299, 0.587, 0.114])  # [T, H, W]
    mean = luma.mean(axis=(1, 2))[:, None, None, None]  # [T, 1, 1, 1]
    jitter = ColorJitter()

    def by_hand(values: np.ndarray) -> np.ndarray:
        return np.clip(np.floor(values + 0.5), 0, 255)

    def close(factors: JitterFactors, expected: np.ndarray) -> bool:
        return np.abs(jitter.apply(frames, factors).astype(np.float64) - by_hand(expected)).max() <= 1

    assert np.array_equal(jitter({"cam": frames}, np.random.default_rng(0))["cam"], frames)  # all off
    assert close(JitterFactors(1.3, 1, 1, 0), 1.3 * x)
    assert close(JitterFactors(1, 0.6, 1, 0), 0.6 * x + 0.4 * mean)
    assert close(JitterFactors(1, 1, 0.0, 0), np.repeat(luma[..., None], 3, axis=-1))
    turned = jitter.apply(frames, JitterFactors(1, 1, 1, 0.25)).astype(np.float64)
    in_gamut = (turned > 0).all(axis=-1) & (turned < 255).all(axis=-1)  # [T, H, W]: not clipped
    assert in_gamut[0].any() and np.abs(turned @ [0.299, 0.587, 0.114] - luma)[in_gamut].max() <= 1
    assert not jitter.apply(frames, JitterFactors(1.4, 0.6, 1.4, 0.3))[1].any()
    red = np.array([200, 30, 30], np.uint8).reshape(1, 1, 1, 3)
    assert jitter.apply(red, JitterFactors(1, 1, 1, 1 / 12)).ravel().tolist() == [170, 65, 0]  # towards yellow


TRANSFORMS = [RandomResizedCrop((20, 24), scale=(0.1, 1.0)), RandomResizedCrop(12), Resize((40, 20)), Resize(16),
              RandomShift(5), ColorJitter(0.5, 0.5, 0.5, 0.2)]


@pytest.mark.parametrize("t", TRANSFORMS, ids=lambda t: type(t).__name__)
def test_the_torch_batch_path_equals_the_worker_path(t: Any) -> None:
    """`t.batch` on [B, T, H, W, 3] (and [B, T, 3, H, W] with layout='TCHW') draws element b's
    parameters from `generator` as the worker path would from numpy_rng(generator), and applies them
    with the same CPU kernels: the same bytes (ColorJitter: PIL's float32 maths in workers, torch's in
    batches, within one grey level)."""
    frames = np.random.default_rng(3).integers(0, 256, (5, 2, H, W, 3), dtype=np.uint8)  # [B, T, H, W, 3]
    out = t.batch({"cam": torch.from_numpy(frames), "k": ["a"] * 5}, torch.Generator().manual_seed(9))["cam"]
    rng = numpy_rng(torch.Generator().manual_seed(9))
    expected = np.stack([t.apply(f, t.draw_params(rng, H, W)) for f in frames])
    tolerance = 1 if isinstance(t, ColorJitter) else 0
    assert out.dtype == torch.uint8 and np.abs(out.numpy().astype(int) - expected).max() <= tolerance
    tchw = _with_layout(t, "TCHW")
    channels_first = tchw.batch({"cam": torch.from_numpy(frames).permute(0, 1, 4, 2, 3)},
                                torch.Generator().manual_seed(9))["cam"]
    assert channels_first.is_contiguous() and torch.equal(channels_first, out.permute(0, 1, 4, 2, 3))


def _with_layout(t: Any, layout: str) -> Any:
    copy = pickle.loads(pickle.dumps(t))
    copy.layout = layout
    return copy


def test_compose_and_random_choice_in_both_protocols() -> None:
    frames = window(2)
    crop, jitter = RandomResizedCrop(16), ColorJitter(0.3, 0.3)
    both = Compose([crop, jitter])
    rng_a, rng_b = np.random.default_rng(4), np.random.default_rng(4)
    assert np.array_equal(both({"cam": frames}, rng_a)["cam"], jitter(crop({"cam": frames}, rng_b), rng_b)["cam"])
    batch = {"cam": torch.from_numpy(np.stack([frames, frames[::-1]])), "__key__": ["a", "b"]}
    g_a, g_b = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
    assert torch.equal(both.batch(batch, g_a)["cam"], jitter.batch(crop.batch(batch, g_b), g_b)["cam"])
    always_second = RandomChoice([RandomShift(2), crop], p=[0.0, 1.0])
    assert np.array_equal(always_second({"cam": frames}, np.random.default_rng(1))["cam"],
                          crop({"cam": frames}, _after_choice(np.random.default_rng(1)))["cam"])
    pick = RandomChoice([Resize((16, 16)), RandomResizedCrop(16)])
    eight = {"cam": torch.from_numpy(np.stack([frames] * 8)), "__key__": list("abcdefgh"),
             "meta": {"t": torch.arange(8.0), "episode_id": list("ABCDEFGH")}}  # as default_collate makes it
    first, again = (pick.batch(eight, torch.Generator().manual_seed(5)) for _ in range(2))
    assert torch.equal(first["cam"], again["cam"]) and first["__key__"] == eight["__key__"]
    assert torch.equal(first["meta"]["t"], torch.arange(8.0)) and first["meta"]["episode_id"] == list("ABCDEFGH")
    resized = Resize((16, 16))({"cam": frames}, np.random.default_rng(0))["cam"]
    chosen = [torch.equal(first["cam"][i], torch.from_numpy(resized)) for i in range(8)]
    assert 0 < sum(chosen) < 8  # both transforms were drawn, each element got its own
    with pytest.raises(ValueError, match=r"RandomChoice: the transforms give field 'cam' different shapes "
                                         r"\[\(2, 8, 8, 3\), \(2, 16, 16, 3\)\]"):
        RandomChoice([Resize((16, 16)), Resize((8, 8))]).batch(eight, torch.Generator().manual_seed(5))


def _after_choice(rng: np.random.Generator) -> np.random.Generator:
    rng.choice(2, p=[0.0, 1.0])
    return rng


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="layout must be 'THWC'"):
        RandomShift(2, layout="HWC")
    with pytest.raises(ValueError, match=r"scale must be a pair \(lo, hi\) with 0 < lo <= hi"):
        RandomResizedCrop(8, scale=(0.5, 0.1))
    with pytest.raises(ValueError, match=r"hue must be in \[0, 0.5\]"):
        ColorJitter(hue=0.7)
    with pytest.raises(ValueError, match="pad must be an int >= 0"):
        RandomShift(-1)
    with pytest.raises(ValueError, match="p must give one probability >= 0 per transform"):
        RandomChoice([RandomShift(1)], p=[0.5])


# -- through the reader: real export, real DataLoader workers ----------------------------------------

AUGMENT = Compose([RandomResizedCrop(24, scale=(0.3, 1.0)), RandomShift(2), ColorJitter(0.3, 0.3, 0.3, 0.05)])


@pytest.fixture(scope="module")
def camera(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1 synthetic episode with a 10 fps 32x32 noise camera (`cam`, a 10-frame jpg window), stride 4."""
    root = tmp_path_factory.mktemp("augment")
    store = root / "store"
    write_synthetic_store(store, episodes=1, seed=0)
    frames = np.random.default_rng(0).integers(0, 256, (40, 32, 32, 3), dtype=np.uint8)  # [F, H, W, 3]
    write_frames(store / "media" / "cam" / "ep_0000.mp4", frames, codec="mpeg4")
    video = pa.array([{"path": "media/cam/ep_0000.mp4", "fps": 10.0, "start_s": 0.0, "end_s": 4.0}])
    pq.write_table(pa.table({"episode_id": ["ep_0000"], "cam": video}), store / "videos.parquet")
    assert main(["export", str(store), str(root / "out"), "--quiet", "--workers", "1", "--stride", "4",
                 "--set", "shard.max_samples=4", "--set", "shard.min_shards=1"]) == 0
    return root / "out"


def _cams(samples: Any) -> dict[str, bytes]:
    return {s["__key__"]: np.asarray(s["cam"]).tobytes() for s in samples}


@pytest.fixture(scope="module")
def reference(camera: Path) -> dict[str, bytes]:
    return _cams(ShardDataset(camera, "train", seed=3, transform=AUGMENT))


def test_workers_give_identical_bytes_per_key(camera: Path, reference: dict[str, bytes]) -> None:
    plain = _cams(ShardDataset(camera, "train", seed=3))
    assert len(reference) >= 8 and reference.keys() == plain.keys()
    assert all(len(v) == 10 * 24 * 24 * 3 for v in reference.values()) and plain != reference  # augmented
    for workers in (1, 2):
        loader = DataLoader(ShardDataset(camera, "train", seed=3, transform=AUGMENT), batch_size=None,
                            num_workers=workers)
        assert _cams(loader) == reference
    other_epoch = ShardDataset(camera, "train", seed=3, transform=AUGMENT)
    other_epoch.set_epoch(1)
    assert _cams(other_epoch).keys() == reference.keys() and _cams(other_epoch) != reference  # new draws


def test_a_resumed_loader_augments_the_rest_byte_identically(camera: Path) -> None:
    def loader() -> ShardLoader:
        return ShardLoader(ShardDataset(camera, "train", seed=3, transform=AUGMENT), 2, num_workers=2)

    full = [(b["__key__"], b["cam"].numpy().tobytes()) for b in loader()]
    first = loader()
    it = iter(first)
    head = [(b["__key__"], b["cam"].numpy().tobytes()) for b in (next(it), next(it))]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + [(b["__key__"], b["cam"].numpy().tobytes()) for b in resumed] == full


def test_pickled_transforms_run_in_a_spawned_worker_and_import_no_torch(camera: Path,
                                                                       reference: dict[str, bytes]) -> None:
    """One spawned worker: it unpickles the transforms in a fresh interpreter (what spawn adds over
    fork, whose 1 and 2 workers the test above reads through); each spawned worker costs a torch
    import (~4 s on the 2-core CI machine), so a second one would double the test for nothing new."""
    restored = pickle.loads(pickle.dumps(AUGMENT))
    assert repr(restored) == repr(AUGMENT)
    loader = DataLoader(ShardDataset(camera, "train", seed=3, transform=restored), batch_size=None, num_workers=1,
                        multiprocessing_context="spawn")
    assert _cams(loader) == reference
    code = ("import sys\n"
            "import robowds.reader.transforms as t\n"
            "import robowds.reader.transforms.geometry, robowds.reader.transforms.color, "
            "robowds.reader.transforms.compose\n"
            "c = t.Compose([t.RandomResizedCrop(8), t.RandomShift(2), t.Resize(8), t.ColorJitter(0.1), "
            "t.RandomChoice([t.RandomShift(1)])])\n"
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
