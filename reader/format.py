"""The shard format: how one window becomes a contiguous run of tar members, and back.

A sample is encoded as a self-contained byte blob (ustar headers + data + padding to 512). A shard is
the concatenation of blobs followed by the two zero blocks that end a tar. Because every blob is
independent, the exporter can stage blobs per episode and the reducer only copies bytes, and the reader
can seek to any sample with the manifest's byte offsets.

Tars written here are read by `webdataset.WebDataset`, `wids` and Megatron-Energon (see the interop
rules in the README): plain ustar, regular files, fixed mtime/uid/mode, `<key>.<field>.<ext>` names with
no dot in the key, names <= 100 bytes, no pickle.

Why names never pass 100 bytes (so ustar's name field is enough: wids reads only that field, and no
PAX header is needed): the exporter's key is a key prefix of at most 40 characters
(`core/shard_plan.KEY_PREFIX_MAX`) + `_` + the anchor (6 digits, more past a million steps); a
member's field is a store field name (at most 32 characters, FIELD_RE) or that name + `_mask`; the
longest extension written is `jpgs.msgpack` (12). That is at most 40 + 1 + 6 + 1 + 37 + 1 + 12 = 98
bytes (93 for a camera's `<field>.jpgs.msgpack`, 89 for its `<field>_mask.npy`); anchors keep it under
100 up to 10**12 steps. tests/test_member_names.py holds the exporter to it.
"""

from __future__ import annotations

import io
import re
import struct
from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
MAX_NAME_BYTES = 100

KEY_RE = re.compile(r"^[A-Za-z0-9_-]{1,60}$")
FIELD_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")  # a store field name (store/schema.py refuses others)
MASK_SUFFIX = "_mask"
# a member's field: a field name, or a field name + `_mask` (37 characters for a 32-character field)
MEMBER_FIELD_RE = re.compile(rf"^[a-z][a-z0-9_]{{0,31}}(?:{MASK_SUFFIX})?$")
EXT_RE = re.compile(r"^[a-z0-9]+(\.[a-z0-9]+)*$")
META_FIELD = "meta"


class ShardFormatError(ValueError):
    """A tar or member that does not follow the shard format (names the shard and byte offset)."""


def mask_field(field: str) -> str:
    return field + MASK_SUFFIX


def tar_header(name: str, size: int) -> bytes:
    """A ustar header byte-identical to `tarfile.TarInfo.tobuf(USTAR_FORMAT)` with mtime 0, uid/gid 0,
    mode 0o644 and empty owner names. Built directly: 4 us instead of 33 us via tarfile (measured on
    64k members), where tarfile took a third of the export's time."""
    raw = name.encode("ascii")
    if len(raw) > MAX_NAME_BYTES:
        raise ShardFormatError(f"member name {name!r} is longer than {MAX_NAME_BYTES} bytes")
    if size >= 8 ** 11:
        raise ShardFormatError(f"member {name!r} is larger than ustar allows (8 GiB)")
    size_field = b"%011o\0" % size
    header = bytearray(_HEADER_TEMPLATE)
    header[0:len(raw)] = raw
    header[124:136] = size_field
    # the checksum of the whole block, from the template's (its name and size bytes are NUL) plus the
    # two fields written: summing ~50 bytes, not 512, took a header from 6.1 to 2.3 us (200k headers)
    header[148:156] = b"%06o\0 " % (_TEMPLATE_SUM + sum(raw) + sum(size_field))
    return bytes(header)


def _template() -> bytes:
    """The constant part of every header, with the checksum field as spaces (as the checksum rule says)."""
    h = bytearray(BLOCK)
    h[100:108] = b"0000644\0"  # mode
    h[108:116] = b"0000000\0"  # uid
    h[116:124] = b"0000000\0"  # gid
    h[136:148] = b"00000000000\0"  # mtime
    h[148:156] = b" " * 8  # checksum placeholder
    h[156:157] = b"0"  # regular file
    h[257:265] = b"ustar\x0000"  # magic + version; devmajor/devminor stay NUL as tarfile writes them
    return bytes(h)


