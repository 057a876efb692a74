"""`robowds convert hdf5` on files built from the REAL vendored G1 data (scripts/hdf5_from_g1.py): robomimic,
ALOHA (raw frames, padded JPEG rows with /compress_len, variable-length JPEG bytes) and the docs' mapping.
Exported windows equal the h5py arrays at the grid times; FFV1 frames equal the arrays; MJPEG frames equal
PyAV's decode of the source JPEG bytes (and the packets are those bytes); the store does not depend on the
worker count; bad inputs are one message each."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import av
import h5py
import numpy as np
import pytest

from robowds.export.cli.main import main
from robowds.export.convert.hdf5 import convert_hdf5
from robowds.export.store.validate import validate_store

from exports import export_members, npy
from realdata import G1, real_path
from videos import decode_all, to_rgb

ROOT = Path(__file__).resolve().parents[1]
STEPS = 30  # per episode (the script decodes this many G1 frames per demo)


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hdf5_from_g1", ROOT / "scripts" / "hdf5_from_g1.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _script().write_all(tmp_path_factory.mktemp("hdf5"), STEPS, real_path(G1))


def _convert(src: Path, store: Path, *options: str) -> Path:
    assert main(["convert", "hdf5", str(src), str(store), "--quiet", "--workers", "1", *options]) == 0
    return store


def _export(store: Path, out: Path, rate: float, steps: int, *options: str) -> dict[str, dict[str, bytes]]:
    """Windows of `steps` steps at `rate`, one anchor per grid point, in episode order."""
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--keep-order", "--fps", f"{rate:g}",
                 "--set", f"window.duration_s={steps / rate!r}", "--set", f"window.rate_hz={rate:g}",
                 "--set", "shard.min_shards=1", *options]) == 0
    return export_members(out)


def _assert_windows(samples: dict[str, dict[str, bytes]], episode: str, field: str, source: np.ndarray,
                    steps: int) -> None:
    """Window k, step j is source step k + j (masked off past the end), for every anchor k."""
    length = len(source)
    flat = source.reshape(length, -1)  # [T, N]
    assert f"{episode}_{length:06d}" not in samples  # one window per step, none more
    for k in range(length):
        sample = samples[f"{episode}_{k:06d}"]
        values, mask = npy(sample[f"{field}.npy"]), npy(sample[f"{field}_mask.npy"])
        real = min(steps, length - k)
        assert mask.tolist() == [True] * real + [False] * (steps - real), (episode, field, k)
        np.testing.assert_array_equal(values[:real].reshape(real, -1), flat[k:k + real].astype(values.dtype),
                                      err_msg=f"{episode} {field} window {k}")
        assert values.dtype == (np.float64 if source.dtype.kind == "f" else source.dtype)


def _jpeg_decode(jpegs: list[bytes]) -> np.ndarray:
    """Source JPEG files decoded by PyAV's mjpeg decoder (the one the export uses), as rgb24 [T, H, W, 3]."""
    codec = av.CodecContext.create("mjpeg", "r")
    frames = [frame for data in jpegs for frame in codec.decode(av.Packet(data))]
    return to_rgb(frames)


def _packets(path: Path) -> list[bytes]:
    with av.open(str(path)) as container:
        return [bytes(p) for p in container.demux(video=0) if p.size]


