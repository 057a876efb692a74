"""Field selection: `ShardDataset(fields=..., exclude=...)` yields exactly the selected fields of what a
full read yields (masks with their fields, `__key__` and `meta` always), never decodes the others (the
jpg camera's frames are not decoded at all), reads the same locally and remotely, through ShardLoader
with 2 workers, and refuses unknown names with one message listing the fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import robowds.reader.decode as decode
from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.reader.dataset import ShardDataset
from robowds.reader.loader import ShardLoader
from robowds.reader.select import select_fields

from videos import write_frames


def canonical(item: Any) -> Any:
    """Exact content of a sample or batch, key order included (arrays as dtype, shape, bytes)."""
    if isinstance(item, torch.Tensor):
        item = item.numpy()
    if isinstance(item, np.ndarray):
        return ("array", item.dtype.str, item.shape, item.tobytes())
    if isinstance(item, dict):
        return tuple((k, canonical(v)) for k, v in item.items())
    if isinstance(item, (list, tuple)):
        return tuple(canonical(v) for v in item)
    return item


@pytest.fixture(scope="module")
def camera(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 synthetic episodes with a 10 fps noise camera (`cam`, stored as a jpg window), stride 4, shards of 8."""
    root = tmp_path_factory.mktemp("fields")
    store = root / "store"
    write_synthetic_store(store, episodes=2, seed=3)
    rng = np.random.default_rng(0)
    for i in range(2):  # noise: the JPEGs, and so the samples, differ in size
        frames = rng.integers(0, 256, (40, 48, 64, 3), dtype=np.uint8)  # [F, H, W, 3]
        write_frames(store / "media" / "cam" / f"ep_{i:04d}.mp4", frames, codec="mpeg4")
    video = pa.array([{"path": f"media/cam/ep_{i:04d}.mp4", "fps": 10.0, "start_s": 0.0, "end_s": 4.0}
                      for i in range(2)])
    pq.write_table(pa.table({"episode_id": ["ep_0000", "ep_0001"], "cam": video}), store / "videos.parquet")
    assert main(["export", str(store), str(root / "out"), "--quiet", "--workers", "1", "--stride", "4",
                 "--set", "shard.max_samples=8", "--set", "shard.min_shards=1"]) == 0
    return root / "out"


@pytest.fixture(scope="module")
def full(camera: Path) -> list[dict[str, Any]]:
    return list(ShardDataset(camera, "train", shuffle=False))


