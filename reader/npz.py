"""The `npz` shard layout: a sample's `.npy` members packed into one stored (uncompressed) zip member.

Why: a small window of the default export is ~4.7 KB of data in 13 tar members, and every member costs
a 512-byte header plus its padding to 512 bytes: two thirds of the shard were headers and padding.
`shard.layout: npz` writes every `.npy` member of a sample (windows, masks, per-episode value arrays,
raw camera windows) as one `<key>.arrays.npz` member instead; text, JSON, images and encoded camera
windows stay members of their own, so every tool keeps decoding them by extension. webdataset's
`.decode()` and `np.load` read the member as an ordinary `.npz` (a dict of arrays, no pickle).

The zip is written here, not with `zipfile`, so its bytes are a pure function of the entries:
entries in the order given (sorted by suffix), each entry's bytes exactly the `.npy` member the
`members` layout would hold, method 0 (stored), flags 0, date 1980-01-01 00:00, "made by" MS-DOS,
no comment, no data descriptor, no zip64. The only extra field is a fixed alignment pad (id 0xD935, as
Android's zipalign) in the local header, so that every entry, and with numpy's 64-byte-multiple
`.npy` header every array, starts 64-byte aligned in the member and so in the shard (tar data starts
at a 512-byte boundary): arrays viewed straight out of a memory-mapped shard are aligned as in the
`members` layout. Cost: 30 + 46 bytes + two copies of the entry name per entry, plus the pad
(< 68 bytes), plus 22 bytes per sample.

Reading (`read_npz`) walks the central directory and checks every local header against it; it
returns zero-copy views of the entries. Entry CRC-32s are compared between the local and the central
header, but the data is checked against them only on request (`robowds verify` does): the reader
does not hash tar data either (shard sha256s are what `verify=True` and `robowds verify` check).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from robowds.reader.format import BLOCK, EXT_RE, MEMBER_FIELD_RE, ShardFormatError, parse_npy_header

LAYOUTS = ("members", "npz")  # `shard.layout` values; a manifest without one is `members`
PACKED_FIELD = "arrays"
PACKED = f"{PACKED_FIELD}.npz"  # the packed member's suffix: `<key>.arrays.npz`
PACKED_EXT = "npy"  # members with this extension are packed
ALIGN = 64  # entry data (the .npy magic) offset within the member is a multiple of this

_LOCAL = struct.Struct("<IHHHHHIIIHH")  # local file header, 30 bytes
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # central directory record, 46 bytes
_EOCD = struct.Struct("<IHHHHIIH")  # end of central directory, 22 bytes
_LOCAL_SIG, _CENTRAL_SIG, _EOCD_SIG = 0x04034B50, 0x02014B50, 0x06054B50
_VERSION = 20  # 2.0: stored entries, no zip64
_DOS_TIME, _DOS_DATE = 0, (1 << 5) | 1  # 1980-01-01 00:00:00 (zipfile's earliest ZipInfo.date_time)
_PAD_ID = 0xD935  # zipalign's alignment extra field
_UTF8_FLAG = 0x800  # the only flag a reader accepts (names are ASCII here; other writers may set it)
LOCAL_CRC_AT, CENTRAL_CRC_AT = 14, 16  # where the CRC-32 field is in a local header / a central record
_MAX = 0xFFFFFFFF


def _pad(fixed: int) -> bytes:
    """The extra field that moves data starting at `fixed` to the next multiple of ALIGN (b"" if aligned)."""
    pad = (-fixed) % ALIGN
    if pad == 0:
        return b""
    if pad < 4:  # an extra field needs its 4-byte id + length
        pad += ALIGN
    return struct.pack("<HH", _PAD_ID, pad - 4) + b"\0" * (pad - 4)


def encode_npz(entries: Sequence[tuple[str, bytes]]) -> bytes:
    """A stored zip of `entries` ((name, bytes), written in that order); deterministic bytes."""
    out = bytearray()
    central = []
    for name, data in entries:
        raw = name.encode("ascii")
        offset = len(out)
        if len(data) >= _MAX or offset >= _MAX:
            raise ShardFormatError(f"npz entry {name!r}: 4 GiB or more would need zip64 (use shard.layout: members)")
        extra = _pad(offset + _LOCAL.size + len(raw))
        crc = zlib.crc32(data)
        out += _LOCAL.pack(_LOCAL_SIG, _VERSION, 0, 0, _DOS_TIME, _DOS_DATE, crc, len(data), len(data), len(raw),
                           len(extra))
        out += raw + extra + data
        central.append(_CENTRAL.pack(_CENTRAL_SIG, _VERSION, _VERSION, 0, 0, _DOS_TIME, _DOS_DATE, crc, len(data),
                                     len(data), len(raw), 0, 0, 0, 0, 0, offset) + raw)
    directory = b"".join(central)
    if len(entries) > 0xFFFF or len(out) + len(directory) >= _MAX:
        raise ShardFormatError("npz member too large for a zip without zip64 (use shard.layout: members)")
    out += directory + _EOCD.pack(_EOCD_SIG, 0, 0, len(entries), len(entries), len(directory), len(out), 0)
    return bytes(out)


def pack(members: Mapping[str, bytes]) -> dict[str, bytes]:
    """The `npz` layout of one sample's members ('<field>.<ext>' -> bytes): every `.npy` member moved
    into one `arrays.npz` member (entries sorted by suffix), the others as they are."""
    if PACKED in members:
        raise ShardFormatError(f"a field may not be stored as {PACKED!r} in the npz layout (the packed member)")
    arrays = sorted(s for s in members if s.rpartition(".")[2] == PACKED_EXT)
    if not arrays:
        return dict(members)
    out = {s: data for s, data in members.items() if s not in arrays}
    out[PACKED] = encode_npz([(s, members[s]) for s in arrays])
    return out


def laid_out(members: Mapping[str, bytes], layout: str) -> Mapping[str, bytes]:
    """A sample's members as `layout` stores them: as they are (`members`) or `pack`ed (`npz`)."""
    if layout == "members":
        return members
    if layout == "npz":
        return pack(members)
    raise ValueError(f"unknown shard layout {layout!r} (one of {', '.join(LAYOUTS)})")


