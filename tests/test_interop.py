"""Other tools read our camera windows as arrays through `robowds.reader.interop` (issue 15 item 7).

webdataset, wids and Energon decode members by their last extension and hand `.jpgs.msgpack` camera
windows back as opaque bytes. The shipped decoders must give, for every sample of a real export with a
jpg camera (plus the synthetic store's arrays, text, JSON and PNG), exactly what `ShardDataset` gives:
arrays equal to the bit, camera windows uint8 [T, H, W, 3].
"""

from __future__ import annotations

import glob
import warnings
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from robowds.export.cli.main import main
from robowds.reader import ShardDataset
from robowds.reader.decode import decode_image
from robowds.reader.interop import decode_members, wds_decoder, wids_transform

from exports import export_synthetic
from videos import camera_store, gradient_frames, write_frames


@pytest.fixture(scope="module")
def camera_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One episode of a 10 fps mpeg4 camera, windows of 4 frames as `cam.jpgs.msgpack`, 3 shards."""
    root = tmp_path_factory.mktemp("interop")
    store = root / "store"
    write_frames(store / "media" / "cam.mp4", gradient_frames(24, 64, 48), rate=10, codec="mpeg4")
    camera_store(store, {"ep0": "media/cam.mp4"})
    assert main(["export", str(store), str(root / "out"), "--quiet", "--workers", "1", "--stride", "2",
                 "--set", "streams.cam.duration_s=0.4", "--set", "streams.cam.encoding=jpg",
                 "--set", "shard.max_samples=4", "--set", "shard.min_shards=1"]) == 0
    return root / "out"


@pytest.fixture(scope="module")
def synth_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_synthetic(tmp_path_factory.mktemp("interop-synth"), 2, 5, "--stride", "8",
                            "--set", "shard.max_samples=8")


def ours(out: Path) -> dict[str, dict[str, Any]]:
    """Every train sample as our reader decodes it: key -> field -> value."""
    return {s["__key__"]: s for s in ShardDataset(out, "train", shuffle=False)}


def assert_same(field: str, theirs: Any, mine: Any) -> None:
    if isinstance(mine, np.ndarray):
        assert isinstance(theirs, np.ndarray) and theirs.dtype == mine.dtype and theirs.shape == mine.shape, field
        np.testing.assert_array_equal(theirs, mine, err_msg=field)
        if field.endswith((".npy", ".jpgs.msgpack")):  # ours, not webdataset's "rgb8" handler
            assert theirs.flags.writeable, field  # torch.as_tensor warns on read-only arrays
    else:
        assert theirs == mine, field


def assert_sample_is_ours(sample: dict[str, Any], mine: dict[str, dict[str, Any]]) -> None:
    """`sample` from another reader (members named `<field>.<ext>`, wids' with a leading dot) holds
    exactly our sample's fields, each value equal to ours."""
    expected = mine[sample["__key__"]]
    members = {k: v for k, v in sample.items() if not k.startswith("__")}
    field = {k: k.lstrip(".").split(".", 1)[0] for k in members}
    assert sorted(field.values()) == sorted(k for k in expected if k != "__key__")
    for name, value in members.items():
        assert_same(name, value, expected[field[name]])


def test_camera_window_is_jpegs_in_msgpack(camera_out: Path) -> None:
    """The premise: the member is a msgpack list of JPEGs that other tools do not decode by themselves;
    decoded independently (msgpack + PIL per frame) it is the window our reader gives."""
    mine = ours(camera_out)
    shards = sorted(glob.glob(str(camera_out / "train" / "*.tar")))
    import webdataset as wds
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = list(wds.WebDataset(shards, shardshuffle=False, empty_check=False).decode())
    assert len(shards) >= 2 and len(raw) == len(mine) >= 8
    for sample in raw:
        blob = sample["cam.jpgs.msgpack"]
        assert isinstance(blob, bytes)  # webdataset's own decoders leave it alone
        frames = np.stack([decode_image(f) for f in msgpack.unpackb(blob, raw=False)])  # [T, H, W, 3]
        assert frames.shape == (4, 48, 64, 3) and frames.dtype == np.uint8
        np.testing.assert_array_equal(frames, mine[sample["__key__"]]["cam"])


@pytest.mark.parametrize("which", ["camera", "synth"])
def test_webdataset_decode_handler(which: str, camera_out: Path, synth_out: Path) -> None:
    """`wds.WebDataset(urls).decode(wds_decoder, "rgb8")`: every member equals our reader's value."""
    import webdataset as wds
    out = camera_out if which == "camera" else synth_out
    mine = ours(out)
    urls = sorted(glob.glob(str(out / "train" / "*.tar")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode(wds_decoder, "rgb8"))
    assert sorted(s["__key__"] for s in theirs) == sorted(mine)
    for sample in theirs:
        assert_sample_is_ours(sample, mine)
    if which == "camera":
        assert theirs[0]["cam.jpgs.msgpack"].shape == (4, 48, 64, 3)


@pytest.mark.parametrize("which", ["camera", "synth"])
def test_wids_transform(which: str, camera_out: Path, synth_out: Path, tmp_path: Path) -> None:
    """`wids.ShardListDataset(<split>.wids.json, transformations=[wids_transform])`, by index."""
    import wids
    out = camera_out if which == "camera" else synth_out
    mine = ours(out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # wids warns about its cache settings
        ds = wids.ShardListDataset(str(out / "train.wids.json"), transformations=[wids_transform],
                                   cache_dir=str(tmp_path))
    assert len(ds) == len(mine)
    for i in range(len(ds)):
        assert_sample_is_ours(ds[i], mine)


def test_decode_members_never_unpickles() -> None:
    """A `.pkl` / `.pyd` member stays bytes (wids' and webdataset's defaults would run pickle on it), an
    object-dtype `.npy` is refused, values already decoded and `__` entries pass through."""
    import io
    import pickle

    class Boom:
        def __reduce__(self) -> Any:
            return (exec, ("raise SystemExit('unpickled')",))

    evil = pickle.dumps(Boom())
    sample = {"__key__": "k", ".x.pkl": io.BytesIO(evil), "y.pyd": evil, "z.npy": np.zeros(3), "__url__": b"u"}
    got = decode_members(sample)
    assert bytes(got[".x.pkl"]) == evil and got["y.pyd"] == evil and got["__url__"] == b"u"
    assert got["z.npy"] is sample["z.npy"] and wds_decoder(".x.pkl", evil) is None
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        decode_members({"o.npy": buf.getvalue()})


@pytest.mark.parametrize("which", ["camera", "synthetic"])
def test_hugging_face_datasets_transform(which: str, camera_out: Path, synth_out: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`datasets.load_dataset("webdataset", ...)` + `hf_transform`: every member of every train sample
    equal to what ShardDataset decodes (dtype, shape, values), cameras included."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # local shards only: never the hub
    datasets = pytest.importorskip("datasets")
    from robowds.reader import hf_transform

    out = camera_out if which == "camera" else synth_out
    urls = sorted(glob.glob(str(out / "train" / "*.tar")))
    ds = datasets.load_dataset("webdataset", data_files={"train": urls}, split="train", cache_dir=str(tmp_path / "hf"))
    ds = ds.with_transform(hf_transform(ds.features))
    mine = ours(out)
    assert sorted(ds["__key__"]) == sorted(mine)
    for row in ds:
        assert_sample_is_ours(row, mine)
    if which == "camera":
        assert ds[0]["cam.jpgs.msgpack"].shape == (4, 48, 64, 3)
