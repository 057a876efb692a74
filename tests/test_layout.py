"""Tests for the learned-layout sample decoder (reader/layout.py): whatever it returns must be exactly
what the checked walk (`read_sample` + `decode_sample`) returns, and whatever that refuses it refuses
with the same error."""
from __future__ import annotations

import io
import json
import re
import tarfile
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robowds.reader.decode import decode_sample
from robowds.reader.format import BLOCK, encode_npy, encode_sample, read_sample
from robowds.reader.layout import MAX_RELEARN, SampleDecoder


def _fortran_npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asfortranarray(array), allow_pickle=False)
    return buf.getvalue()


def _window(key: str, rng: np.random.Generator, text: str = "pick up the cube", tokens: int = 3) -> bytes:
    """A sample shaped like an export's window: arrays, masks, a 0-d value, text, json."""
    return encode_sample(key, {
        "joints.npy": encode_npy(rng.standard_normal((10, 7)).astype(np.float32)),
        "joints_mask.npy": encode_npy(rng.random(10) < 0.8),
        "imu.npy": encode_npy(rng.standard_normal((300, 6)).astype(np.float32)),
        "gain.npy": encode_npy(np.float64(rng.random())),
        "empty.npy": encode_npy(np.zeros((0, 3), np.int16)),
        "rot.npy": _fortran_npy(rng.integers(0, 9, (3, 4)).astype(np.int64)),
        "tokens.npy": encode_npy(np.arange(tokens, dtype=np.int32)),
        "task.txt": text.encode(),
        "meta.json": json.dumps({"episode": key[:7], "anchor": int(rng.integers(0, 1000))}).encode(),
    })


