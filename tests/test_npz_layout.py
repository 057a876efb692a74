"""The `npz` shard layout (issue 16 item 5, reader/npz.py): every `.npy` member of a sample packed into
one stored `<key>.arrays.npz`.

The packed member is a standard zip that `zipfile`, `np.load`, webdataset, wids and Energon read; its
bytes are a pure function of the entries (same bytes for 1 and 2 workers); our reader returns exactly
the sample dict the `members` layout gives (through the checked walk, the learned zero-copy layout,
field selection and the batch path); anything unexpected in the zip is refused naming shard and byte;
the manifest records the layout; `robowds verify` checks the packed member, CRC-32s included.
"""

from __future__ import annotations

import glob
import io
import json
import re
import struct
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from robowds.export.cli.main import main
from robowds.export.errors import UserError
from robowds.export.job.config import DEFAULTS, load_config
from robowds.reader import ShardDataset
from robowds.reader.collation import collate
from robowds.reader.decode import decode_sample
from robowds.reader.format import BLOCK, ShardFormatError, encode_npy, encode_sample, read_sample
from robowds.reader.interop import decode_members, wds_decoder
from robowds.reader.layout import SampleDecoder, checked_sample
from robowds.reader.members import MemberSet
from robowds.reader.npz import ALIGN, PACKED, encode_npz, npz_entries, pack, read_npz, unpack
from robowds.reader.select import FieldDecoder

from exports import export_members, export_synthetic

OPTIONS = ("--stride", "6", "--set", "shard.max_samples=7", "--set", "shard.min_shards=1")


def _members(key: str, rng: np.random.Generator, text: str = "pick up the cube") -> dict[str, bytes]:
    """One window's members, shaped like an export's: arrays and masks, a 0-d value, text, json."""
    return {"joints.npy": encode_npy(rng.standard_normal((10, 7)).astype(np.float32)),
            "joints_mask.npy": encode_npy(rng.random(10) < 0.8),
            "imu.npy": encode_npy(rng.standard_normal((30, 6)).astype(np.float64)),
            "gain.npy": encode_npy(np.float64(rng.random())),
            "empty.npy": encode_npy(np.zeros((0, 3), np.int16)),
            "task.txt": text.encode(),
            "meta.json": json.dumps({"episode": key[:7]}).encode()}


