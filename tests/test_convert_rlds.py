"""`robowds convert rlds` on the vendored real Bridge data (Octo's debug TFRecord, 25 episodes x 10 steps,
4 JPEG cameras): exported windows equal the records parsed with protobuf (the `tfrecord` package's
generated `example_pb2`, not the converter's descriptor) at the grid times, camera frames equal PyAV's
decodes of the source JPEG bytes, the store is the same bytes for 1 and 2 workers, and bad inputs (a
flipped byte, a cut file, no features.json, no records, an unmappable feature) are one message each."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import shutil
import struct
from functools import lru_cache
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from robowds.export.cli.main import main
from robowds.export.store.validate import validate_store

from exports import export_members, npy
from realdata import real_path
from videos import to_rgb

BRIDGE = "rlds_bridge_octo_debug"
SHARD = "bridge_dataset-train.tfrecord-00000-of-00001"
CAMERAS = [f"observation_image_{c}" for c in range(4)]
SERIES = ["action", "observation_state", "reward", "discount", "language_embedding", "is_first", "is_last",
          "is_terminal"]
STEPS = 10  # every Bridge debug episode
EPISODES = 25
LIGHT = ("--exclude", "language_embedding", *[a for c in CAMERAS[1:] for a in ("--exclude", c)])  # faster


def bridge(*parts: str) -> Path:
    """A path in the vendored Bridge copy (the dataset folder above `bridge_dataset/1.0.0` when no parts)."""
    return real_path(BRIDGE, *parts)


def version_dir() -> Path:
    return bridge("bridge_dataset", "1.0.0")


@lru_cache(maxsize=1)
def example_pb2() -> Any:
    """The `tfrecord` package's protoc-generated `example_pb2`, loaded from its file: `import tfrecord`
    would import torch, and the module has no dependency on the rest of the package."""
    spec = importlib.util.find_spec("tfrecord")
    assert spec is not None and spec.submodule_search_locations, "pip install tfrecord (a test dependency)"
    path = Path(spec.submodule_search_locations[0]) / "example_pb2.py"
    module_spec = importlib.util.spec_from_file_location("tfrecord_example_pb2_for_tests", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def source_payloads(path: Path) -> list[bytes]:
    """The record payloads of a TFRecord file, framing read here with struct (independent of the converter)."""
    data, out, offset = path.read_bytes(), [], 0
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        out.append(data[offset + 12: offset + 12 + length])
        offset += 16 + length
    return out


def source_examples(path: Path) -> list[Any]:
    examples = []
    for payload in source_payloads(path):
        example = example_pb2().Example()
        example.ParseFromString(payload)
        examples.append(example)
    return examples


def feature(example: Any, key: str) -> Any:
    f = example.features.feature[key]
    return getattr(f, f.WhichOneof("kind")).value


def decode_jpeg(data: bytes) -> np.ndarray:
    """One JPEG through PyAV's mjpeg decoder (the decoder the export uses), as rgb24 [H, W, 3]."""
    codec = av.CodecContext.create("mjpeg", "r")
    return to_rgb(codec.decode(av.Packet(data)))[0]


def convert(src: Path, store: Path, *options: str) -> int:
    """`robowds convert rlds SRC STORE --quiet --workers 1 OPTIONS` in-process; the exit code."""
    return main(["convert", "rlds", str(src), str(store), "--quiet", "--workers", "1", *options])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rlds")
    assert convert(bridge(), root / "store") == 0
    return root / "store"


def test_vendored_bridge_is_the_upstream_bytes_and_nothing_else() -> None:
    listed = dict(line.split("  ", 1)[::-1] for line in bridge("SHA256SUMS").read_text().splitlines())
    assert set(listed) == {"LICENSE.octo", f"bridge_dataset/1.0.0/{SHARD}", "bridge_dataset/1.0.0/features.json",
                           "bridge_dataset/1.0.0/dataset_info.json"}
    for name, digest in listed.items():
        assert hashlib.sha256(bridge(name).read_bytes()).hexdigest() == digest, name
    present = {p.relative_to(bridge()).as_posix() for p in bridge().rglob("*") if p.is_file()}
    assert present == set(listed) | {"SHA256SUMS", "PROVENANCE.md"}