def _described(sample: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Everything about a decoded sample that a caller can observe, in dict order."""
    out: list[tuple[Any, ...]] = []
    for name, value in sample.items():
        if isinstance(value, np.ndarray):
            out.append((name, value.dtype.str, value.shape, value.tobytes(order="A"), value.flags.writeable,
                        value.flags.c_contiguous, value.flags.f_contiguous))
        else:
            out.append((name, type(value).__name__, value))
    return out


def _error(exc: ValueError) -> tuple[str, str]:
    return type(exc).__name__, re.sub(r"0x[0-9a-f]+", "0x?", str(exc))  # object addresses differ


def _checked(blob: bytes, base: int = 0) -> Any:
    try:
        key, members = read_sample(memoryview(blob), "s.tar", base)
        return _described(decode_sample(key, members))
    except ValueError as exc:  # what the reader turns into ShardReadError (UnicodeDecodeError is one)
        return _error(exc)


def _decoded(decoder: SampleDecoder, blob: bytes, base: int = 0) -> Any:
    try:
        return _described(decoder.decode(blob, 0, len(blob), "s.tar", base))
    except ValueError as exc:
        return _error(exc)


def test_a_repeated_layout_is_matched_and_decodes_exactly() -> None:
    rng = np.random.default_rng(0)
    first, second = _window("ep_0001_000003", rng), _window("ep_0002_000017", rng)
    decoder = SampleDecoder()
    assert _decoded(decoder, first) == _checked(first)
    assert decoder.matched == 0  # learned from the checked walk
    assert _decoded(decoder, second) == _checked(second)
    assert decoder.matched == 1
    sample = decoder.decode(second, 0, len(second), "s.tar", 0)
    assert sample["__key__"] == "ep_0002_000017" and sample["rot"].flags.f_contiguous
    assert sample["gain"].shape == () and sample["empty"].shape == (0, 3)


def test_samples_inside_a_larger_buffer_at_any_offset() -> None:
    rng = np.random.default_rng(1)
    blobs = [_window(f"ep_{i:04d}_000000", rng) for i in range(4)]
    shard = b"".join(blobs)
    decoder = SampleDecoder()
    start = 0
    for blob in blobs:
        got = _described(decoder.decode(shard, start, start + len(blob), "s.tar", start))
        assert got == _checked(blob)
        start += len(blob)
    assert decoder.matched == 3


def test_text_of_another_size_in_the_same_blocks_is_matched() -> None:
    rng = np.random.default_rng(2)
    decoder = SampleDecoder()
    decoder.decode(learned := _window("ep_0001_000000", rng, text="a"), 0, len(learned), "s.tar", 0)
    longer = _window("ep_0001_000001", rng, text="open the drawer slowly")
    assert _decoded(decoder, longer) == _checked(longer) and decoder.matched == 1
    assert decoder.decode(longer, 0, len(longer), "s.tar", 0)["task"] == "open the drawer slowly"


def test_an_array_whose_length_varies_becomes_a_per_sample_size() -> None:
    rng = np.random.default_rng(3)
    decoder = SampleDecoder()
    for i, tokens in enumerate([3, 5, 7, 2]):  # all fit one 512-byte block
        blob = _window(f"ep_0001_{i:06d}", rng, tokens=tokens)
        assert _decoded(decoder, blob) == _checked(blob)
    assert decoder.matched == 2  # 3: learned, 5: relearned with tokens varying, 7 and 2: matched
    assert list(decoder.decode(blob, 0, len(blob), "s.tar", 0)["tokens"]) == [0, 1]


def test_layouts_that_keep_changing_stop_being_learned() -> None:
    """Two member sets of the same byte length, alternating: the decoder gives up learning that length
    after MAX_RELEARN changes instead of relearning forever, and stays exact."""
    a = encode_sample("k0001", {"x.txt": b"1", "y.npy": encode_npy(np.arange(3, dtype=np.int8))})
    b = encode_sample("k0001", {"x.txt": b"1", "z.npy": encode_npy(np.arange(3, dtype=np.int8))})
    assert len(a) == len(b)
    decoder = SampleDecoder()
    for i in range(3 * MAX_RELEARN):
        blob = (a, b)[i % 2]
        assert _decoded(decoder, blob) == _checked(blob)
    assert decoder.matched == 0 and decoder._layouts[len(a)] is None


def test_foreign_tar_headers_are_never_matched() -> None:
    """A shard member not written by our writer (here: tarfile with an mtime) is read by the checked
    walk every time: the layout only predicts headers our writer makes."""
    def foreign(key: str) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            data = encode_npy(np.arange(4, dtype=np.float32))
            info = tarfile.TarInfo(f"{key}.x.npy")
            info.size, info.mtime = len(data), 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()[:2 * BLOCK]
    decoder = SampleDecoder()
    for key in ("k1", "k2", "k3"):
        blob = foreign(key)
        assert _decoded(decoder, blob) == _checked(blob)
    assert decoder.matched == 0


def test_truncated_buffer_falls_back_and_reports_the_truncation() -> None:
    rng = np.random.default_rng(4)
    first, second = _window("ep_0001_000000", rng), _window("ep_0001_000001", rng)
    decoder = SampleDecoder()
    decoder.decode(first, 0, len(first), "s.tar", 0)
    cut = second[:-BLOCK]
    with pytest.raises(ValueError, match="byte"):
        decoder.decode(cut, 0, len(second), "s.tar", 0)  # the span the index announces is longer than the buffer
    assert decoder.matched == 0


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), key_digits=st.integers(1, 8), text=st.text(max_size=40),
       flip=st.none() | st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)))
def test_layout_agrees_with_the_checked_walk(seed: int, key_digits: int, text: str,
                                             flip: tuple[float, int] | None) -> None:
    """A decoder that learned one sample, given another (any key length, any text, intact or with any
    one byte changed): exactly the checked walk's sample, or the checked walk's error."""
    rng = np.random.default_rng(seed)
    decoder = SampleDecoder()
    learned = _window("ep_1234_000001", rng)
    decoder.decode(learned, 0, len(learned), "s.tar", 0)
    blob = bytearray(_window("ep_" + "7" * key_digits + "_000002", rng, text=text))
    if flip is not None:
        blob[int(flip[0] * len(blob))] ^= flip[1]
    assert _decoded(decoder, bytes(blob), base=1024) == _checked(bytes(blob), base=1024)
    if flip is None and key_digits == 4 and 0 < len(text.encode()) <= BLOCK:
        assert decoder.matched == 1  # same key length and blocks: the layout was used