_HEADER_TEMPLATE = _template()
_TEMPLATE_SUM = sum(_HEADER_TEMPLATE)


def encode_member(name: str, data: bytes) -> bytes:
    pad = (-len(data)) % BLOCK
    return tar_header(name, len(data)) + data + b"\0" * pad


_NPY_HEADERS: dict[tuple[str, tuple[int, ...]], bytes] = {}


def encode_npy(array: np.ndarray) -> bytes:
    """`.npy` bytes (C order); deterministic for equal arrays.

    The header for each (dtype, shape) comes from numpy's own writer once and is cached: encoding is
    then header + raw bytes (0.9 s -> 0.1 s for 50k small arrays)."""
    array = np.asarray(array)
    if not array.flags.c_contiguous:
        array = array.copy(order="C")  # not ascontiguousarray: it turns 0-d arrays into 1-d
    if array.dtype.hasobject:
        raise ValueError("object arrays cannot be stored (they would need pickle)")
    key = (array.dtype.str, array.shape)
    header = _NPY_HEADERS.get(key) if array.dtype.names is None else None  # '|V4' names no fields
    if header is None:
        buf = io.BytesIO()
        np.lib.format.write_array(buf, array, allow_pickle=False)
        header = buf.getvalue()[: buf.tell() - array.nbytes]
        if len(_NPY_HEADERS) < 4096 and array.dtype.names is None:
            _NPY_HEADERS[key] = header
    return header + array.tobytes()


@dataclass(frozen=True)
class NpyHeader:
    """What a `.npy` header says: the array starts `length` bytes into the member."""

    length: int
    dtype: np.dtype
    shape: tuple[int, ...]
    fortran: bool
    count: int  # elements


_NPY_PARSED: dict[bytes, NpyHeader] = {}


def parse_npy_header(data: memoryview | bytes) -> NpyHeader:
    """The header of a `.npy` member, parsed once per distinct header (every sample of a field shares
    one), which makes decoding a small window ~5x cheaper than np.load. Object dtypes are refused."""
    view = memoryview(data)
    if bytes(view[:6]) != b"\x93NUMPY":
        raise ValueError("not a .npy member")
    major = view[6]
    length = (10 + int.from_bytes(view[8:10], "little")) if major == 1 else (12 + int.from_bytes(view[8:12], "little"))
    header = bytes(view[:length])
    parsed = _NPY_PARSED.get(header)
    if parsed is None:
        fh = io.BytesIO(header)
        try:
            version = np.lib.format.read_magic(fh)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(fh)  # numpy's own (literal_eval-based, no pickle) parser
        except Exception as exc:  # a damaged header can raise SyntaxError or tokenize.TokenError too
            raise ValueError(f"bad .npy header {header[:80]!r}: {type(exc).__name__}: {exc}") from None
        if dtype.hasobject:
            raise ValueError("object arrays are refused (they would need pickle)")
        parsed = NpyHeader(length, dtype, tuple(shape), bool(fortran), int(np.prod(shape)) if shape else 1)
        if len(_NPY_PARSED) < 4096:
            _NPY_PARSED[header] = parsed
    return parsed


def view_npy(data: memoryview | bytes) -> np.ndarray:
    """A read-only array viewing `data` (zero-copy)."""
    npy = parse_npy_header(data)
    array = np.frombuffer(data, dtype=npy.dtype, count=npy.count, offset=npy.length)
    return array.reshape(npy.shape[::-1]).T if npy.fortran else array.reshape(npy.shape)


def decode_npy(data: bytes | memoryview) -> np.ndarray:
    """A writable copy of a `.npy` member (object arrays refused: no pickle)."""
    return view_npy(data).copy()


_CHECKED_SUFFIXES: set[str] = set()  # '<field>.<ext>' already checked: a few per export (fields x extensions)