def _described(sample: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Everything a caller can observe of a decoded sample, in dict order."""
    out: list[tuple[Any, ...]] = []
    for name, value in sample.items():
        if isinstance(value, np.ndarray):
            out.append((name, value.dtype.str, value.shape, value.tobytes(), value.flags.writeable))
        else:
            out.append((name, type(value).__name__, value))
    return out


def _outcome(fn: Any) -> Any:
    try:
        return _described(fn())
    except ValueError as exc:  # ShardFormatError, a bad .npy header, UnicodeDecodeError
        return type(exc).__name__, re.sub(r"0x[0-9a-f]+", "0x?", str(exc))  # object addresses differ


# -- the packed member ---------------------------------------------------------------------------------


def test_packed_member_is_a_standard_stored_zip_with_aligned_entries() -> None:
    rng = np.random.default_rng(0)
    arrays = {s: d for s, d in _members("ep_0001_000000", rng).items() if s.endswith(".npy")}
    entries = sorted(arrays.items())
    blob = encode_npz(entries)
    assert encode_npz(entries) == blob  # a pure function of the entries
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        assert zf.testzip() is None and zf.namelist() == [name for name, _ in entries]
        assert {(i.compress_type, i.date_time, i.comment, i.flag_bits) for i in zf.infolist()} == {
            (zipfile.ZIP_STORED, (1980, 1, 1, 0, 0, 0), b"", 0)}
        assert {i.filename: zf.read(i) for i in zf.infolist()} == arrays  # entries = the .npy members' bytes
    with np.load(io.BytesIO(blob), allow_pickle=False) as loaded:
        for name, data in arrays.items():
            expected = np.load(io.BytesIO(data), allow_pickle=False)
            assert loaded[name[:-4]].dtype == expected.dtype
            np.testing.assert_array_equal(loaded[name[:-4]], expected)
    found, directory = npz_entries(blob)
    assert [e.data % ALIGN for e in found] == [0] * len(entries)  # .npy headers are 64-byte multiples too
    names = sum(len(n) for n, _ in entries)
    pads = sum(e.data - e.header - 30 - len(e.name) for e in found)
    assert all(0 <= e.data - e.header - 30 - len(e.name) < ALIGN + 4 for e in found)
    data = sum(map(len, arrays.values()))
    assert len(blob) == 30 * len(entries) + names + pads + data + 46 * len(entries) + names + 22
    assert directory == found[-1].data + found[-1].size


def test_pack_then_unpack_gives_the_members_layouts_bytes() -> None:
    members = _members("ep_0001_000003", np.random.default_rng(1))
    packed = pack(members)
    assert sorted(packed) == [PACKED, "meta.json", "task.txt"]
    blob = encode_sample("ep_0001_000003", packed)
    key, stored = read_sample(blob)
    got = unpack(stored)
    assert key == "ep_0001_000003" and list(got) == sorted(members)
    assert {s: bytes(v) for s, v in got.items()} == members
    def blocks(data: bytes) -> int:
        return -(-len(data) // BLOCK)

    assert len(blob) == (3 + blocks(packed[PACKED]) + 2) * BLOCK == 11 * BLOCK  # 3 headers, 6 + 1 + 1 blocks of data
    plain = encode_sample("ep_0001_000003", members)
    assert len(plain) == (7 + sum(map(blocks, members.values()))) * BLOCK == 17 * BLOCK
    with pytest.raises(ShardFormatError, match="arrays.npz"):
        pack({PACKED: b"", "x.npy": members["gain.npy"]})


def test_layout_decoder_equals_the_members_layout_and_the_checked_walk() -> None:
    """Samples of the npz layout decode, through the learned layout (zero-copy views of the buffer), to
    exactly what the members layout of the same members decodes to; array_views give their bytes."""
    rng = np.random.default_rng(2)
    keys = [f"ep_{i:04d}_000{i:03d}" for i in range(5)]
    members = [_members(k, rng) for k in keys]
    npz = [encode_sample(k, pack(m)) for k, m in zip(keys, members)]
    plain = [encode_sample(k, m) for k, m in zip(keys, members)]
    shard = b"".join(npz)
    npz_set = MemberSet(frozenset(members[0]), (), "npz")
    decoder, reference = SampleDecoder(npz_set), SampleDecoder(MemberSet(frozenset(members[0]), ()))
    start = 0
    for blob, other in zip(npz, plain):
        views = decoder.array_views(shard, start, start + len(blob))
        got = decoder.decode(shard, start, start + len(blob), "s.tar", start)
        assert _described(got) == _described(reference.decode(other, 0, len(other), "m.tar", 0))
        if views is not None:
            arrays = {k for k, v in got.items() if isinstance(v, np.ndarray)}
            assert set(views) == arrays
            for name, (data, dtype, shape) in views.items():
                assert data.obj is shard and (dtype, shape) == (got[name].dtype, got[name].shape)
                assert bytes(data) == got[name].tobytes()
        start += len(blob)
    assert decoder.matched == 2 * (len(npz) - 1)  # decode and array_views of every sample but the first
    assert np.shares_memory(got["joints"], np.frombuffer(shard, np.uint8))  # a view, not a copy
    keep = frozenset({"joints", "joints_mask", "meta", "gain"})  # field selection hops over the rest
    selecting, plain_selecting = FieldDecoder(npz_set, keep), FieldDecoder(reference.members, keep)
    start = 0
    for blob, other in zip(npz, plain):
        got = selecting.decode(shard, start, start + len(blob), "s.tar", start)
        assert list(got) == ["__key__", "gain", "joints", "joints_mask", "meta"]
        assert _described(got) == _described(plain_selecting.decode(other, 0, len(other), "m.tar", 0))
        start += len(blob)
    assert selecting.matched == len(npz) - 1
    assert np.shares_memory(got["joints"], np.frombuffer(shard, np.uint8))


def test_every_changed_structure_byte_decodes_as_the_checked_walk_does() -> None:
    """Flip each byte of the second sample's tar header and zip structure (all but array data, which
    neither path checks) in turn: the layout decoder, which learned the first sample, returns what the
    checked walk returns or raises what it raises, for every position."""
    rng = np.random.default_rng(3)
    first = encode_sample("ep_0001_000001", pack(_members("ep_0001_000001", rng)))
    second = encode_sample("ep_0001_000002", pack(_members("ep_0001_000002", rng)))
    expected = MemberSet(frozenset(_members("x", rng)), (), "npz")
    data = read_sample(second)[1][PACKED]
    found, directory = npz_entries(data)
    arrays = [(e.data + 128, e.data + e.size) for e in found]  # .npy headers are 128 bytes here
    structure = [p for p in range(BLOCK + len(data)) if not any(lo <= p - BLOCK < hi for lo, hi in arrays)]
    assert len(structure) > 800
    learned = SampleDecoder(expected)
    learned.decode(first, 0, len(first), "s.tar", 0)
    fell_back = 0
    for pos in structure:
        bad = bytearray(second)
        bad[pos] ^= 0x41
        bad = bytes(bad)
        matched = learned.matched

        def checked() -> dict[str, Any]:
            return decode_sample(*checked_sample(bad, 0, len(bad), "s.tar", 4096, expected))

        assert _outcome(lambda: learned.decode(bad, 0, len(bad), "s.tar", 4096)) == _outcome(checked), pos
        fell_back += learned.matched == matched
    assert fell_back == len(structure)  # no changed structure byte was accepted by the learned layout


@pytest.mark.parametrize("case", ["deflated", "comment", "crc", "overlap"])
def test_unexpected_zips_are_refused_naming_shard_and_byte(case: str) -> None:
    rng = np.random.default_rng(4)
    members = _members("ep_0001_000001", rng)
    arrays = sorted((s, d) for s, d in members.items() if s.endswith(".npy"))
    if case == "deflated":  # what np.savez_compressed writes
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in arrays:
                zf.writestr(name, data)
        npz, problem = buf.getvalue(), "is compressed, encrypted or has a data descriptor"
    elif case == "comment":
        npz = encode_npz(arrays)
        npz, problem = npz[:-2] + struct.pack("<H", 3) + b"hey", "no end-of-central-directory record at its end"
    elif case == "crc":  # the local header's CRC no longer agrees with the central directory's
        npz = bytearray(encode_npz(arrays))
        npz[14] ^= 1
        npz, problem = bytes(npz), "local header disagrees with the central directory"
    else:  # the second central record points into the first entry
        npz = bytearray(encode_npz(arrays))
        _, directory = npz_entries(bytes(npz))
        second = directory + 46 + len(arrays[0][0])
        npz[second + 42:second + 46] = struct.pack("<I", 64)
        npz, problem = bytes(npz), "overlaps another entry or the directory"
    blob = encode_sample("ep_0001_000001", {**{s: d for s, d in members.items() if not s.endswith(".npy")},
                                            PACKED: npz})
    decoder = SampleDecoder(MemberSet(frozenset(members), (), "npz"))
    with pytest.raises(ShardFormatError) as info:
        decoder.decode(blob, 0, len(blob), "shard train/shard-000003.tar", 8192)
    message = str(info.value)
    assert message.startswith("shard train/shard-000003.tar: byte ") and problem in message
    at = int(message.split("byte ", 1)[1].split(":", 1)[0])
    assert 8192 + BLOCK <= at < 8192 + BLOCK + len(npz)  # inside the packed member's data
    assert f"member {PACKED!r} is not a stored npz as robowds writes it" in message


def test_crc_is_checked_on_request() -> None:
    arrays = [("x.npy", encode_npy(np.arange(5, dtype=np.int32)))]
    npz = bytearray(encode_npz(arrays))
    npz[64 + 128] ^= 1  # the first array byte
    assert bytes(read_npz(bytes(npz))["x.npy"])[128] == 1  # the reader does not hash data (sha256 does)
    with pytest.raises(ShardFormatError, match=r"s.tar: byte 4160: .* 'x.npy': data does not match its CRC-32"):
        read_npz(bytes(npz), "s.tar", 4096, check_crc=True)
    assert zlib.crc32(arrays[0][1]) == npz_entries(encode_npz(arrays))[0][0].crc


def test_a_packed_member_in_a_members_split_is_refused() -> None:
    """The manifest's layout decides: a `members` split whose sample holds `arrays.npz` is not unpacked."""
    members = _members("ep_0001_000001", np.random.default_rng(5))
    blob = encode_sample("ep_0001_000001", pack(members))
    decoder = SampleDecoder(MemberSet(frozenset(members), ()))
    with pytest.raises(ShardFormatError) as info:
        decoder.decode(blob, 0, len(blob), "shard t.tar", 512)
    assert str(info.value) == (
        "shard t.tar: byte 512: sample 'ep_0001_000001': members do not match the manifest schema: missing "
        "['empty.npy', 'gain.npy', 'imu.npy', 'joints.npy', 'joints_mask.npy'], unexpected ['arrays.npz']")