def test_robomimic_windows_equal_the_h5py_arrays_and_masks_become_splits(files: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    store = _convert(files["robomimic"], tmp_path / "store")
    report = json.loads((store / "convert_report.json").read_text())
    assert (report["layout"], report["rate_hz"], report["episodes"], report["masks"]) == \
        ("robomimic", 30.0, 3, {"train": 2, "valid": 1})
    assert sorted(report["fields"]) == ["actions", "agentview_image", "dones", "joint_pos", "rewards", "split", "states"]
    assert validate_store(store).exportable
    samples = _export(store, tmp_path / "out", 30, 4, "--set", "float_dtype=float64",
                      "--set", "exclude=[agentview_image]")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["report"]["splits"] == {"train": {"episodes": 2, "windows": 60},
                                            "valid": {"episodes": 1, "windows": 30}}
    with h5py.File(files["robomimic"], "r") as f:
        for demo in ("demo_0", "demo_1", "demo_2"):
            g = f[f"data/{demo}"]
            for field, path in [("joint_pos", "obs/joint_pos"), ("actions", "actions"), ("states", "states"),
                                ("rewards", "rewards"), ("dones", "dones")]:
                _assert_windows(samples, demo, field, g[path][()], 4)
            assert json.loads(samples[f"{demo}_000000"]["meta.json"])["split"] == ("valid" if demo == "demo_1" else "train")


def test_robomimic_ffv1_frames_equal_the_h5py_arrays(files: dict[str, Path], tmp_path: Path) -> None:
    store = _convert(files["robomimic"], tmp_path / "store")
    samples = _export(store, tmp_path / "out", 30, 1, "--set", "include=[agentview_image]",
                      "--set", "streams.agentview_image.encoding=raw")
    with h5py.File(files["robomimic"], "r") as f:
        for demo in ("demo_0", "demo_1", "demo_2"):
            frames = f[f"data/{demo}/obs/agentview_image"][()]  # [T, 48, 64, 3]
            np.testing.assert_array_equal(decode_all(store / "media" / "agentview_image" / f"{demo}.mkv"), frames)
            for k in range(len(frames)):
                np.testing.assert_array_equal(npy(samples[f"{demo}_{k:06d}"]["agentview_image.npy"])[0], frames[k])


def _aloha_jpegs(path: Path, cam: str) -> list[bytes]:
    """The camera's JPEG files as ALOHA's recorder wrote them: padded rows cut at compress_len (rows in
    the recorder's camera order, cam_low then cam_high), or variable-length bytes."""
    with h5py.File(path, "r") as f:
        data = f[f"observations/images/{cam}"][()]
        if data.dtype == object:
            return [bytes(x) for x in data]
        row = ("cam_low", "cam_high").index(cam)
        return [bytes(r[:n]) for r, n in zip(data, f["compress_len"][row])]


@pytest.mark.parametrize("variant", ["aloha_raw", "aloha_jpeg", "aloha_vlen"])
def test_aloha_windows_and_frames_equal_the_source(files: dict[str, Path], tmp_path: Path, variant: str) -> None:
    store = _convert(files[variant], tmp_path / "store")
    report = json.loads((store / "convert_report.json").read_text())
    assert (report["layout"], report["rate_hz"], report["rate_source"]) == ("aloha", 50.0, "ALOHA DT = 0.02 s")
    assert sorted(report["fields"]) == ["action", "cam_high", "cam_low", "qpos", "qvel"]
    schema = validate_store(store).schema
    assert schema.fields["qpos"].names[:2] == ("waist_left", "shoulder_left")
    samples = _export(store, tmp_path / "out", 50, 3, "--set", "float_dtype=float64",
                      "--set", "streams.cam_high.encoding=raw", "--set", "streams.cam_low.encoding=raw",
                      "--set", "streams.cam_high.duration_s=0.02", "--set", "streams.cam_low.duration_s=0.02")
    for path in sorted(files[variant].glob("*.hdf5")):
        episode = path.stem
        with h5py.File(path, "r") as f:
            for field, dataset in [("qpos", "observations/qpos"), ("qvel", "observations/qvel"), ("action", "action")]:
                _assert_windows(samples, episode, field, f[dataset][()], 3)
            raw = {cam: f[f"observations/images/{cam}"][()] for cam in ("cam_high", "cam_low")}
        for cam in ("cam_high", "cam_low"):
            video = store / "media" / cam / f"{episode}.mkv"
            if variant == "aloha_raw":
                expected = raw[cam]  # FFV1: the arrays themselves
            else:
                jpegs = _aloha_jpegs(path, cam)
                assert _packets(video) == jpegs  # muxed byte for byte
                expected = _jpeg_decode(jpegs)
            assert expected.shape == (STEPS, 48, 64, 3)
            for k in range(STEPS):
                np.testing.assert_array_equal(npy(samples[f"{episode}_{k:06d}"][f"{cam}.npy"])[0], expected[k],
                                              err_msg=f"{variant} {episode} {cam} frame {k}")


def _docs_mapping() -> str:
    text = (ROOT / "docs" / "convert-hdf5.md").read_text()
    section = text[text.index("## Any other layout: a YAML mapping"):]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def test_the_docs_mapping_converts_the_custom_layout(files: dict[str, Path], tmp_path: Path) -> None:
    mapping = tmp_path / "g1_mapping.yaml"
    mapping.write_text(_docs_mapping())
    store = _convert(files["custom"], tmp_path / "store", "--mapping", str(mapping))
    report = json.loads((store / "convert_report.json").read_text())
    assert (report["layout"], report["episodes"], report["rate_hz"]) == ("mapping", 2, None)
    assert sorted(report["fields"]) == ["action", "cam_high", "observation_state", "task"]
    samples = _export(store, tmp_path / "out", 30, 2, "--set", "float_dtype=float64", "--set", "streams.cam_high.encoding=raw",
                      "--set", "streams.cam_high.duration_s=0.03333333333333333")
    with h5py.File(files["custom"], "r") as f:
        for i in range(2):
            g, episode = f[f"episodes/ep_{i}"], f"episodes_ep_{i}"
            np.testing.assert_array_equal(g["timestamps"][()], np.arange(STEPS) / 30)
            _assert_windows(samples, episode, "observation_state", g["joints/position"][()], 2)
            _assert_windows(samples, episode, "action", g["joints/command"][()], 2)
            frames = g["camera/front"][()]
            for k in range(STEPS):
                sample = samples[f"{episode}_{k:06d}"]
                np.testing.assert_array_equal(npy(sample["cam_high.npy"])[0], frames[k])
                assert sample["task.txt"] == g.attrs["instruction"].encode()


def test_a_mapping_reads_padded_jpeg_rows_without_compress_len(files: dict[str, Path], tmp_path: Path) -> None:
    """The ALOHA JPEG files through a mapping: each file one episode (episodes: /), `kind: video` on the padded
    rows, which are then cut after their last end-of-image marker: the same JPEG files, byte for byte."""
    mapping = tmp_path / "rows.yaml"
    mapping.write_text("rate_hz: 50\nfields:\n  qpos: observations/qpos\n"
                       "  cam_high: {path: observations/images/cam_high, kind: video}\n")
    store = _convert(files["aloha_jpeg"], tmp_path / "store", "--mapping", str(mapping))
    report = json.loads((store / "convert_report.json").read_text())
    assert (report["episodes"], report["rate_hz"], report["fields"]["cam_high"]["kind"]) == (2, 50.0, "video")
    for path in sorted(files["aloha_jpeg"].glob("*.hdf5")):
        assert _packets(store / "media" / "cam_high" / f"{path.stem}.mkv") == _aloha_jpegs(path, "cam_high")


def _store_bytes(store: Path) -> dict[str, bytes]:
    return {p.relative_to(store).as_posix(): p.read_bytes() for p in sorted(store.rglob("*"))
            if p.is_file() and p.name != "convert_report.json"}


@pytest.mark.parametrize("variant", ["robomimic", "aloha_jpeg"])
def test_the_store_is_byte_identical_for_1_and_2_workers(files: dict[str, Path], tmp_path: Path, variant: str) -> None:
    one = _convert(files[variant], tmp_path / "one")
    assert convert_hdf5(files[variant], tmp_path / "two", workers=2)["episodes"] == (3 if variant == "robomimic" else 2)
    a, b = _store_bytes(one), _store_bytes(tmp_path / "two")
    assert sorted(a) == sorted(b) and "episodes.parquet" in a and any(k.endswith(".mkv") for k in a)
    assert a == b


# ---- bad inputs: one message each, exit 2, no traceback, no store --------------------------------------------

def _not_hdf5(files: dict[str, Path], tmp: Path) -> tuple[Path, list[str]]:
    path = tmp / "notes.hdf5"
    path.write_text("this is not HDF5\n")
    return path, []


def _unknown_layout(files: dict[str, Path], tmp: Path) -> tuple[Path, list[str]]:
    path = tmp / "other.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("sensors/imu", data=np.zeros((5, 6), np.float32))
    return path, []


def _missing_rate(files: dict[str, Path], tmp: Path) -> tuple[Path, list[str]]:
    script = sys.modules.get("hdf5_from_g1") or _script()
    with h5py.File(files["robomimic"], "r") as f:
        g = f["data/demo_0"]
        steps = script.G1Steps("x", g["obs/joint_pos"][()], g["actions"][()], g["obs/agentview_image"][()],
                               g["obs/agentview_image"][()])
    return script.write_robomimic(tmp / "norate.hdf5", {"demo_0": steps}, control_freq=None), []


def _mapping_missing_dataset(files: dict[str, Path], tmp: Path) -> tuple[Path, list[str]]:
    mapping = tmp / "m.yaml"
    mapping.write_text(_docs_mapping().replace("joints/position", "joints/positions"))
    return files["custom"], ["--mapping", str(mapping)]


def _different_lengths(files: dict[str, Path], tmp: Path) -> tuple[Path, list[str]]:
    path = tmp / "short.hdf5"
    path.write_bytes(files["robomimic"].read_bytes())
    with h5py.File(path, "a") as f:
        actions = f["data/demo_1/actions"][()]
        del f["data/demo_1/actions"]
        f.create_dataset("data/demo_1/actions", data=actions[:-1])
    return path, []


def _depth_obs(files: dict[str, Path], tmp: Path) -> tuple[Path, list[str]]:
    path = tmp / "depth.hdf5"
    path.write_bytes(files["robomimic"].read_bytes())
    with h5py.File(path, "a") as f:
        for demo in f["data"]:
            f.create_dataset(f"data/{demo}/obs/agentview_depth", data=np.zeros((STEPS, 48, 64, 1), np.float32))
    return path, []


@pytest.mark.parametrize("make,message", [
    (_not_hdf5, "notes.hdf5 is not an HDF5 file"),
    (_unknown_layout, "other.h5: unknown HDF5 layout: neither robomimic"),
    (_missing_rate, "norate.hdf5: no control rate: data.attrs['env_args'] has no env_kwargs.control_freq"),
    (_mapping_missing_dataset, "the mapping's field 'observation_state' names dataset 'joints/positions', which does not exist"),
    (_different_lengths, "short.hdf5 (demo demo_1): datasets of different lengths in one episode: actions 29"),
    (_depth_obs, "depth.hdf5 (demo demo_0): dataset 'obs/agentview_depth' (float32 [30, 48, 64, 1]) is neither"),
])
def test_bad_inputs_are_one_clear_error(files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        make, message: str) -> None:
    src, options = make(files, tmp_path)
    assert main(["convert", "hdf5", str(src), str(tmp_path / "store"), "--quiet", "--workers", "1", *options]) == 2
    err = capsys.readouterr().err
    assert err.startswith("robowds convert: error: ") and message in err, err
    assert "fix: " in err and "Traceback" not in err and err.count("error:") == 1
    assert not (tmp_path / "store").exists()


def test_skip_bad_leaves_the_bad_demo_out_and_lists_it(files: dict[str, Path], tmp_path: Path) -> None:
    src, _ = _different_lengths(files, tmp_path)
    store = _convert(src, tmp_path / "store", "--skip-bad")
    report = json.loads((store / "convert_report.json").read_text())
    assert report["episodes"] == 2
    assert [s["episode"] for s in report["skipped"]] == [f"{src} (demo demo_1)"]
    assert "datasets of different lengths" in report["skipped"][0]["reason"]


@pytest.mark.parametrize("make,fix,check", [
    (_missing_rate, ["--fps", "20"], lambda r: (r["rate_hz"], r["rate_source"]) == (20.0, "--fps")),
    (_depth_obs, ["--exclude", "agentview_depth"], lambda r: "agentview_depth" not in r["fields"]),
])
def test_the_fix_each_message_names_works(files: dict[str, Path], tmp_path: Path, make, fix, check) -> None:
    src, _ = make(files, tmp_path)
    report = json.loads((_convert(src, tmp_path / "store", *fix) / "convert_report.json").read_text())
    assert check(report) and validate_store(tmp_path / "store").exportable