def test_the_report_lists_the_mapping(store: Path) -> None:
    report = json.loads((store / "convert_report.json").read_text())
    assert (report["format"], report["dataset"], report["version"], report["splits"]) == \
        ("rlds", "bridge_dataset", "1.0.0", ["train"])
    assert (report["episodes"], report["fps"], report["fps_source"], report["skipped"]) == \
        (EPISODES, 5.0, "known rate of bridge_dataset", [])
    fields = report["fields"]
    assert fields["observation_state"] == {"source": "steps/observation/state", "kind": "timeseries",
                                           "dtype": "float32"}
    assert fields["is_first"]["dtype"] == "bool" and fields["episode_episode_id"]["dtype"] == "int32"
    assert fields["language_instruction"] == {"source": "steps/language_instruction", "kind": "text", "dtype": "str"}
    assert fields["episode_file_path"]["kind"] == "text" and fields["episode_has_image_3"]["kind"] == "value"
    assert {k for k, v in fields.items() if v["kind"] == "video"} == set(CAMERAS)
    assert len(fields) == 20
    assert sorted(p.name for p in (store / "media" / "observation_image_3").iterdir()) == \
        [f"train_00000_{i:06d}.mkv" for i in range(EPISODES)]  # the black camera is kept
    report = validate_store(store)
    assert report.exportable, report.render()


def test_step_windows_equal_the_protobuf_values_at_the_grid_times(store: Path, tmp_path: Path) -> None:
    """Windows of 2 steps at 5 Hz from every anchor: step k and k+1 of the record; the last anchor's
    second step is past the episode (padded, mask false)."""
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--fps", "5", "--keep-order",
                 "--set", f"exclude=[{', '.join(CAMERAS)}]", "--set", "window.duration_s=0.4",
                 "--set", "window.rate_hz=5", "--set", "shard.min_shards=1"]) == 0
    samples = export_members(out)
    assert len(samples) == EPISODES * STEPS
    widths = {"action": 7, "observation_state": 7, "reward": 1, "discount": 1, "language_embedding": 512,
              "is_first": 1, "is_last": 1, "is_terminal": 1}
    keys = {name: f"steps/{name.replace('observation_', 'observation/')}" for name in widths}
    for i, example in enumerate(source_examples(version_dir() / SHARD)):
        episode = f"train_00000_{i:06d}"
        for name, width in widths.items():
            raw = feature(example, keys[name])
            dtype = np.float32 if name not in ("is_first", "is_last", "is_terminal") else np.int64
            source = np.array(raw, dtype=dtype).reshape(STEPS, width)  # [T, N]
            if dtype == np.int64:
                source = source != 0
            for k in range(STEPS):
                sample = samples[f"{episode}_{k:06d}"]
                window, mask = npy(sample[f"{name}.npy"]), npy(sample[f"{name}_mask.npy"])
                assert window.dtype == source.dtype, name
                np.testing.assert_array_equal(window[0], source[k], err_msg=f"{episode} {name} step {k}")
                if k + 1 < STEPS:
                    np.testing.assert_array_equal(window[1], source[k + 1])
                assert mask.tolist() == [True, k + 1 < STEPS]
        sample = samples[f"{episode}_000003"]
        instruction = feature(example, "steps/language_instruction")
        assert len(set(instruction)) == 1 and sample["language_instruction.txt"] == instruction[0]
        assert sample["episode_file_path.txt"] == feature(example, "episode_metadata/file_path")[0]
        episode_id = npy(sample["episode_episode_id.npy"])
        assert episode_id.dtype == np.int32 and episode_id == feature(example, "episode_metadata/episode_id")[0]
        assert not npy(sample["episode_has_image_0.npy"])  # the source's (wrong) flag, as it is
    assert main(["verify", str(out), "--store", str(store), "--quiet"]) == 0


def test_camera_frames_are_the_source_jpegs_decoded_bit_exact(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    raw = [arg for cam in CAMERAS for arg in ("--set", f"streams.{cam}.encoding=raw")]
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--fps", "5", "--keep-order",
                 "--set", f"exclude=[{', '.join(SERIES)}]", "--set", "window.duration_s=0.2",
                 "--set", "window.rate_hz=5", "--set", "shard.min_shards=1", *raw]) == 0
    samples = export_members(out)
    black = []
    for i, example in enumerate(source_examples(version_dir() / SHARD)):
        for c, cam in enumerate(CAMERAS):
            jpegs = feature(example, f"steps/observation/image_{c}")
            for k in range(STEPS):
                frame = npy(samples[f"train_00000_{i:06d}_{k:06d}"][f"{cam}.npy"])[0]  # [64, 64, 3]
                np.testing.assert_array_equal(frame, decode_jpeg(jpegs[k]), err_msg=f"record {i} {cam} step {k}")
                if c == 3:
                    black.append(int(frame.max()))
    assert max(black) <= 2  # image_3 is the all-black padding camera (JPEG noise at most), kept as it is


