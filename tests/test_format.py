"""Tests for the shard format (reader/format.py): sample blobs, the in-memory tar walker, .npy coding."""
from __future__ import annotations

import io
import re
import tarfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robowds.reader.format import (BLOCK, END_OF_ARCHIVE, ShardFormatError, decode_npy, encode_npy, encode_sample,
                                   group_samples, iter_members, read_sample)

MEMBERS = {"joints.npy": encode_npy(np.arange(6, dtype=np.float32).reshape(3, 2)),
           "task.txt": b"pick up the cube",
           "meta.json": b'{"anchor":3}',
           "empty.bin": b""}


def _padded(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def _blob_len(members: dict[str, bytes]) -> int:
    return sum(BLOCK + _padded(len(d)) for d in members.values())


def _offset_in(message: str) -> int:
    match = re.search(r"at byte (\d+)", message)
    assert match, message
    return int(match.group(1))


# --- encode_sample read back by tarfile ---

def test_sample_blob_is_a_valid_tar() -> None:
    blob = encode_sample("ep_0001_000003", MEMBERS)
    assert len(blob) % BLOCK == 0 and len(blob) == _blob_len(MEMBERS)
    with tarfile.open(fileobj=io.BytesIO(blob + END_OF_ARCHIVE), mode="r:") as tar:
        infos = tar.getmembers()
        assert [i.name for i in infos] == [f"ep_0001_000003.{s}" for s in sorted(MEMBERS)]
        for info in infos:
            assert info.isreg()
            assert (info.mtime, info.uid, info.gid, info.mode) == (0, 0, 0, 0o644)
            assert (info.uname, info.gname) == ("", "")
            suffix = info.name.split(".", 1)[1]
            assert info.size == len(MEMBERS[suffix])
            assert tar.extractfile(info).read() == MEMBERS[suffix]


def test_headers_are_ustar() -> None:
    blob = encode_sample("k", {"a.txt": b"x"})
    assert blob[257:265] == b"ustar\x0000"
    assert blob[:7] == b"k.a.txt" and blob[7] == 0


def test_encoding_is_deterministic_and_sorted() -> None:
    reordered = dict(reversed(list(MEMBERS.items())))
    assert encode_sample("k1", MEMBERS) == encode_sample("k1", reordered)


def test_concatenated_blobs_form_a_shard() -> None:
    shard = encode_sample("a", {"x.txt": b"1"}) + encode_sample("b", {"x.txt": b"22"}) + END_OF_ARCHIVE
    with tarfile.open(fileobj=io.BytesIO(shard), mode="r:") as tar:
        assert tar.getnames() == ["a.x.txt", "b.x.txt"]


# --- iter_members / group_samples round trip ---

def test_iter_members_round_trip_with_offsets() -> None:
    m2 = {"joints.npy": b"\x01" * 1000, "task.txt": b"t"}
    b1, b2 = encode_sample("ep-a_000000", MEMBERS), encode_sample("ep-b_000007", m2)
    shard = b1 + b2 + END_OF_ARCHIVE
    members = list(iter_members(shard))
    assert [m.name for m in members] == ([f"ep-a_000000.{s}" for s in sorted(MEMBERS)]
                                         + [f"ep-b_000007.{s}" for s in sorted(m2)])
    expected_offsets, pos = [], 0
    for blob_members in (MEMBERS, m2):
        for suffix in sorted(blob_members):
            expected_offsets.append(pos)
            pos += BLOCK + _padded(len(blob_members[suffix]))
    assert [m.offset for m in members] == expected_offsets
    by_key = {"ep-a_000000": MEMBERS, "ep-b_000007": m2}
    for m in members:
        assert bytes(m.data) == by_key[m.key][m.suffix]
        assert bytes(shard[m.offset + BLOCK:m.offset + BLOCK + len(m.data)]) == bytes(m.data)

    samples = list(group_samples(iter(members)))
    assert [(k, off) for k, off, _ in samples] == [("ep-a_000000", 0), ("ep-b_000007", len(b1))]
    assert {s: bytes(d) for s, d in samples[0][2].items()} == MEMBERS
    assert {s: bytes(d) for s, d in samples[1][2].items()} == m2


def test_iter_members_base_offsets_and_no_end_blocks() -> None:
    b1, b2 = encode_sample("a", {"x.txt": b"1"}), encode_sample("b", {"x.txt": b"2"})
    samples = list(group_samples(iter_members(b1 + b2, base=4096)))  # end-of-archive blocks are optional
    assert [(k, off) for k, off, _ in samples] == [("a", 4096), ("b", 4096 + len(b1))]


def test_iter_members_stops_at_end_of_archive() -> None:
    blob = encode_sample("a", {"x.txt": b"1"})
    assert [m.name for m in iter_members(blob + END_OF_ARCHIVE + b"garbage" * 100)] == ["a.x.txt"]


def test_iter_members_are_zero_copy_views() -> None:
    shard = bytearray(encode_sample("a", {"x.txt": b"abc"}))
    (member,) = iter_members(shard)
    assert isinstance(member.data, memoryview)
    shard[BLOCK] = ord("z")
    assert bytes(member.data) == b"zbc"


def test_same_key_in_consecutive_blobs_is_one_sample() -> None:
    shard = encode_sample("a", {"x.txt": b"1"}) + encode_sample("a", {"y.txt": b"2"})
    ((key, off, fields),) = list(group_samples(iter_members(shard)))
    assert (key, off, sorted(fields)) == ("a", 0, ["x.txt", "y.txt"])


# --- encoding errors ---

@pytest.mark.parametrize("key", ["ep.1", "", "a/b", "a b", "k" * 61])
def test_bad_key_is_refused(key: str) -> None:
    with pytest.raises(ShardFormatError, match="sample key"):
        encode_sample(key, {"x.txt": b""})


def test_name_longer_than_100_bytes_is_refused() -> None:
    key, field = "k" * 60, "f" * 32  # 60 + 1 + 32 + 1 + 6 = 100 bytes is the limit
    assert len(encode_sample(key, {f"{field}.abcdef": b""})) == BLOCK
    with pytest.raises(ShardFormatError, match="longer than 100 bytes"):
        encode_sample(key, {f"{field}.abcdefg": b""})


@pytest.mark.parametrize("suffix", ["x.NPY", "x.Npy", "X.npy", "x", "x.", "1x.npy", ".npy", "x-y.npy",
                                    "x.\u00e9",
                                    "x.n/y", "x.a b"])
def test_bad_suffix_is_refused(suffix: str) -> None:
    with pytest.raises(ShardFormatError):
        encode_sample("k", {suffix: b""})


# --- decoding errors name the byte offset ---

def _two_samples() -> tuple[bytes, bytes]:
    return encode_sample("a", {"x.txt": b"1"}), encode_sample("b", {"x.txt": b"2" * 1000, "y.txt": b"3"})


def test_truncated_member_names_its_header_offset() -> None:
    b1, b2 = _two_samples()
    shard = b1 + b2[:BLOCK + 300]  # b.x.txt announces 1000 bytes, 300 present
    with pytest.raises(ShardFormatError, match=r"'b\.x\.txt'.*truncated \(1000 bytes announced, 300 present\)") as exc:
        list(iter_members(shard, where="shard-000003.tar"))
    assert _offset_in(str(exc.value)) == len(b1) == 1024
    assert "shard-000003.tar" in str(exc.value)


def test_truncated_member_offset_includes_base() -> None:
    b1, b2 = _two_samples()
    with pytest.raises(ShardFormatError) as exc:
        list(iter_members(b1 + b2[:BLOCK + 300], base=10_240))
    assert _offset_in(str(exc.value)) == 10_240 + 1024


def test_tar_ending_inside_a_header_names_the_offset() -> None:
    b1, b2 = _two_samples()
    with pytest.raises(ShardFormatError, match="ends inside a header") as exc:
        list(iter_members(b1 + b2[:200]))
    assert _offset_in(str(exc.value)) == 1024


def test_garbage_header_names_its_offset() -> None:
    b1, b2 = _two_samples()
    bad = bytearray(b1 + b2)
    bad[1024:1024 + BLOCK] = bytes(range(256)) * 2  # bad checksum
    members = iter_members(bytes(bad), where="s.tar")
    assert next(members).name == "a.x.txt"
    with pytest.raises(ShardFormatError, match="bad tar header") as exc:
        next(members)
    assert _offset_in(str(exc.value)) == 1024


def _checked_read(blob: bytes) -> tuple[str, dict[str, bytes]]:
    (key, _, fields), = group_samples(iter_members(blob))
    return key, {k: bytes(v) for k, v in fields.items()}


def test_read_sample_fast_path_equals_the_checked_walk() -> None:
    blob = encode_sample("ep_000001_000042", {**MEMBERS, "imu.npy": encode_npy(np.ones((700, 6), np.float32))})
    key, members = read_sample(blob)
    assert (key, {k: bytes(v) for k, v in members.items()}) == _checked_read(blob)
    assert all(isinstance(v, memoryview) for v in members.values())  # zero-copy views


@pytest.mark.parametrize("where", [0, 1, 100, 124, 148, 155, 156, 300, 511])
def test_read_sample_corrupt_header_byte_names_that_header(where: int) -> None:
    """One flipped byte in any member's header: the same error, naming the same offset, as the
    fully checked walk (the fast path must not accept what the checksum rejects)."""
    blob = encode_sample("a", {"x.txt": b"1" * 700, "y.npy": encode_npy(np.arange(4)), "z.txt": b"2"})
    second = BLOCK + _padded(700)  # the header of a.y.npy
    bad = bytearray(blob)
    bad[second + where] ^= 0x5A
    with pytest.raises(ShardFormatError) as checked:
        _checked_read(bytes(bad))
    with pytest.raises(ShardFormatError) as fast:
        read_sample(bytes(bad), where="s.tar", base=4096)
    assert _offset_in(str(fast.value)) == 4096 + _offset_in(str(checked.value))
    assert _offset_in(str(checked.value)) == second


def test_non_regular_member_is_refused() -> None:
    info = tarfile.TarInfo("a.dir")
    info.type = tarfile.DIRTYPE
    blob = encode_sample("a", {"x.txt": b"1"}) + info.tobuf(format=tarfile.USTAR_FORMAT)
    with pytest.raises(ShardFormatError, match="not a regular file") as exc:
        list(iter_members(blob))
    assert _offset_in(str(exc.value)) == 1024


def test_repeated_non_contiguous_key_is_refused() -> None:
    b1, b2 = _two_samples()
    b3 = encode_sample("a", {"z.txt": b"4"})
    with pytest.raises(ShardFormatError, match="'a'.*not contiguous") as exc:
        list(group_samples(iter_members(b1 + b2 + b3)))
    assert _offset_in(str(exc.value)) == len(b1) + len(b2) == 1024 + 2560


def test_duplicate_member_is_refused() -> None:
    blob = encode_sample("a", {"x.txt": b"1"})
    with pytest.raises(ShardFormatError, match="duplicate member 'a.x.txt'") as exc:
        list(group_samples(iter_members(blob + blob)))
    assert _offset_in(str(exc.value)) == 1024


def test_read_sample_refuses_a_duplicate_member() -> None:
    """A byte range holding 'a.x.txt' twice is not one sample: both the fast walk and the checked walk
    must refuse it (silently keeping the last copy would hand out the wrong bytes)."""
    first, second = encode_sample("a", {"x.txt": b"1"}), encode_sample("a", {"x.txt": b"2"})
    with pytest.raises(ShardFormatError, match=r"member 'a\.x\.txt' does not belong to sample 'a'") as exc:
        read_sample(first + second, where="s.tar", base=4096)
    assert str(exc.value).startswith(f"s.tar: byte {4096 + len(first)}: ") and len(first) == 1024


# --- .npy coding ---

@pytest.mark.parametrize("array", [
    np.array([[0.5, -1.25], [3.0, np.inf]], dtype=np.float32),
    np.array([[True, False, True]]),
    np.array([-(2**62), 0, 7], dtype=np.int64),
    np.zeros((0, 3), dtype=np.float32),
    np.array(2.5),  # 0-d: a scalar 'value' field keeps shape ()
], ids=["float32", "bool", "int64", "empty", "0d"])
def test_npy_round_trip(array: np.ndarray) -> None:
    data = encode_npy(array)
    assert data[:6] == b"\x93NUMPY" and data[6:8] == b"\x01\x00"  # format version 1.0
    out = decode_npy(data)
    assert out.dtype == array.dtype and out.shape == array.shape
    np.testing.assert_array_equal(out, array)
    np.testing.assert_array_equal(decode_npy(memoryview(data)), array)


def test_encode_npy_is_deterministic_and_c_ordered() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert encode_npy(a) == encode_npy(a.copy())
    assert encode_npy(np.asfortranarray(a)) == encode_npy(a)
    assert encode_npy(np.arange(24, dtype=np.float32).reshape(3, 8)[:, ::2]) == encode_npy(a * 2)
    assert b"'fortran_order': False" in encode_npy(np.asfortranarray(a))


def test_object_arrays_are_refused() -> None:
    obj = np.array([{"a": 1}, None], dtype=object)
    buf = io.BytesIO()
    np.save(buf, obj, allow_pickle=True)
    with pytest.raises(ValueError):
        decode_npy(buf.getvalue())
    with pytest.raises(ValueError):
        encode_npy(obj)


def test_structured_dtypes_of_equal_size_keep_their_fields() -> None:
    first = np.zeros(3, dtype=[("alpha_f", "<i2"), ("beta_f", "<i2")])
    second = np.ones(3, dtype=[("gamma_f", "<f4")])
    assert decode_npy(encode_npy(first)).dtype == first.dtype
    assert decode_npy(encode_npy(second)).dtype == second.dtype


def _checked_or_error(blob: bytes) -> tuple[str, dict[str, bytes]] | str:
    """What the fully checked walk makes of a one-sample blob: (key, members) or 'error'."""
    try:
        samples = list(group_samples(iter_members(blob)))
    except ShardFormatError:
        return "error"
    if len(samples) != 1:
        return "error"
    key, _, fields = samples[0]
    return key, {k: bytes(v) for k, v in fields.items()}


def _fast_or_error(blob: bytes) -> tuple[str, dict[str, bytes]] | str:
    try:
        key, members = read_sample(blob)
    except ShardFormatError:
        return "error"
    return key, {k: bytes(v) for k, v in members.items()}


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 1500), min_size=1, max_size=6), seed=st.integers(0, 2**32 - 1),
       flip=st.none() | st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)))