def test_manifest_layout_is_checked(tmp_path: Path) -> None:
    from robowds.reader.manifest import ManifestError, parse_manifest, split_layout
    doc = {"format": "robowds-manifest", "format_version": 3, "schema": {},
           "splits": {"train": {"shards": [], "layout": "zip"}}}
    with pytest.raises(ManifestError) as info:
        parse_manifest(json.dumps(doc), "m.json")
    assert str(info.value) == "m.json: split 'train': 'layout' is \"zip\"; this robowds reads layouts members, npz"
    doc["splits"]["train"]["layout"] = "npz"
    assert split_layout(parse_manifest(json.dumps(doc)), "train") == "npz"
    del doc["splits"]["train"]["layout"]
    assert split_layout(parse_manifest(json.dumps({**doc, "format_version": 2})), "train") == "members"


# -- configuration -------------------------------------------------------------------------------------


def test_config_key() -> None:
    assert load_config(None, ["shard.layout=members"]) == DEFAULTS  # the default: the same config, same job id
    assert load_config(None, ["shard.layout=npz"])["shard"]["layout"] == "npz"
    with pytest.raises(UserError) as info:
        load_config(None, ["shard.layout=zip"])
    assert str(info.value).startswith("config shard.layout must be one of members, npz, got 'zip'")
    with pytest.raises(UserError) as info:
        load_config(None, ["shard.layuot=npz"])
    assert "layout" in info.value.hint and "max_samples" in info.value.hint