def test_the_store_is_the_same_bytes_for_one_and_two_workers(store: Path, tmp_path: Path) -> None:
    assert main(["convert", "rlds", str(bridge()), str(tmp_path / "two"), "--quiet", "--workers", "2"]) == 0
    two = tmp_path / "two"
    assert (two / "episodes.parquet").read_bytes() == (store / "episodes.parquet").read_bytes()
    media = sorted(p.relative_to(store).as_posix() for p in (store / "media").rglob("*") if p.is_file())
    assert len(media) == 4 * EPISODES
    assert media == sorted(p.relative_to(two).as_posix() for p in (two / "media").rglob("*") if p.is_file())
    for name in media:
        assert (two / name).read_bytes() == (store / name).read_bytes(), name
    assert (two / "store.yaml").read_text() == (store / "store.yaml").read_text()


# ---- bad inputs: one message (file + record + fix), exit 2, no traceback, no store ----------------------

def copy_dataset(tmp_path: Path, records: list[bytes] | None = None, features: dict | None = None,
                 info: dict | None = None) -> Path:
    """A copy of the Bridge version folder; `records` replace the train shard's records (framed as
    TensorFlow frames them), `features` / `info` replace features.json / dataset_info.json."""
    from robowds.export.convert.rlds.records import frame_record

    root = tmp_path / "src" / "bridge_dataset" / "1.0.0"
    root.mkdir(parents=True)
    for name in ("features.json", "dataset_info.json"):
        shutil.copyfile(version_dir() / name, root / name)
    if features is not None:
        (root / "features.json").write_text(json.dumps(features))
    if info is not None:
        (root / "dataset_info.json").write_text(json.dumps(info))
    shard = root / SHARD
    if records is None:
        shutil.copyfile(version_dir() / SHARD, shard)
    else:
        shard.write_bytes(b"".join(frame_record(r) for r in records))
    return root


def convert_fails(capsys: pytest.CaptureFixture[str], src: Path, store: Path, *options: str) -> str:
    capsys.readouterr()
    assert convert(src, store, *options) == 2
    err = capsys.readouterr().err
    assert err.startswith("robowds convert: error: ") and "Traceback" not in err and "fix: " in err, err
    assert not store.exists()
    return err