@dataclass(frozen=True)
class NpzEntry:
    """One entry of a packed member; offsets from the member's first byte."""

    name: str
    header: int  # its local header
    data: int  # its first data byte
    size: int
    central: int  # its central directory record
    crc: int


def npz_entries(data: memoryview | bytes, where: str = "<buffer>", at: int = 0,
                check_crc: bool = False) -> tuple[tuple[NpzEntry, ...], int]:
    """The entries of a packed member (`data`: the member's bytes, at byte `at` of `where`) and the
    offset of its central directory, after checking that it is a stored zip a reader may trust: one
    end record at the very end (no comment), central records and local headers agreeing (name,
    method 0, no encryption or data descriptor, sizes, CRC-32), entries in order, not overlapping and
    inside the member, names `<field>.<ext>` and unique. With `check_crc`, also each entry's data
    against its CRC-32. Raises ShardFormatError naming the shard byte. Cost: O(entries) plus, with
    `check_crc`, one pass over the data."""
    view = memoryview(data)
    n = len(view)

    def fail(pos: int, what: str) -> ShardFormatError:
        return ShardFormatError(f"{where}: byte {at + pos}: member {PACKED!r} is not a stored npz as robowds "
                                f"writes it: {what}")

    if n < _EOCD.size:
        raise fail(0, f"{n} bytes is too short for a zip")
    sig, disk, cd_disk, count, total, cd_size, cd_at, comment = _EOCD.unpack_from(view, n - _EOCD.size)
    if sig != _EOCD_SIG or comment or disk or cd_disk or count != total:
        raise fail(n - _EOCD.size, "no end-of-central-directory record at its end (zip comments and "
                                   "multi-disk zips are not read)")
    if cd_at + cd_size != n - _EOCD.size:
        raise fail(n - _EOCD.size, f"central directory [{cd_at}, +{cd_size}) does not end at the end record")
    entries: list[NpzEntry] = []
    names: set[str] = set()
    pos, end_of_data = cd_at, 0
    for _ in range(count):
        if pos + _CENTRAL.size > cd_at + cd_size:
            raise fail(pos, "central directory ends inside a record")
        (sig, _made, _need, flags, method, _t, _d, crc, csize, usize, name_len, extra_len, comment_len, _disk, _int,
         _ext, offset) = _CENTRAL.unpack_from(view, pos)
        if sig != _CENTRAL_SIG:
            raise fail(pos, "bad central directory record signature")
        name_at = pos + _CENTRAL.size
        raw = bytes(view[name_at:name_at + name_len])
        try:
            name = raw.decode("ascii")
        except UnicodeDecodeError:
            raise fail(name_at, f"entry name {raw[:60]!r} is not ASCII") from None
        field, dot, ext = name.partition(".")
        if not dot or not MEMBER_FIELD_RE.match(field) or not EXT_RE.match(ext) or name in names:
            raise fail(name_at, f"entry name {name!r} is not a unique '<field>.<ext>'")
        names.add(name)
        if method != 0 or flags & ~_UTF8_FLAG or csize != usize:
            raise fail(pos, f"entry {name!r} is compressed, encrypted or has a data descriptor (method {method}, "
                            f"flags {flags:#x})")
        if offset < end_of_data or offset + _LOCAL.size > cd_at:
            raise fail(pos, f"entry {name!r}: local header offset {offset} overlaps another entry or the directory")
        (lsig, _need, lflags, lmethod, _t, _d, lcrc, lcsize, lusize, lname_len,
         lextra_len) = _LOCAL.unpack_from(view, offset)
        lname = bytes(view[offset + _LOCAL.size:offset + _LOCAL.size + lname_len])
        if (lsig, lflags, lmethod, lcrc, lcsize, lusize, lname) != (_LOCAL_SIG, flags, method, crc, csize, usize, raw):
            raise fail(offset, f"entry {name!r}: local header disagrees with the central directory")
        start = offset + _LOCAL.size + lname_len + lextra_len
        if start + usize > cd_at:
            raise fail(offset, f"entry {name!r}: {usize} bytes at {start} run into the central directory")
        if check_crc and zlib.crc32(view[start:start + usize]) != crc:
            raise fail(start, f"entry {name!r}: data does not match its CRC-32 (damaged)")
        entries.append(NpzEntry(name, offset, start, usize, pos, crc))
        end_of_data = start + usize
        pos = name_at + name_len + extra_len + comment_len
    if pos != cd_at + cd_size:
        raise fail(pos, "central directory holds more than its records")
    return tuple(entries), cd_at