# -- an export in both layouts -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def outs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A synthetic store (with its png image, text and json) exported as members, and as npz with 1 and
    2 workers."""
    root = tmp_path_factory.mktemp("npz")
    members = export_synthetic(root, 2, 7, *OPTIONS)
    store = root / "store"
    out = {"members": members}
    for workers in ("1", "2"):
        out[f"npz{workers}"] = root / f"npz{workers}"
        assert main(["export", str(store), str(out[f"npz{workers}"]), "--quiet", "--workers", workers, *OPTIONS,
                     "--set", "shard.layout=npz"]) == 0
    return out


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_npz_export_is_byte_identical_for_1_and_2_workers_and_records_its_layout(outs: dict[str, Path]) -> None:
    assert _files(outs["npz1"]) == _files(outs["npz2"])
    npz = json.loads((outs["npz1"] / "manifest.json").read_text())
    plain = json.loads((outs["members"] / "manifest.json").read_text())
    assert (npz["format_version"], plain["format_version"]) == (3, 2)
    assert {s["layout"] for s in npz["splits"].values()} == {"npz"}
    assert all("layout" not in s for s in plain["splits"].values()) and "layout" not in plain["config"]["shard"]
    assert npz["config"]["shard"]["layout"] == "npz" and npz["schema"] == plain["schema"]
    stored = export_members(outs["npz1"])
    for key, members in export_members(outs["members"]).items():
        assert sorted(stored[key]) == sorted([PACKED, *(s for s in members if not s.endswith(".npy"))])
        assert {s: bytes(v) for s, v in unpack(stored[key]).items()} == members  # the same bytes, packed
    assert npz["splits"]["train"]["bytes"] < 0.75 * plain["splits"]["train"]["bytes"]


@pytest.mark.parametrize("selection", [{}, {"fields": ["joints"]}, {"fields": ["task", "imu"]},
                                       {"exclude": ["overview", "actions"]}])
def test_shard_dataset_gives_the_same_samples_in_both_layouts(outs: dict[str, Path], selection: dict) -> None:
    plain = list(ShardDataset(outs["members"], "train", seed=1, **selection))
    ds = ShardDataset(outs["npz1"], "train", seed=1, **selection)
    assert ds.members.layout == "npz"
    got = list(ds)
    assert len(got) == len(plain) > 10
    assert [_described(s) for s in got] == [_described(s) for s in plain]


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_are_the_same_in_both_layouts(outs: dict[str, Path], workers: int) -> None:
    """Through `ShardLoader` and the batch path (fixed-shape arrays copied from the mapped shard)."""
    import torch

    from robowds.reader import ShardLoader

    def batches(out: Path) -> list[dict[str, Any]]:
        ds = ShardDataset(out, "train", seed=2)
        return list(ShardLoader(ds, batch_size=4, num_workers=workers, collate_fn=collate))

    from robowds.reader.layout import RawArray
    from robowds.reader.source import ShardSource
    ds = ShardDataset(outs["npz1"], "train", seed=2).set_batching(1, collate_fn=collate)
    ids = ds.sequence().tolist()
    raw = list(ds.reads().samples(ShardSource(ds.base, shards=ds.shards), iter(ids), raw=True))
    assert ds._raw_batches() and sum(isinstance(v, RawArray) for s in raw for v in s.values()) >= 10 * (len(ids) - 4)

    got, expected = batches(outs["npz1"]), batches(outs["members"])
    assert len(got) == len(expected) > 2
    for a, b in zip(got, expected):
        assert list(a) == list(b)
        for name in a:
            if isinstance(b[name], torch.Tensor):
                assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
            else:
                assert a[name] == b[name], name


def test_verify_checks_the_packed_member(outs: dict[str, Path], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(outs["npz1"]), "--store", str(outs["members"].parent / "store"), "--quiet"]) == 0
    import shutil
    out = tmp_path / "bad"
    shutil.copytree(outs["npz1"], out)
    shard = out / "train" / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    key, members = read_sample(data[:int(np.fromfile(str(shard) + ".idx", "<u8")[1])])
    entries, _ = npz_entries(members[PACKED])
    at = data.find(bytes(members[PACKED][:64]))  # the packed member's first byte in the shard
    data[at + entries[0].data + 128] ^= 0x10  # one array byte of the first entry
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["verify", str(out), "--quiet"]) != 0
    printed = capsys.readouterr()
    assert (f"shard train/shard-000000.tar: byte {at + entries[0].data}: member 'arrays.npz' is not a stored npz as "
            f"robowds writes it: entry {entries[0].name!r}: data does not match its CRC-32 (damaged) (key {key})"
            ) in printed.out + printed.err


def test_inspect_shows_the_same_window(outs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    printed = []
    for out in (outs["members"], outs["npz1"]):
        capsys.readouterr()
        assert main(["inspect", str(out), "--index", "3"]) == 0
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1] and "joints" in printed[0] and "arrays" not in printed[0]


# -- other tools ---------------------------------------------------------------------------------------


def _ours(out: Path) -> dict[str, dict[str, Any]]:
    return {s["__key__"]: s for s in ShardDataset(out, "train", shuffle=False)}


def test_webdataset_decodes_the_npz_member(outs: dict[str, Path]) -> None:
    """Plain `.decode()` (webdataset's own `.npz` handler) and `.decode(wds_decoder)`: a dict of the
    arrays our reader gives, dtype and shape included."""
    import webdataset as wds
    mine = _ours(outs["npz1"])
    urls = sorted(glob.glob(str(outs["npz1"] / "train" / "*.tar")))
    for handlers in ((), (wds_decoder, "rgb8")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode(*handlers))
        assert sorted(s["__key__"] for s in theirs) == sorted(mine)
        for sample in theirs:
            expected = mine[sample["__key__"]]
            arrays = sample[PACKED]
            assert sorted(arrays) == sorted(k for k, v in expected.items() if isinstance(v, np.ndarray)
                                            and k != "overview")
            for name, value in arrays.items():
                assert value.dtype == expected[name].dtype and value.shape == expected[name].shape
                np.testing.assert_array_equal(value, expected[name])
            assert sample["task.txt"] == expected["task"] and sample["meta.json"] == expected["meta"]


def test_wids_and_decode_members_flatten_the_npz_member(outs: dict[str, Path], tmp_path: Path) -> None:
    """`wids.ShardListDataset(..., transformations=[wids_transform])`: the same keys and values as a
    members export gives (`.joints.npy` ...), so code written for one layout reads the other."""
    import wids
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        npz = wids.ShardListDataset(str(outs["npz1"] / "train.wids.json"), transformations=[decode_members],
                                    cache_dir=str(tmp_path / "a"))
        plain = wids.ShardListDataset(str(outs["members"] / "train.wids.json"), transformations=[decode_members],
                                      cache_dir=str(tmp_path / "b"))
    theirs = {npz[i]["__key__"]: npz[i] for i in range(len(npz))}
    reference = {plain[i]["__key__"]: plain[i] for i in range(len(plain))}
    assert sorted(theirs) == sorted(reference) and len(theirs) > 10
    for key, sample in theirs.items():
        members = {k: v for k, v in sample.items() if not k.startswith("__")}
        expected = {k: v for k, v in reference[key].items() if not k.startswith("__")}
        assert sorted(members) == sorted(expected)
        for name, value in members.items():
            if isinstance(value, np.ndarray):
                assert value.dtype == expected[name].dtype and value.flags.writeable
                np.testing.assert_array_equal(value, expected[name], err_msg=name)
            else:
                assert value == expected[name], name


def test_energon_cooker_decodes_the_npz_layout(outs: dict[str, Path]) -> None:
    """Energon's own loader (`get_train_dataset` + `get_loader`), the cooker `decode_members` for the
    subflavor the npz export declares (`robowds: 3`): every sample as our reader decodes it."""
    energon = pytest.importorskip("megatron.energon")

    class Encoder(energon.DefaultTaskEncoder):
        cookers = [energon.Cooker(energon.stateless(decode_members), has_subflavors={"robowds": 3})]
        decoder = None

        def batch(self, samples: list[Any]) -> list[Any]:
            return samples

    ds = energon.get_train_dataset(outs["npz1"], split_part="train", batch_size=3, shuffle_buffer_size=None,
                                   max_samples_per_sequence=None, repeat=False, task_encoder=Encoder(),
                                   worker_config=energon.WorkerConfig(rank=0, world_size=1, num_workers=0))
    got = [dict(sample) for batch in energon.get_loader(ds) for sample in batch]
    mine = _ours(outs["npz1"])
    assert sorted(s["__key__"] for s in got) == sorted(mine)
    for sample in got:
        expected = mine[sample["__key__"]]
        names = {k.split(".", 1)[0] for k in sample if not k.startswith("__")}
        assert names == set(expected) - {"__key__"}
        for name, value in sample.items():
            if name.startswith("__"):
                continue
            want = expected[name.split(".", 1)[0]]
            if isinstance(want, np.ndarray):
                value = value.numpy() if hasattr(value, "numpy") else value
                assert value.dtype == want.dtype
                np.testing.assert_array_equal(value, want, err_msg=name)
            else:
                assert value == want, name


def test_hugging_face_datasets_reads_the_npz_member(outs: dict[str, Path], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`datasets.load_dataset("webdataset", ...)` + `hf_transform`: `arrays.npz` as a dict of arrays of
    the stored dtypes, equal to our reader's."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # local shards only: never the hub
    datasets = pytest.importorskip("datasets")
    from robowds.reader import hf_transform

    urls = sorted(glob.glob(str(outs["npz1"] / "train" / "*.tar")))
    ds = datasets.load_dataset("webdataset", data_files={"train": urls}, split="train", cache_dir=str(tmp_path / "hf"))
    ds = ds.with_transform(hf_transform(ds.features))
    mine = _ours(outs["npz1"])
    assert sorted(ds["__key__"]) == sorted(mine)
    for row in ds:
        expected = mine[row["__key__"]]
        arrays = row[PACKED]
        assert sorted(arrays) == sorted(k for k, v in expected.items() if isinstance(v, np.ndarray) and k != "overview")
        for name, value in arrays.items():
            assert value.dtype == expected[name].dtype and value.shape == expected[name].shape, name
            np.testing.assert_array_equal(value, expected[name])