def test_a_corrupt_record_names_the_file_and_record_and_skip_bad_goes_on(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    src = copy_dataset(tmp_path)
    shard = src / SHARD
    data = bytearray(shard.read_bytes())
    offsets = np.cumsum([0] + [16 + len(p) for p in source_payloads(shard)])
    data[int(offsets[7]) + 12 + 5000] ^= 0x01  # one bit inside record 7's payload
    shard.write_bytes(bytes(data))
    err = convert_fails(capsys, src, tmp_path / "store", *LIGHT)
    assert f"{shard}: record 7 (byte {offsets[7]}): the data CRC does not match" in err, err
    assert "--skip-bad" in err
    assert convert(src, tmp_path / "store", "--skip-bad", *LIGHT) == 0
    report = json.loads((tmp_path / "store" / "convert_report.json").read_text())
    assert report["episodes"] == EPISODES - 1 and len(report["skipped"]) == 1
    assert report["skipped"][0]["episode"] == f"record 7 of {SHARD}"


def test_a_truncated_file_converts_the_records_before_the_cut_with_skip_bad(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    src = copy_dataset(tmp_path)
    shard = src / SHARD
    shard.write_bytes(shard.read_bytes()[:-1000])
    err = convert_fails(capsys, src, tmp_path / "store", *LIGHT)
    assert f"{shard}: record 24 (byte " in err and "the file ends 1000 bytes before the record does" in err, err
    assert convert(src, tmp_path / "store", "--skip-bad", *LIGHT) == 0
    report = json.loads((tmp_path / "store" / "convert_report.json").read_text())
    assert report["episodes"] == 24 and report["skipped"][0]["episode"] == f"record 24 of {SHARD}"
    assert report["dataset_notes"] == ["split train: dataset_info.json lists 25 records in 1 files; found 24 in 1"]


def test_a_missing_features_json_is_named_with_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = copy_dataset(tmp_path)
    (src / "features.json").unlink()
    err = convert_fails(capsys, tmp_path / "src", tmp_path / "store")
    assert f"{src / 'features.json'} is missing" in err and "copy features.json" in err, err


def test_a_tfrecord_folder_without_records_is_one_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = copy_dataset(tmp_path, records=[])
    err = convert_fails(capsys, src, tmp_path / "store")
    assert f"{src}: the train TFRecord files hold no records: {SHARD}" in err, err
    (src / SHARD).unlink()
    err = convert_fails(capsys, src, tmp_path / "store")
    assert "no records of split 'train': no file named bridge_dataset-train.tfrecord-*" in err, err
    err = convert_fails(capsys, tmp_path / "nowhere", tmp_path / "store")
    assert "does not exist" in err


def test_an_unmappable_feature_is_named_and_exclude_converts_the_rest(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    features = json.loads((version_dir() / "features.json").read_text())
    steps = features["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]["features"]
    image = steps["observation"]["featuresDict"]["features"]["image_3"]["image"]
    image.update(dtype="uint16", shape={"dimensions": ["64", "64", "1"]})  # as a depth camera is declared
    src = copy_dataset(tmp_path, features=features)
    err = convert_fails(capsys, src, tmp_path / "store")
    assert "feature 'steps/observation/image_3' cannot be mapped to a store field: a uint16 image" in err, err
    assert "--exclude steps/observation/image_3" in err
    err = convert_fails(capsys, src, tmp_path / "store", "--exclude", "observation/image_9")
    assert "--exclude 'observation/image_9': no such feature" in err
    args = ["--exclude", "observation/image_3", "--exclude", "language_embedding", "--exclude", "observation_image_1",
            "--exclude", "steps/observation/image_2"]
    assert convert(src, tmp_path / "store", *args) == 0
    report = json.loads((tmp_path / "store" / "convert_report.json").read_text())
    assert "observation_image_3" not in report["fields"] and "language_embedding" not in report["fields"]
    assert {"observation_image_1", "observation_image_2"}.isdisjoint(report["fields"])
    assert "observation_image_0" in report["fields"]


def test_a_dataset_of_unknown_rate_needs_fps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    info = {**json.loads((version_dir() / "dataset_info.json").read_text()), "name": "my_robot"}
    src = copy_dataset(tmp_path, info=info)
    (src / SHARD).rename(src / SHARD.replace("bridge_dataset", "my_robot"))
    err = convert_fails(capsys, src, tmp_path / "store")
    assert "the rate of dataset 'my_robot' is not known" in err and "--fps" in err, err
    assert convert(src, tmp_path / "store", "--fps", "10", *LIGHT) == 0
    report = json.loads((tmp_path / "store" / "convert_report.json").read_text())
    assert (report["fps"], report["fps_source"]) == (10.0, "--fps")


# ---- crafted records from the real ones ------------------------------------------------------------------

def real_examples(count: int) -> list[Any]:
    return source_examples(version_dir() / SHARD)[:count]


def test_is_first_and_is_last_cut_the_episode_when_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ends, two = real_examples(2)
    ends.features.feature["steps/is_last"].int64_list.value[6] = 1  # steps 7..9 are past the episode
    two.features.feature["steps/is_first"].int64_list.value[5] = 1  # a second episode from step 5
    src = copy_dataset(tmp_path, records=[ends.SerializeToString(), two.SerializeToString()])
    err = convert_fails(capsys, src, tmp_path / "store")
    assert f"{src / SHARD}: record 1: is_first/is_last mark 2 episodes in one record (steps 0-4, 5-9)" in err, err
    assert "--whole-records" in err
    assert convert(src, tmp_path / "store", "--skip-bad") == 0
    report = json.loads((tmp_path / "store" / "convert_report.json").read_text())
    assert report["notes"] == [f"train_00000_000000 ({SHARD}, record 0): steps 0-6 of 10 kept "
                               "(the others are outside is_first..is_last)"]
    row = pq.read_table(tmp_path / "store" / "episodes.parquet").to_pylist()[0]
    assert row["action"]["t"] == [k / 5 for k in range(7)]
    assert np.array_equal(np.array(row["action"]["v"], np.float32),
                          np.array(feature(ends, "steps/action"), np.float32).reshape(STEPS, 7)[:7])
    assert convert(src, tmp_path / "whole", "--whole-records") == 0
    rows = pq.read_table(tmp_path / "whole" / "episodes.parquet").to_pylist()
    assert [len(r["action"]["t"]) for r in rows] == [STEPS, STEPS]


def test_png_cameras_become_lossless_ffv1_and_mjpeg_on_request(tmp_path: Path) -> None:
    """The real JPEG frames decoded and stored as PNG (as datasets built with encoding_format='png' hold
    them): the FFV1 video decodes to those pixels exactly; --image-codec mjpeg writes MJPEG (lossy)."""
    examples = real_examples(2)
    pixels = []
    for example in examples:
        images = example.features.feature["steps/observation/image_0"].bytes_list.value
        frames = [decode_jpeg(b) for b in images]  # [64, 64, 3] each
        pixels.append(np.stack(frames))
        for k, frame in enumerate(frames):
            buffer = io.BytesIO()
            Image.fromarray(frame).save(buffer, format="PNG")
            images[k] = buffer.getvalue()
    features = json.loads((version_dir() / "features.json").read_text())
    steps = features["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]["features"]
    steps["observation"]["featuresDict"]["features"]["image_0"]["image"]["encodingFormat"] = "png"
    src = copy_dataset(tmp_path, records=[e.SerializeToString() for e in examples], features=features)
    assert convert(src, tmp_path / "store") == 0
    out = tmp_path / "out"
    assert main(["export", str(tmp_path / "store"), str(out), "--quiet", "--workers", "1", "--fps", "5",
                 "--keep-order", "--set", f"exclude=[{', '.join(SERIES + CAMERAS[1:])}]",
                 "--set", "window.duration_s=0.2", "--set", "window.rate_hz=5",
                 "--set", "streams.observation_image_0.encoding=raw"]) == 0
    samples = export_members(out)
    for i in range(2):
        with av.open(str(tmp_path / "store" / "media" / "observation_image_0" / f"train_00000_{i:06d}.mkv")) as c:
            assert c.streams.video[0].codec_context.name == "ffv1"
        for k in range(STEPS):
            np.testing.assert_array_equal(npy(samples[f"train_00000_{i:06d}_{k:06d}"]["observation_image_0.npy"])[0],
                                          pixels[i][k])
    assert convert(src, tmp_path / "lossy", "--image-codec", "mjpeg",
                 "--exclude", "language_embedding") == 0
    with av.open(str(tmp_path / "lossy" / "media" / "observation_image_0" / "train_00000_000000.mkv")) as c:
        assert c.streams.video[0].codec_context.name == "mjpeg" and c.streams.video[0].frames in (0, STEPS)


def test_split_all_converts_every_split_with_distinct_ids(tmp_path: Path) -> None:
    """Bridge's val shard holds the train episodes in another order: a copy of train stands in for it."""
    src = copy_dataset(tmp_path)
    shutil.copyfile(src / SHARD, src / SHARD.replace("-train.", "-val."))
    assert convert(src, tmp_path / "store", "--split", "all", *LIGHT) == 0
    report = json.loads((tmp_path / "store" / "convert_report.json").read_text())
    assert report["splits"] == ["train", "val"] and report["episodes"] == 2 * EPISODES
    ids = pq.read_table(tmp_path / "store" / "episodes.parquet", columns=["episode_id"]).column(0).to_pylist()
    assert ids[0] == "train_00000_000000" and ids[-1] == "val_00000_000024" and len(set(ids)) == 2 * EPISODES


@pytest.mark.parametrize("damage,message", [
    ("action_as_bytes", "feature 'steps/action' holds byte strings, not what features.json declares"),
    ("instruction_changes", "text feature 'steps/language_instruction' changes within the episode"),
    ("camera_missing", "feature 'steps/observation/image_1' of features.json is not in the record"),
    ("state_cut", "feature 'steps/observation/state' has 69 values, not a multiple of 10 steps"),
    ("not_an_example", "not a tf.train.Example"),
    ("one_step", "the episode has 1 step(s); a time series needs at least 2"),
])
def test_a_record_that_does_not_match_features_json_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             damage: str, message: str) -> None:
    (example,) = real_examples(1)
    features = example.features.feature
    if damage == "action_as_bytes":
        features["steps/action"].bytes_list.value.append(b"\x00" * 28)
    elif damage == "instruction_changes":
        features["steps/language_instruction"].bytes_list.value[4] = b"another task"
    elif damage == "camera_missing":
        del features["steps/observation/image_1"]
    elif damage == "state_cut":
        del features["steps/observation/state"].float_list.value[-1]
    elif damage == "one_step":
        for key in [k for k in features if k.startswith("steps/")]:
            values = getattr(features[key], features[key].WhichOneof("kind")).value
            del values[len(values) // STEPS:]
    payload = example.SerializeToString() if damage != "not_an_example" else b"\xff" * 40
    src = copy_dataset(tmp_path, records=[payload])
    err = convert_fails(capsys, src, tmp_path / "store")
    assert f"{src / SHARD}: record 0: {message}" in err, err