def read_npz(data: memoryview | bytes, where: str = "<buffer>", at: int = 0,
             check_crc: bool = False) -> dict[str, memoryview]:
    """Entry name -> zero-copy view of its bytes, for a packed member that `npz_entries` accepts."""
    view = memoryview(data)
    entries, _ = npz_entries(view, where, at, check_crc)
    return {e.name: view[e.data:e.data + e.size] for e in entries}


def unpack(members: Mapping[str, memoryview], where: str = "<buffer>", base: int = 0,
           check_crc: bool = False) -> dict[str, memoryview]:
    """A sample's members (as the tar walk gives them, in tar order, the sample at byte `base`) with
    the packed member replaced by its entries, in sorted suffix order: the members the `members`
    layout would hold, byte for byte. A sample without a packed member comes back as it is.
    An entry that is also a member of its own is refused (ShardFormatError naming the byte)."""
    if PACKED not in members:
        return dict(members)
    at = base
    for suffix, data in members.items():  # the packed member's data offset, for error messages
        if suffix == PACKED:
            break
        at += BLOCK + -(-len(data) // BLOCK) * BLOCK
    entries = read_npz(members[PACKED], where, at + BLOCK, check_crc)
    out = {s: d for s, d in members.items() if s != PACKED}
    twice = sorted(set(out) & set(entries))
    if twice:
        raise ShardFormatError(f"{where}: byte {at}: {twice} are both members and entries of {PACKED!r}")
    out.update(entries)
    return {s: out[s] for s in sorted(out)}


class PackedLayout:
    """The structure of one checked packed member of `.npy` entries, for checking others of the same
    size cheaply: every byte except the array data and the CRC-32s (which depend on the data) must be
    the same, and each local header's CRC-32 must equal its central record's. A member that passes is
    exactly one `npz_entries` accepts with the same entries, so its arrays can be viewed in place.

    The check is one bytes compare of the central directory (with its own CRC-32s put back into the
    learned bytes) and one per entry of its local header and `.npy` header (with the central CRC-32
    put in): about three cheap operations per entry, like the tar header check of the `members`
    layout (numpy gathers over the same bytes cost more under load). Offsets are from the member's
    first byte; size: the member's non-data bytes (~140 per entry)."""

    def __init__(self, size: int, directory: int, parts: tuple[bytes, ...], crc_at: tuple[int, ...],
                 headers: tuple[tuple[int, bytes, bytes], ...],
                 arrays: tuple[tuple[str, tuple[int, ...], np.dtype, int, str], ...], names: tuple[str, ...]) -> None:
        self.size, self.directory = size, directory
        self.parts = parts  # the central directory and end record, cut at each CRC-32 (entries + 1)
        self.crc_at = crc_at  # each entry's CRC-32 offset in the central directory
        self.headers = headers  # (local header offset, its bytes before the CRC-32, after it up to the array)
        self.arrays = arrays  # (field, shape, dtype, data offset, order) per entry
        self.names = names  # the entries, in order

    @classmethod
    def learn(cls, data: memoryview | bytes) -> "PackedLayout | None":
        """The layout of `data` (a packed member already accepted by `npz_entries`); None when an entry
        is not a `.npy` array."""
        entries, directory = npz_entries(data)
        raw = bytes(data)
        headers, arrays, cuts = [], [], [directory]
        for entry in entries:
            field, _, ext = entry.name.partition(".")
            if ext != PACKED_EXT:
                return None
            npy = parse_npy_header(raw[entry.data:entry.data + entry.size])
            crc = entry.header + LOCAL_CRC_AT
            headers.append((entry.header, raw[entry.header:crc], raw[crc + 4:entry.data + npy.length]))
            arrays.append((field, npy.shape, npy.dtype, entry.data + npy.length, "F" if npy.fortran else "C"))
            cuts += [entry.central + CENTRAL_CRC_AT, entry.central + CENTRAL_CRC_AT + 4]
        cuts.append(len(raw))
        parts = tuple(raw[lo:hi] for lo, hi in zip(cuts[::2], cuts[1::2]))
        crc_at = tuple(e.central + CENTRAL_CRC_AT - directory for e in entries)
        return cls(len(raw), directory, parts, crc_at, tuple(headers), tuple(arrays), tuple(e.name for e in entries))

    def matches(self, buf: Any, at: int) -> bool:
        """Whether the member of `self.size` bytes at byte `at` of `buf` has this layout."""
        directory = buf[at + self.directory:at + self.size]
        crcs = [directory[o:o + 4] for o in self.crc_at]
        pieces: list[bytes] = [b""] * (2 * len(crcs) + 1)
        pieces[0::2], pieces[1::2] = self.parts, crcs
        if directory != b"".join(pieces):
            return False
        for (header, head, tail), crc in zip(self.headers, crcs):
            header += at
            if buf[header:header + len(head) + 4 + len(tail)] != head + crc + tail:
                return False
        return True
