"""Decoding samples that repeat a known member layout, without walking their tar headers one by one.

Every sample of an export has the same members in the same order, and every fixed-shape array member
the same size, so once the checked walk (`format.read_sample`) has parsed one sample, the next one of
the same byte length almost always sits at the same offsets with the same headers, only the key
differs. `SampleDecoder` learns that layout and then checks each new sample against it with one
bytes comparison per member: the tar header (plus the `.npy` header) must be byte-identical to what
our writer produces for that key, checksum included. A sample that matches decodes to exactly what the
checked walk would give; any other one, corrupt or not, goes through the checked walk, so every error
is still raised there with its shard and byte offset.

Why: the checked walk plus per-member decoding cost ~95 us for a 12-member sample (most of a 512 KB
sample's read time from the page cache); a matched layout costs ~14 us (scripts/bench_read.py).
Members whose size varies from sample to sample (text, json, variable-length arrays) keep a per-sample
size, read from their header.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import Any, NamedTuple, Union

import numpy as np

from robowds.reader.decode import decode_member, decode_sample
from robowds.reader.format import BLOCK, ShardFormatError, iter_members, parse_npy_header, read_sample, tar_header
from robowds.reader.members import MemberSet
from robowds.reader.npz import PACKED, PackedLayout, unpack

Buffer = Union[bytes, mmap.mmap]  # slicing gives bytes (a memoryview slice would not compare as fast)
MAX_LAYOUTS = 64  # distinct sample lengths with a layout; past that, new lengths use the checked walk
MAX_RELEARN = 8  # a length whose layout keeps changing stops being learned
_CHECKSUM_AT, _SIZE_AT, _MTIME_AT, _TYPE_AT = 148, 124, 136, 156


class RawArray(NamedTuple):
    """A fixed-shape, C-ordered `.npy` array's bytes in place (a view of the shard buffer, not copied):
    what the batch path (`reader/batching.py`) copies straight into a row of a batch tensor."""

    data: memoryview  # [prod(shape) * dtype.itemsize] bytes, format "B"
    dtype: np.dtype
    shape: tuple[int, ...]


def _checksum_field(value: int) -> bytes:
    return b"%06o\0 " % value  # as `format.tar_header` (and tarfile) write it


@dataclass(frozen=True)
class _Fixed:
    """An `.npy` member whose size (and so tar and npy header) is the same in every sample."""

    suffix: str
    field: str
    header: int  # offset of the tar header from the sample's start
    head: bytes  # header bytes after the key up to the checksum field ([key_len:148])
    tail: bytes  # header bytes after the checksum field, then the .npy header
    checksum: int  # header checksum minus the sum of the key's bytes
    array: int  # offset of the array's first byte from the sample's start
    dtype: np.dtype
    shape: tuple[int, ...]
    order: str


@dataclass(frozen=True)
class _Packed:
    """The `npz` layout's `arrays.npz` member (`reader/npz.py`) when its size is the same in every
    sample: its tar header is checked like a `_Fixed` one's, its zip structure (local headers with the
    `.npy` headers after them, central directory, end record) byte for byte except the CRC-32s, which
    depend on the data and must only agree between each local header and its central record."""

    header: int
    head: bytes  # tar header bytes after the key up to the checksum field
    tail: bytes  # tar header bytes after the checksum field
    checksum: int
    packed: PackedLayout  # offsets from the zip's first byte, `header + BLOCK` from the sample's start


@dataclass(frozen=True)
class _Variable:
    """A member whose size may differ between samples (it keeps its number of 512-byte blocks)."""

    field: str
    ext: str
    header: int
    name: bytes  # header bytes after the key up to the size field ([key_len:124])
    mtime: bytes  # [136:148]
    tail: bytes  # [156:512]
    checksum: int  # header checksum minus the sums of the key's and the size field's bytes
    blocks: int
    data: int  # offset of the data from the sample's start


class SampleLayout:
    """The members of one learned sample; `match` checks another sample of the same length against it."""

    def __init__(self, key_len: int, slots: tuple[_Fixed | _Packed | _Variable, ...], varying: frozenset[str]) -> None:
        self.key_len, self.slots, self.varying = key_len, slots, varying
        fixed = [s for s in slots if isinstance(s, (_Fixed, _Packed))]
        packed = [s for s in slots if isinstance(s, _Packed)]
        self._fixed_at = tuple(s.header for s in fixed)
        self._arrays = tuple((s.field, s.shape, s.dtype, s.array, s.order) for s in slots if isinstance(s, _Fixed))
        self._arrays += tuple((field, shape, dtype, s.header + BLOCK + offset, order)
                              for s in packed for field, shape, dtype, offset, order in s.packed.arrays)
        self._packed = tuple((s.header + BLOCK, s.packed) for s in packed)
        self._variable = tuple(s for s in slots if isinstance(s, _Variable))
        self._fields = tuple(s.field for s in slots if not isinstance(s, _Packed))  # the checked walk's dict order
        if packed:  # the checked walk unpacks, then sorts by suffix (`npz.unpack`)
            suffixes = [(f"{s.field}.{s.ext}", s.field) for s in self._variable]
            suffixes += [(s.suffix, s.field) for s in slots if isinstance(s, _Fixed)]
            suffixes += [(suffix, suffix.partition(".")[0]) for s in packed for suffix in s.packed.names]
            self._fields = tuple(field for _, field in sorted(suffixes))
        self._tails: dict[int, tuple[bytes, ...]] = {}  # key byte sum -> expected bytes after the key, per fixed slot

    def match(self, buf: Buffer, start: int, raw: bool = False) -> dict[str, Any] | None:
        """The decoded sample at `start` if it has this layout exactly, else None. With `raw`, its
        C-ordered fixed-shape arrays are `RawArray`s (bytes in place) instead of ndarrays."""
        k = self.key_len
        key = buf[start:start + k]
        if b"." in key or b"\0" in key:
            return None  # the checked walk would end the key (or the name) elsewhere
        key_sum = sum(key)
        tails = self._tails.get(key_sum) or self._expected_tails(key_sum)
        for at, tail in zip(self._fixed_at, tails):
            at += start
            if buf[at:at + k + len(tail)] != key + tail:
                return None
        for at, zipped in self._packed:
            if not zipped.matches(buf, start + at):
                return None
        sizes = [_variable_size(buf, start, key, key_sum, slot) for slot in self._variable]
        if -1 in sizes:
            return None
        try:
            text_key = key.decode("utf-8")
        except UnicodeDecodeError:
            return None
        sample: dict[str, Any] = {"__key__": text_key}
        sample.update(dict.fromkeys(self._fields))  # the checked walk's order, filled in below
        ndarray = np.ndarray
        view = memoryview(buf) if raw else None
        for field, shape, dtype, offset, order in self._arrays:
            if view is not None and order == "C":
                at = start + offset
                sample[field] = RawArray(view[at:at + dtype.itemsize * _count(shape)], dtype, shape)
            else:
                sample[field] = ndarray(shape, dtype, buf, start + offset, None, order)
        for slot, size in zip(self._variable, sizes):
            sample[slot.field] = _decode_variable(slot.ext, buf, start + slot.data, size)
        return sample

    def _expected_tails(self, key_sum: int) -> tuple[bytes, ...]:
        tails = tuple(slot.head + _checksum_field(slot.checksum + key_sum) + slot.tail
                      for slot in self.slots if isinstance(slot, (_Fixed, _Packed)))
        if len(self._tails) < 4096:
            self._tails[key_sum] = tails
        return tails


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _variable_size(buf: Buffer, start: int, key: bytes, key_sum: int, slot: _Variable) -> int:
    """The member's size if its header is exactly what our writer produces for this key, else -1."""
    at = start + slot.header
    header = buf[at:at + BLOCK]
    size_field = header[_SIZE_AT:_MTIME_AT]
    try:
        size = int(size_field[:11], 8)
    except ValueError:
        return -1
    expected = b"".join((key, slot.name, size_field, slot.mtime,
                         _checksum_field(slot.checksum + key_sum + sum(size_field)), slot.tail))
    if header != expected or size_field != b"%011o\0" % size or -(-size // BLOCK) != slot.blocks:
        return -1
    return size


def _decode_variable(ext: str, buf: Buffer, at: int, size: int) -> Any:
    # text and json as a bytes slice (cheaper than a memoryview for small members); the rest as a view
    data = buf[at:at + size] if ext in ("txt", "json") else memoryview(buf)[at:at + size]
    return decode_member(ext, data)


def learn_layout(buf: Buffer, start: int, stop: int, varying: frozenset[str] = frozenset(),
                 packed: bool = False) -> SampleLayout | None:
    """The layout of the (already checked) sample in [start, stop), or None when its headers are not
    exactly what our writer produces (then only the checked walk reads such samples). Members named in
    `varying`, and all but `.npy` ones, get a per-sample size. With `packed` (the `npz` layout), an
    `arrays.npz` member of only `.npy` entries is learned as a `_Packed` slot."""
    view = memoryview(buf)[start:stop]
    key: bytes | None = None
    slots: list[_Fixed | _Packed | _Variable] = []
    end = 0
    for member in iter_members(view):
        name = member.name.encode("utf-8")
        prefix, dot, suffix = member.name.partition(".")
        if key is None:
            key = prefix.encode("utf-8")
        field, _, ext = suffix.partition(".")
        header = bytes(view[member.offset:member.offset + BLOCK])
        size = len(member.data)
        if not dot or not name.startswith(key + b".") or header != tar_header(member.name, size):
            return None
        k = len(key)
        checksum = int(header[_CHECKSUM_AT:_CHECKSUM_AT + 6], 8) - sum(key)
        data = member.offset + BLOCK
        if packed and suffix == PACKED and suffix not in varying:
            learned = PackedLayout.learn(member.data)
            if learned is None:
                return None
            slots.append(_Packed(member.offset, header[k:_CHECKSUM_AT], header[_CHECKSUM_AT + 8:], checksum, learned))
        elif ext == "npy" and suffix not in varying:
            npy = parse_npy_header(member.data)
            slots.append(_Fixed(suffix, field, member.offset, header[k:_CHECKSUM_AT],
                                header[_CHECKSUM_AT + 8:] + bytes(member.data[:npy.length]), checksum,
                                data + npy.length, npy.dtype, npy.shape, "F" if npy.fortran else "C"))
        else:
            slots.append(_Variable(field, ext, member.offset, header[k:_SIZE_AT], header[_MTIME_AT:_CHECKSUM_AT],
                                   header[_TYPE_AT:], checksum - sum(header[_SIZE_AT:_MTIME_AT]),
                                   -(-size // BLOCK), data))
        end = data + -(-size // BLOCK) * BLOCK
    if key is None or end != stop - start:
        return None
    return SampleLayout(len(key), tuple(slots), varying)


def checked_sample(buf: Buffer, start: int, stop: int, where: str, base: int,
                   expected: MemberSet | None) -> tuple[str, dict[str, memoryview]]:
    """The fully checked walk of one sample's headers (the path every decoder falls back to): its key
    and members, refused with shard and byte when they are not the members the manifest lists. In the
    `npz` layout (or, without `expected`, for a sample holding `arrays.npz`) the packed member is
    unpacked (`npz.unpack`, checked) into the members the `members` layout would hold."""
    key, members = read_sample(memoryview(buf)[start:stop], where, base)
    if (expected.layout == "npz") if expected is not None else PACKED in members:
        members = unpack(members, where, base)
    problem = expected.problem(members) if expected is not None else None
    if problem is not None:
        raise ShardFormatError(f"{where}: byte {base}: sample {key!r}: {problem}")
    return key, members


class SampleDecoder:
    """Samples from shard bytes: through a learned layout when one matches, else the checked walk.

    With `members`, every sample must hold exactly that member set (`reader/members.py`): the checked
    walk checks each sample it reads, and layouts are learned only from samples that passed, so a
    sample matching a layout (byte-identical member names, the whole sample covered) has the same
    set and costs nothing more. One per reading loop (it holds the layouts learned so far; no state is
    shared between loops)."""

    def __init__(self, members: MemberSet | None = None) -> None:
        self.members = members
        self._layouts: dict[int, SampleLayout | None] = {}  # sample length -> layout (None: not learnable)
        self._relearned: dict[int, int] = {}
        self.matched = 0  # samples decoded through a layout (the rest went through the checked walk)

    def decode(self, buf: Buffer, start: int, stop: int, where: str, base: int, raw: bool = False) -> dict[str, Any]:
        """The decoded sample in bytes [start, stop) of `buf`, which sit at byte `base` of shard `where`.
        Raises ShardFormatError / ValueError (from the checked walk) for anything malformed, and
        ShardFormatError for a member set other than `members`. With `raw`, a sample that matches a
        learned layout has its C-ordered fixed-shape arrays as `RawArray`s (the others: ndarrays)."""
        length = stop - start
        layout = self._layouts.get(length)
        if layout is not None and stop <= len(buf):
            sample = layout.match(buf, start, raw)
            if sample is not None:
                self.matched += 1
                return sample
        key, members = checked_sample(buf, start, stop, where, base, self.members)
        sample = decode_sample(key, members)
        self._learn(buf, start, stop, layout)
        return sample

    def array_views(self, buf: Buffer, start: int,
                    stop: int) -> dict[str, tuple[memoryview, np.dtype, tuple[int, ...]]] | None:
        """For a sample in [start, stop) that matches a learned layout: every C-ordered fixed-shape
        array field's raw bytes in place, as (memoryview, dtype, shape); None when it matches none
        (then `decode()` it). Nothing is copied: the views keep `buf` exported until dropped."""
        layout = self._layouts.get(stop - start)
        if layout is None or stop > len(buf):
            return None
        sample = layout.match(buf, start, raw=True)
        if sample is None:
            return None
        self.matched += 1
        return {name: value for name, value in sample.items() if isinstance(value, RawArray)}

    def _learn(self, buf: Buffer, start: int, stop: int, previous: SampleLayout | None) -> None:
        length = stop - start
        if length in self._layouts and previous is None:
            return  # not learnable
        if previous is None and len(self._layouts) >= MAX_LAYOUTS:
            return
        relearned = self._relearned[length] = self._relearned.get(length, 0) + (previous is not None)
        if relearned > MAX_RELEARN:
            self._layouts[length] = None
            return
        varying = previous.varying if previous is not None else frozenset()
        packed = self.members.layout == "npz" if self.members is not None else True
        layout = learn_layout(buf, start, stop, varying, packed)
        if layout is not None and previous is not None and len(previous.slots) == len(layout.slots):
            # a .npy member at the same place whose header changed varies in size: keep a per-sample size
            changed = frozenset(new.suffix for old, new in zip(previous.slots, layout.slots)
                                if isinstance(old, _Fixed) and isinstance(new, _Fixed)
                                and (old.header, old.suffix) == (new.header, new.suffix) and old.tail != new.tail)
            if changed:
                layout = learn_layout(buf, start, stop, varying | changed, packed)
        self._layouts[length] = layout