def test_read_sample_agrees_with_the_checked_walk(sizes: list[int], seed: int, flip: tuple[float, int] | None) -> None:
    """Any sample, intact or with any one byte changed: the fast path returns exactly what the checked
    walk returns, or both refuse it."""
    rng = np.random.default_rng(seed)
    members = {f"f{i}.bin": rng.integers(0, 256, n, dtype=np.uint8).tobytes() for i, n in enumerate(sizes)}
    blob = bytearray(encode_sample("ep_000001_000007", members))
    if flip is not None:
        blob[int(flip[0] * len(blob))] ^= flip[1]
    checked, fast = _checked_or_error(bytes(blob)), _fast_or_error(bytes(blob))
    assert fast == checked
    if flip is None:
        assert fast == ("ep_000001_000007", members)


@pytest.mark.parametrize("where", [10, 60, 66, 69])  # the '{', '(', ')' and '}' of the header dict
def test_damaged_npy_header_is_a_value_error(where: int) -> None:
    """numpy's header parser raises tokenize.TokenError for an unbalanced bracket; the reader only turns
    ValueError into a ShardReadError naming the shard, so the parser's error must arrive as one."""
    data = bytearray(encode_npy(np.zeros((10, 7), np.float32)))
    data[where] ^= 1
    with pytest.raises(ValueError, match="bad .npy header"):
        decode_npy(bytes(data))