def encode_sample(key: str, members: Mapping[str, bytes]) -> bytes:
    """One sample as a tar blob; `members` maps '<field>.<ext>' to bytes, written in sorted order.
    The key is checked once per sample and each suffix once per process, and tar_header refuses a
    name that is too long (three regular expressions per member, 12 members a window, were ~10% of a
    synthetic export under cProfile)."""
    if not KEY_RE.match(key):
        raise ShardFormatError(f"sample key {key!r} must match {KEY_RE.pattern} (no dots)")
    parts = []
    for suffix, data in sorted(members.items()):
        if suffix not in _CHECKED_SUFFIXES:
            _split_suffix(suffix)
            if len(_CHECKED_SUFFIXES) < 4096:
                _CHECKED_SUFFIXES.add(suffix)
        parts.append(encode_member(f"{key}.{suffix}", data))
    return b"".join(parts)


def _split_suffix(suffix: str) -> tuple[str, str]:
    field, _, ext = suffix.partition(".")
    if not MEMBER_FIELD_RE.match(field) or not EXT_RE.match(ext):
        raise ShardFormatError(f"member suffix {suffix!r} must be '<field>.<ext>' in lowercase "
                               f"(field: {MEMBER_FIELD_RE.pattern})")
    return field, ext


@dataclass(frozen=True)
class Member:
    name: str
    offset: int  # byte offset of the header in the shard
    data: memoryview

    @property
    def key(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def suffix(self) -> str:
        return self.name.split(".", 1)[1] if "." in self.name else ""


_ZERO_BLOCK = b"\0" * BLOCK
_CHECKSUM_FIELDS = struct.Struct("148B8x356B")  # every header byte except the checksum field


def parse_header(header: bytes, where: str, offset: int) -> tuple[str, int]:
    """(name, size) of a ustar header for a regular file, checksum verified.

    Parsed directly rather than with `tarfile.TarInfo.frombuf`: 2.5x faster reads of small samples
    (8.4k -> 20.7k samples/s in scripts/bench_read.py), where header parsing was 64% of the time."""
    try:
        stored = int(header[148:156].rstrip(b"\0 ").decode("ascii") or "-1", 8)
        size = int(header[124:136].rstrip(b"\0 ").decode("ascii") or "0", 8)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ShardFormatError(f"{where}: bad tar header at byte {offset}: {exc}") from exc
    if stored != 256 + sum(_CHECKSUM_FIELDS.unpack_from(header)):
        raise ShardFormatError(f"{where}: bad tar header at byte {offset}: checksum mismatch")
    name_end = header.find(b"\0", 0, 100)
    try:
        name = header[: 100 if name_end < 0 else name_end].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ShardFormatError(f"{where}: bad tar header at byte {offset}: {exc}") from exc
    prefix = header[345:500].rstrip(b"\0")
    if prefix:
        name = prefix.decode("utf-8", "replace") + "/" + name
    if header[156:157] not in (b"0", b"\0"):
        raise ShardFormatError(f"{where}: member {name!r} at byte {offset} is not a regular file")
    return name, size


def read_sample(buf: bytes | memoryview, where: str = "<buffer>", base: int = 0) -> tuple[str, dict[str, memoryview]]:
    """The one sample in `buf` (a byte range from the offset index): (key, {suffix: data}).

    The checked read of any sample: `layout.SampleDecoder` learns layouts from it and falls back to it
    for samples that repeat none. Headers are walked with a minimal parse and their checksums verified
    together in one numpy pass; anything unexpected re-reads the sample with the fully checked
    `iter_members`, which raises the precise error. A 12-member sample parses in ~25 us instead of ~90
    us (scripts/bench_read.py, large samples)."""
    view = memoryview(buf)
    fast = _read_sample_fast(view)
    if fast is not None:
        return fast
    key: str | None = None
    members: dict[str, memoryview] = {}
    for member in iter_members(view, where, base):
        k, _, suffix = member.name.partition(".")
        if key is None:
            key = k
        elif k != key or suffix in members:
            raise ShardFormatError(f"{where}: byte {member.offset}: member {member.name!r} does not belong to "
                                   f"sample {key!r} (the offset index and the shard disagree)")
        members[suffix] = member.data
    if key is None:
        raise ShardFormatError(f"{where}: byte {base}: no sample here")
    # the fast walk found a problem the checked walk does not consider one (e.g. trailing zero blocks)
    return key, members


_CHECKSUM_WEIGHTS = np.ones(BLOCK, dtype=np.int64)
_CHECKSUM_WEIGHTS[148:156] = 0  # the checksum field counts as 8 spaces (the +256 below)


def _read_sample_fast(view: memoryview) -> tuple[str, dict[str, memoryview]] | None:
    """`read_sample` for a well-formed sample of regular-file members, else None."""
    headers: list[bytes] = []
    stored: list[int] = []
    members: dict[str, memoryview] = {}
    key = None
    pos, end = 0, len(view)
    try:
        while pos < end:
            header = bytes(view[pos:pos + BLOCK])
            if header[156:157] not in (b"0", b"\0") or header[345:346] != b"\0" or len(header) < BLOCK:
                return None  # another member type, a ustar prefix, or a cut header: the checked walk decides
            size = int(header[124:136].rstrip(b"\0 ") or b"0", 8)
            stored.append(int(header[148:156].rstrip(b"\0 "), 8))
            headers.append(header)
            name_end = header.find(b"\0", 0, MAX_NAME_BYTES)
            name = header[:MAX_NAME_BYTES if name_end < 0 else name_end].decode("utf-8")
            k, _, suffix = name.partition(".")
            if key is None:
                key = k
            elif k != key or suffix in members:
                return None
            start = pos + BLOCK
            if start + size > end:
                return None
            members[suffix] = view[start:start + size]
            pos = start + size + ((-size) % BLOCK)
    except (ValueError, UnicodeDecodeError):
        return None
    if key is None:
        return None
    blocks = np.frombuffer(b"".join(headers), dtype=np.uint8).reshape(len(headers), BLOCK)  # [M, 512]
    if not np.array_equal(blocks @ _CHECKSUM_WEIGHTS + 256, stored):
        return None
    return key, members


def iter_members(buf: bytes | memoryview, where: str = "<buffer>", base: int = 0) -> Iterator[Member]:
    """Members of a tar held in memory; stops at the end-of-archive block.

    Written against the ustar layout instead of `tarfile` so that a corrupt header names its exact
    byte offset and so members are zero-copy views.
    """
    view = memoryview(buf)
    pos = 0
    while pos + BLOCK <= len(view):
        header = bytes(view[pos:pos + BLOCK])
        if header == _ZERO_BLOCK:
            return
        name, size = parse_header(header, where, base + pos)
        start = pos + BLOCK
        end = start + size
        if end > len(view):
            raise ShardFormatError(
                f"{where}: member {name!r} at byte {base + pos} is truncated "
                f"({size} bytes announced, {len(view) - start} present)")
        yield Member(name, base + pos, view[start:end])
        pos = end + ((-size) % BLOCK)
    if pos != len(view):
        raise ShardFormatError(f"{where}: tar ends inside a header at byte {base + pos}")


def group_samples(members: Iterator[Member], where: str = "<buffer>") -> Iterator[tuple[str, int, dict[str, memoryview]]]:
    """(key, offset of its first header, {suffix: data}) per contiguous run of members of one key."""
    key: str | None = None
    start = 0
    fields: dict[str, memoryview] = {}
    seen: set[str] = set()
    for member in members:
        if member.key != key:
            if key is not None:
                yield key, start, fields
            key, start, fields = member.key, member.offset, {}
            if key in seen:
                raise ShardFormatError(f"{where}: key {key!r} at byte {member.offset} is not contiguous or repeats")
            seen.add(key)
        if member.suffix in fields:
            raise ShardFormatError(f"{where}: duplicate member {member.name!r} at byte {member.offset}")
        fields[member.suffix] = member.data
    if key is not None:
        yield key, start, fields
