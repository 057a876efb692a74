"""Per-episode images (`streams.<image>: {encoding: original | png | jpg, resize, crop}`) through the
real export job: bytes, pixels, shapes, determinism, schema and errors, read back from real shards."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.reader.decode import decode_image
from robowds.reader.format import group_samples, iter_members
from robowds.reader.manifest import parse_manifest, shards_of


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("images") / "store"
    write_synthetic_store(root, episodes=2, seed=3)  # one 96x72 PNG per episode under media/overview/
    return root


def _export(store: Path, out: Path, *sets: str, workers: str = "1") -> int:
    args = ["export", str(store), str(out), "--quiet", "--workers", workers, "--stride", "20",
            "--set", "include=[joints, overview]"]
    for item in sets:
        args += ["--set", item]
    return main(args)


def _members(out: Path) -> dict[str, dict[str, bytes]]:
    """Raw member bytes of every sample, by key (no decoding)."""
    manifest = parse_manifest((out / "manifest.json").read_bytes())
    samples = {}
    for shard in shards_of(manifest, "train"):
        data = (out / shard.path).read_bytes()
        for key, _, members in group_samples(iter_members(data, shard.path), shard.path):
            samples[key] = {name: bytes(blob) for name, blob in members.items()}
    return samples


def _source(store: Path, episode: str) -> np.ndarray:
    with Image.open(store / "media" / "overview" / f"{episode}.png") as img:
        return np.asarray(img.convert("RGB"))  # [72, 96, 3]


def _tree(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_original_bytes_are_the_stored_file(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _export(store, out) == 0
    samples = _members(out)
    assert len(samples) > 2
    for key, members in samples.items():
        episode = key.rsplit("_", 1)[0]
        assert members["overview.png"] == (store / "media" / "overview" / f"{episode}.png").read_bytes()
    schema = json.loads((out / "manifest.json").read_text())["schema"]["overview"]
    assert schema == {"dtype": "uint8", "encoding": "original", "kind": "image", "member": "overview.<png|jpg|webp|bmp>"}


def test_png_is_lossless_and_deterministic_across_workers(store: Path, tmp_path: Path) -> None:
    trees = []
    for workers in ("1", "2"):
        out = tmp_path / f"png{workers}"
        assert _export(store, out, "streams.overview.encoding=png", workers=workers) == 0
        trees.append(_tree(out))
    assert trees[0] == trees[1]
    out = tmp_path / "png1"
    samples = _members(out)
    for key, members in samples.items():
        assert set(members) == {"joints.npy", "joints_mask.npy", "meta.json", "overview.png"}
        np.testing.assert_array_equal(decode_image(members["overview.png"]), _source(store, key.rsplit("_", 1)[0]))
    by_episode = {}
    for key, members in samples.items():  # encoded once per episode: every window carries the same bytes
        by_episode.setdefault(key.rsplit("_", 1)[0], set()).add(members["overview.png"])
    assert all(len(blobs) == 1 for blobs in by_episode.values())
    schema = json.loads((out / "manifest.json").read_text())["schema"]["overview"]
    assert schema == {"codec": "png", "dtype": "uint8", "encoding": "png", "kind": "image", "layout": "HWC",
                      "member": "overview.png", "shape": [None, None, 3]}
    assert main(["verify", str(out), "--store", str(store), "--quiet"]) == 0


def test_jpg_psnr_and_determinism(store: Path, tmp_path: Path) -> None:
    from robowds.export.media.clips import psnr

    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        assert _export(store, out, "streams.overview.encoding=jpg") == 0
    assert _tree(first) == _tree(second)
    for key, members in _members(first).items():
        assert members["overview.jpg"][:3] == b"\xff\xd8\xff" and "overview.png" not in members
        decoded = decode_image(members["overview.jpg"])  # [72, 96, 3]
        assert decoded.shape == (72, 96, 3) and psnr(decoded, _source(store, key.rsplit("_", 1)[0])) > 30
    assert json.loads((first / "manifest.json").read_text())["schema"]["overview"]["codec"] == "jpeg"


def test_resize_and_crop_shapes_and_pixels(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "resize"
    assert _export(store, out, "streams.overview.encoding=png", "streams.overview.resize=[32, 24]") == 0
    sample = next(iter(_members(out).values()))
    assert decode_image(sample["overview.png"]).shape == (24, 32, 3)
    assert json.loads((out / "manifest.json").read_text())["schema"]["overview"]["shape"] == [24, 32, 3]
    out = tmp_path / "crop"
    assert _export(store, out, "streams.overview.encoding=png", "streams.overview.crop=[40, 30]") == 0
    for key, members in _members(out).items():  # 96x72 -> columns 28..67, rows 21..50
        np.testing.assert_array_equal(decode_image(members["overview.png"]),
                                      _source(store, key.rsplit("_", 1)[0])[21:51, 28:68])
    out = tmp_path / "center"
    assert _export(store, out, "streams.overview.encoding=png", "streams.overview.crop=center",
                   "streams.overview.resize=[16, 16]") == 0
    for key, members in _members(out).items():  # 96x72 -> the centred 72x72 square, then Pillow bilinear
        square = Image.fromarray(np.ascontiguousarray(_source(store, key.rsplit("_", 1)[0])[:, 12:84]))
        expected = np.asarray(square.resize((16, 16), Image.Resampling.BILINEAR))
        np.testing.assert_array_equal(decode_image(members["overview.png"]), expected)
    config = json.loads((out / "manifest.json").read_text())["config"]["images"]["overview"]
    assert config == {"crop": "center", "encoding": "png", "resize": [16, 16]}


def test_image_config_and_crop_errors(store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _export(store, tmp_path / "o1", "streams.overview.resize=[32, 24]") == 2
    err = capsys.readouterr().err
    assert "config streams.overview sets resize/crop with encoding original" in err
    assert "set streams.overview.encoding to png (lossless) or jpg" in err
    assert _export(store, tmp_path / "o2", "streams.overview.encoding=mp4") == 2
    assert "config streams.overview.encoding is 'mp4', but 'overview' is an image field" in capsys.readouterr().err
    assert _export(store, tmp_path / "o3", "streams.overview.rate_hz=5") == 2
    assert "config streams.overview sets ['rate_hz'], but 'overview' is an image" in capsys.readouterr().err
    assert _export(store, tmp_path / "o4", "streams.overview.encoding=jpg", "streams.overview.crop=[100, 10]") == 2
    err = capsys.readouterr().err
    assert ("episode 'ep_0000', field 'overview': image 'media/overview/ep_0000.png': crop [100, 10] is larger "
            "than the 96x72 source picture") in err and "Traceback" not in err
    assert _export(store, tmp_path / "o5", "streams.overview.encoding=png", "streams.overview.crop=center") == 2
    assert 'config streams.overview.crop is "center" but streams.overview.resize is not set' in capsys.readouterr().err


def test_undecodable_image_is_an_episode_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    write_synthetic_store(root, episodes=1, seed=0)
    path = root / "media" / "overview" / "ep_0000.png"
    path.write_bytes(path.read_bytes()[:60])  # PNG magic kept, data truncated
    assert _export(root, tmp_path / "out", "streams.overview.encoding=png") == 2
    err = capsys.readouterr().err
    assert "episode 'ep_0000', field 'overview': image 'media/overview/ep_0000.png' cannot be decoded" in err