def _only(sample: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {k: v for k, v in sample.items() if k in names}


STATE_ACTION = ["__key__", "actions", "actions_mask", "joints", "joints_mask", "meta"]


def test_selected_fields_equal_the_full_read_and_skip_the_camera(camera: Path, full: list[dict[str, Any]],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    assert full[0]["cam"].shape[1:] == (48, 64, 3) and "cam_mask" in full[0]
    images: list[int] = []
    real = decode.decode_image
    monkeypatch.setattr(decode, "decode_image", lambda data: images.append(1) or real(data))
    selected = ShardDataset(camera, "train", shuffle=False, fields=["joints", "actions"])
    got = list(selected)
    assert images == []  # no frame of the camera decoded (layout and checked walk alike)
    assert all(list(s) == STATE_ACTION for s in got)
    assert [canonical(s) for s in got] == [canonical(_only(s, STATE_ACTION)) for s in full]
    excluded = list(ShardDataset(camera, "train", shuffle=False, exclude=["cam", "overview", "task"]))
    assert images == []
    names = [k for k in full[0] if k not in ("cam", "cam_mask", "overview", "task")]
    assert [canonical(s) for s in excluded] == [canonical(_only(s, names)) for s in full]
    list(ShardDataset(camera, "train", shuffle=False, fields=["cam"]))[:1]
    assert len(images) > 0  # selecting the camera decodes it


def test_hops_serve_every_sample_but_the_first(camera: Path) -> None:
    """Camera samples differ in length (JPEG sizes): the hop over headers serves them all the same."""
    from robowds.reader.select import FieldDecoder, make_decoder

    ds = ShardDataset(camera, "train", shuffle=False, fields=["joints"])
    decoder = make_decoder(ds.members, ds.keep)
    assert isinstance(decoder, FieldDecoder)
    from robowds.reader.source import ShardSource

    source = ShardSource(ds.base)
    n = 0
    for sample_id in range(len(ds)):
        shard, start, stop = ds.reads().locate(sample_id, source)
        buf, at = source.span(shard.path, start, stop)
        decoder.decode(buf, at, at + stop - start, shard.path, start)
        n += 1
    assert len({ds.reads().locate(i, source)[2] - ds.reads().locate(i, source)[1] for i in range(n)}) >= 5  # lengths vary
    assert decoder.matched == n - 1  # the checked walk only for the first sample


def test_remote_and_loader_with_workers(camera: Path, full: list[dict[str, Any]]) -> None:
    remote = list(ShardDataset(camera.as_uri(), "train", shuffle=False, fields=["joints", "actions"]))
    assert [canonical(s) for s in remote] == [canonical(_only(s, STATE_ACTION)) for s in full]
    loaded = [canonical(b) for b in ShardLoader(ShardDataset(camera, "train", seed=2, fields=["joints", "actions"]),
                                                batch_size=4, num_workers=2)]
    whole = [canonical({k: v for k, v in b.items() if k in STATE_ACTION + ["__skipped__"]})
             for b in ShardLoader(ShardDataset(camera, "train", seed=2, exclude=["cam", "overview"]),
                                  batch_size=4, num_workers=0)]
    assert loaded == whole and len(loaded) > 1


def test_names_are_checked_with_one_message() -> None:
    schema = {"joints": {"member": "joints.npy", "mask_member": "joints_mask.npy"}, "meta": {"member": "meta.json"},
              "task": {"member": "task.txt"}, "cam": {"member": "cam.jpgs.msgpack", "mask_member": "cam_mask.npy"}}
    assert select_fields(schema) is None
    assert select_fields(schema, ["joints"]) == {"joints", "joints_mask", "meta"}
    assert select_fields(schema, exclude=["cam"]) == {"joints", "joints_mask", "meta", "task"}
    assert select_fields(schema, ["joints", "cam"], exclude=["cam"]) == {"joints", "joints_mask", "meta"}
    assert select_fields(schema, ["joints", "task", "cam"]) is None  # everything: no filtering
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['joints_mask', 'video'\]: this export's fields are "
                                         r"\['cam', 'joints', 'meta', 'task'\]"):
        select_fields(schema, ["joints_mask", "video"])
    with pytest.raises(ValueError, match="'meta' cannot be excluded"):
        select_fields(schema, exclude=["meta"])
    with pytest.raises(ValueError, match="a list of field names"):
        select_fields(schema, "joints")


def test_unselected_bytes_are_not_read_and_a_bad_selected_header_is_one_error(camera: Path, tmp_path: Path,
                                                                             full: list[dict[str, Any]]) -> None:
    """Garbage in a camera member's data changes nothing for a state/action read (its bytes are never
    read); a damaged header of a selected member is one ShardReadError naming shard and byte."""
    import shutil

    from robowds.reader.format import iter_members

    out = tmp_path / "out"
    shutil.copytree(camera, out)
    shard = out / "train" / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    members = {m.name: m for m in iter_members(bytes(data))}
    key = full[2]["__key__"]
    cam = members[f"{key}.cam.jpgs.msgpack"]
    start = cam.offset + 512
    data[start:start + len(cam.data)] = b"\xff" * len(cam.data)  # not msgpack, not JPEG
    shard.write_bytes(bytes(data))
    got = list(ShardDataset(out, "train", shuffle=False, fields=["joints", "actions"]))
    assert [canonical(s) for s in got] == [canonical(_only(s, STATE_ACTION)) for s in full]
    joints = members[f"{key}.joints.npy"]
    data[joints.offset + 20] ^= 1  # a name byte: the header's checksum no longer matches
    shard.write_bytes(bytes(data))
    from robowds.reader.source import ShardReadError

    with pytest.raises(ShardReadError, match=rf"shard train/shard-000000.tar: bad tar header at byte {joints.offset}"):
        list(ShardDataset(out, "train", shuffle=False, fields=["joints", "actions"]))


def test_selected_fields_read_no_whole_samples_ahead(camera: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-ahead hint (madvise WILLNEED of each upcoming sample) would pull the skipped camera's
    bytes from a cold disk: with fields selected it is not given; a full read still gives it."""
    from robowds.reader.source import ShardSource

    hints: list[tuple[str, int, int]] = []
    real = ShardSource.prefetch
    monkeypatch.setattr(ShardSource, "prefetch", lambda self, path, start, stop: hints.append((path, start, stop))
                        or real(self, path, start, stop))
    list(ShardDataset(camera, "train", shuffle=False, fields=["joints", "actions"]))
    assert hints == []
    list(ShardDataset(camera, "train", shuffle=False))
    assert hints
