"""The longest member names the store's rules allow export and read everywhere (issue 22 item 8).

A store field name may have 32 characters; its mask member is `<field>_mask.npy` (a 37-character
field) and a jpg camera's window is `<field>.jpgs.msgpack`. The export used to stop with a
`ShardFormatError` traceback after `validate` passed, because the member rule allowed only the store's
32 characters. Long episode ids become a 40-character key prefix (27 characters and a hash), so
with 6-digit anchors the longest name is 40 + 1 + 6 + 1 + 32 + 1 + 12 = 93 bytes: inside ustar's
100-byte name field, which is all wids reads (no PAX header needed). Checked here with a real export read back by robowds,
webdataset, wids and Megatron-Energon, byte for byte.
"""

from __future__ import annotations

import tarfile
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.main import main
from robowds.export.core.shard_plan import KEY_PREFIX_MAX, key_prefixes
from robowds.export.media.video_windows import MEMBER_EXT
from robowds.reader import ShardDataset
from robowds.reader.format import MAX_NAME_BYTES, encode_npy, encode_sample, mask_field, read_sample
from robowds.reader.members import ORIGINAL_IMAGE_EXTS
from robowds.reader.npz import laid_out, unpack

from exports import export_members
from videos import gradient_frames, write_frames

CAMERA = "observation_images_wrist_cam_rgb"  # 32 characters: the longest store field name
EPISODE = "2026-11-27T13:45:00Z/franka_kitchen/pick_and_place/operator_0042/take_0001"  # 74 characters
# its key prefix: 40 characters: ':' and '/' replaced, cut to 27, then '-' and 12 hex digits of the id's hash
PREFIX = "2026-11-27T13-45-00Z-franka-5df8293e2e64"


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 2.4 s episode of a 10 fps camera, windows of 4 frames every 4 steps as
    `.jpgs.msgpack` (6 samples), 2 shards."""
    root = tmp_path_factory.mktemp("names")
    store = root / "store"
    write_frames(store / "media" / "cam.mp4", gradient_frames(24, 64, 48), rate=10, codec="mpeg4")
    video = pa.array([{"path": "media/cam.mp4", "fps": 10.0}],
                     type=pa.struct([("path", pa.string()), ("fps", pa.float64())]))
    pq.write_table(pa.table({"episode_id": [EPISODE], CAMERA: video}), store / "videos.parquet")
    assert main(["validate", str(store)]) == 0
    assert main(["export", str(store), str(root / "out"), "--quiet", "--workers", "1", "--stride", "4",
                 "--set", f"streams.{CAMERA}.duration_s=0.4", "--set", f"streams.{CAMERA}.encoding=jpg",
                 "--set", "shard.max_samples=3", "--set", "shard.min_shards=1"]) == 0
    return root / "out"


def test_longest_names_are_written_in_the_ustar_name_field(out: Path) -> None:
    assert len(CAMERA) == 32 and key_prefixes([EPISODE]) == {EPISODE: PREFIX}
    shards = sorted(out.glob("train/shard-*.tar"))
    assert len(shards) == 2
    names = []
    for shard in shards:
        with tarfile.open(shard) as tar:
            assert tar.pax_headers == {}
            for member in tar.getmembers():
                assert member.type == tarfile.REGTYPE and not member.pax_headers
                names.append(member.name)
    assert len(names) == 6 * 3
    assert {n.split(".", 1)[1] for n in names} == {f"{CAMERA}.jpgs.msgpack", f"{CAMERA}_mask.npy", "meta.json"}
    assert {n.split(".", 1)[0] for n in names} == {f"{PREFIX}_{a:06d}" for a in range(0, 24, 4)}
    assert max(len(n) for n in names) == len(f"{PREFIX}_000000.{CAMERA}.jpgs.msgpack") == 93


def test_robowds_webdataset_wids_and_energon_read_them(out: Path, tmp_path: Path) -> None:
    """Every reader yields all six samples, each member's bytes as the format's own tar walk reads them."""
    import webdataset as wds
    import wids

    members = export_members(out)  # key -> suffix -> bytes
    assert len(members) == 6
    mine = {s["__key__"]: s for s in ShardDataset(out, "train", shuffle=False)}
    assert sorted(mine) == sorted(members)
    for key, sample in mine.items():
        np.testing.assert_array_equal(sample[f"{CAMERA}_mask"], np.ones(4, dtype=bool))
        assert sample[CAMERA].shape == (4, 48, 64, 3) and sample["meta"]["episode_id"] == EPISODE

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = list(wds.WebDataset(sorted(str(p) for p in out.glob("train/*.tar")), shardshuffle=False,
                                     empty_check=False))
        indexed = wids.ShardListDataset(str(out / "train.wids.json"), transformations=[], cache_dir=str(tmp_path))
        by_index = [indexed[i] for i in range(len(indexed))]
    assert {s["__key__"]: {k: s[k] for k in s if not k.startswith("__")} for s in theirs} == members
    assert {s["__key__"]: {k[1:]: s[k].getvalue() for k in s if k.startswith(".")}  # wids: '.<suffix>' streams
            for s in by_index} == members

    energon = pytest.importorskip("megatron.energon")

    class Encoder(energon.DefaultTaskEncoder):
        cookers = [energon.Cooker(energon.stateless(lambda sample: sample))]
        decoder = None  # members arrive as bytes

        def batch(self, samples: list[dict[str, object]]) -> list[dict[str, object]]:
            return samples

    ds = energon.get_train_dataset(out, split_part="train", batch_size=6, shuffle_buffer_size=None,
                                   max_samples_per_sequence=None, repeat=False, task_encoder=Encoder(),
                                   worker_config=energon.WorkerConfig(rank=0, world_size=1, num_workers=0))
    loaded = [sample for batch in energon.get_loader(ds) for sample in batch]
    assert {s["__key__"]: {k: bytes(v) for k, v in s.items() if not k.startswith("__")} for s in loaded} == members


def test_npz_layout_packs_and_unpacks_a_long_mask_member() -> None:
    """The `npz` layout's entry names follow the same member rule (`reader/npz.py` checks them on read)."""
    field = "x" * 32
    arrays = {f"{field}.npy": encode_npy(np.arange(6, dtype=np.float32).reshape(3, 2)),
              f"{mask_field(field)}.npy": encode_npy(np.array([True, False, True]))}
    blob = encode_sample(f"{PREFIX}_000000", laid_out(arrays, "npz"))
    key, members = read_sample(blob)
    assert key == f"{PREFIX}_000000" and list(members) == ["arrays.npz"]
    assert {k: bytes(v) for k, v in unpack(members).items()} == arrays


def test_no_exported_name_can_pass_100_bytes() -> None:
    """The bound the format relies on, from the exporter's own rules: the longest key prefix (long ids
    and ids that collide after cutting) + an anchor of 12 digits + the longest member suffix fits."""
    ids = ["x" * 300] + [f"{'y' * 60}{i}" for i in range(3)]  # cut to 40 characters; the last three collide
    prefixes = key_prefixes(ids).values()
    assert max(len(p) for p in prefixes) == KEY_PREFIX_MAX == 40
    exts = {"npy", "json", "txt", *MEMBER_EXT.values(), *ORIGINAL_IMAGE_EXTS}
    suffixes = [f"{'f' * 32}.{ext}" for ext in exts] + [f"{mask_field('f' * 32)}.npy"]  # masks are .npy
    longest = max((f"{p}_{10 ** 12 - 1:06d}.{s}" for p in prefixes for s in suffixes), key=len)  # ASCII
    assert len(longest) == 40 + 1 + 12 + 1 + 32 + 1 + 12 == 99 <= MAX_NAME_BYTES
    key, suffix = longest.split(".", 1)
    assert read_sample(encode_sample(key, {suffix: b"x"}))[0] == key  # the writer takes it as it is
