"""Field selection: `ShardDataset(..., fields=[...])` / `exclude=[...]` decodes only the chosen members.

Why: a sample of an export with a camera holds a window of JPEG frames next to kilobytes of state and
actions; decoding the frames costs milliseconds, the arrays microseconds. A policy trained on
state/action alone should pay only for those.

Names are the manifest schema's fields; a field's mask member (`<field>_mask`) goes with it; `__key__`
and `meta` are always kept. What is skipped:
- local (memory-mapped) shards: unselected members are not decoded and their data is never read
  (only their 512-byte headers, to hop over them; the kernel's fault-around may still map neighbouring
  pages), whatever each sample's length (`FieldDecoder`);
- remote shards: the whole sample is fetched (members of a sample are stored in sorted suffix order,
  so a field and its mask are rarely adjacent to the next selected field: a range per member would
  multiply requests), and only the selected members are decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from robowds.reader.decode import decode_member, decode_sample
from robowds.reader.format import (BLOCK, MAX_NAME_BYTES, META_FIELD, ShardFormatError, mask_field, read_sample,
                                   tar_header)
from robowds.reader.layout import Buffer, SampleDecoder, checked_sample
from robowds.reader.members import MemberSet
from robowds.reader.npz import PACKED, PackedLayout, npz_entries


def select_fields(schema: dict[str, dict[str, Any]], fields: Iterable[str] | None = None,
                  exclude: Iterable[str] | None = None) -> frozenset[str] | None:
    """The sample dict keys to decode (besides `__key__`) for `fields` minus `exclude`, or None when
    that is every field (then nothing is filtered). One ValueError names every unknown name and lists
    the export's fields. Size: O(fields)."""
    if fields is None and exclude is None:
        return None
    if isinstance(fields, str) or isinstance(exclude, str):
        raise ValueError("fields and exclude take a list of field names, not one string")
    chosen = list(schema) if fields is None else list(fields)
    dropped = [] if exclude is None else list(exclude)
    unknown = [name for name in (*chosen, *dropped) if name not in schema]
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(set(unknown))}: this export's fields are {sorted(schema)} "
                         f"(a field's mask '<field>{mask_field('')}' comes with its field)")
    if META_FIELD in dropped:
        raise ValueError(f"{META_FIELD!r} cannot be excluded: it is always kept (it names the sample's episode "
                         "and anchor)")
    names = {name for name in chosen if name not in set(dropped)}
    if META_FIELD in schema:
        names.add(META_FIELD)
    keep = set(names) | {mask_field(name) for name in names if "mask_member" in schema[name]}
    every = set(schema) | {mask_field(name) for name, spec in schema.items() if "mask_member" in spec}
    return None if keep >= every else frozenset(keep)


@dataclass(frozen=True)
class _Slot:
    """One member of a learned member sequence (every sample of an export has the same suffixes in
    the same, sorted, order; only the sizes of variable members differ)."""

    suffix: bytes  # b"joints.npy"
    tag: bytes  # b".joints.npy\0": the name's bytes after the key
    field: str
    ext: str
    keep: bool  # decoded (selected), else only its name and size are read, to hop over it


class FieldDecoder:
    """Samples with only the fields in `keep` decoded (`select_fields`), whatever their byte length.

    Why not the learned layouts of `reader/layout.py`: they are keyed by sample length and a jpg
    camera makes almost every sample's length different (its JPEG sizes vary), so the layouts never
    settle. Instead the decoder learns the member sequence from the first sample (checked walk, member
    set checked) and then hops over each sample's headers: for every member, its name must be exactly
    `<key>.<suffix>` of the sequence and its size field as our writer formats it; a selected member's
    whole header must be byte-identical to what our writer produces for that name and size (checksum
    included), then it is decoded; an unselected one is skipped by its size, its data never read. The
    hop must end exactly at the sample's end. Anything else goes through the checked walk of all
    members (so a corrupt sample is still one error with shard and byte) and relearns the sequence.
    Cost: O(members) header slices per sample; memory: O(members) plus a bounded header cache."""

    def __init__(self, members: MemberSet | None, keep: frozenset[str]) -> None:
        self.members, self.keep = members, keep
        self._sequence: tuple[_Slot, ...] | None = None
        self._entries: tuple[str, ...] = ()  # the npz layout: the learned `arrays.npz` entry names
        self._order: tuple[str, ...] | None = None  # the npz layout: the checked walk's field order
        self._packed: dict[int, PackedLayout | None] = {}  # arrays.npz size -> its learned structure (<= 64)
        # (suffix, size, key length) -> header parts (`_expected`); at most 4096 entries
        self._headers: dict[tuple[bytes, int, int], tuple[bytes, int, bytes]] = {}
        self.matched = 0  # samples decoded by hopping (the rest went through the checked walk)

    def decode(self, buf: Buffer, start: int, stop: int, where: str, base: int) -> dict[str, Any]:
        """As `SampleDecoder.decode`, with only the selected fields."""
        if self._sequence is not None and stop <= len(buf):
            sample = self._hop(buf, start, stop, self._sequence)
            if sample is not None:
                self.matched += 1
                return sample
        key, members = checked_sample(buf, start, stop, where, base, self.members)
        stored = members
        if self.members is None or self.members.layout == "npz":  # the sequence hopped over is the tar's
            stored = read_sample(memoryview(buf)[start:stop], where, base)[1]
        self._entries = tuple(s for s in members if s not in stored)
        self._packed.clear()
        self._order = tuple(s.partition(".")[0] for s in members) if PACKED in stored else None
        slots = []
        for suffix in stored:
            field, _, ext = suffix.partition(".")
            slots.append(_Slot(suffix.encode("utf-8"), b"." + suffix.encode("utf-8") + b"\0", field, ext,
                               field in self.keep or suffix == PACKED))
        self._sequence = tuple(slots)
        return decode_sample(key, members, self.keep)

    def _hop(self, buf: Buffer, start: int, stop: int, sequence: tuple[_Slot, ...]) -> dict[str, Any] | None:
        name_end = buf.find(b".", start, start + MAX_NAME_BYTES)  # the key ends at the first dot
        if name_end <= start:
            return None
        key = buf[start:name_end]
        if b"\0" in key:
            return None
        try:
            text_key = key.decode("utf-8")
        except UnicodeDecodeError:
            return None
        key_sum, k = sum(key), len(key)
        room = MAX_NAME_BYTES - k  # name bytes after the key; a name of exactly 100 bytes has no NUL
        view = memoryview(buf)
        sample: dict[str, Any] = {"__key__": text_key}
        pos = start
        for slot in sequence:
            tag = slot.tag if len(slot.tag) <= room else slot.tag[:-1]  # "." + suffix (+ NUL if it fits)
            if len(tag) > room or buf[pos:pos + k] != key or buf[pos + k:pos + k + len(tag)] != tag:
                return None
            size_field = buf[pos + _SIZE_AT:pos + _SIZE_AT + 12]
            try:
                size = int(size_field[:11], 8)
            except ValueError:
                return None
            if size_field != b"%011o\0" % size:
                return None
            data = pos + BLOCK
            if data + size > stop:
                return None
            if slot.keep:
                if buf[pos:data] != self._expected(key, key_sum, slot.suffix, size):
                    return None
                if slot.suffix == _PACKED and not self._unpack(buf, data, size, sample):
                    return None
                elif slot.suffix != _PACKED:
                    chunk = buf[data:data + size] if slot.ext in ("txt", "json") else view[data:data + size]
                    sample[slot.field] = decode_member(slot.ext, chunk)
            pos = data + size + (-size) % BLOCK
        if pos != stop:
            return None
        if self._order is not None:  # the checked walk's order: unpacked members sorted by suffix
            sample = {"__key__": sample["__key__"], **{f: sample[f] for f in self._order if f in sample}}
        return sample

    def _unpack(self, buf: Buffer, at: int, size: int, sample: dict[str, Any]) -> bool:
        """The selected arrays of the packed `arrays.npz` at byte `at` into `sample`, as views of `buf`;
        False when it is not the learned structure of its size (`npz.PackedLayout`, learned from the
        first member of that size `npz_entries` accepts, with the learned entry names) or not learnable
        (then the checked walk reads the sample, and raises what is wrong)."""
        packed = self._packed.get(size)
        if packed is None:
            if size in self._packed or len(self._packed) >= 64:
                return False
            try:
                entries, _ = npz_entries(memoryview(buf)[at:at + size])
            except ShardFormatError:
                return False
            packed = PackedLayout.learn(memoryview(buf)[at:at + size]) if tuple(
                e.name for e in entries) == self._entries else None
            self._packed[size] = packed
            if packed is None:
                return False
        if not packed.matches(buf, at):
            return False
        for field, shape, dtype, offset, order in packed.arrays:
            if field in self.keep:
                sample[field] = np.ndarray(shape, dtype, buf, at + offset, None, order)
        return True

    def _expected(self, key: bytes, key_sum: int, suffix: bytes, size: int) -> bytes:
        """The header our writer produces for `<key>.<suffix>` of `size` bytes, from cached parts:
        everything after the key up to the checksum, the checksum less the key's byte sum, the rest."""
        key_len = len(key)
        parts = self._headers.get((suffix, size, key_len))
        if parts is None:
            full = tar_header((key + b"." + suffix).decode("utf-8"), size)
            parts = (full[key_len:_CHECKSUM_AT], int(full[_CHECKSUM_AT:_CHECKSUM_AT + 6], 8) - key_sum,
                     full[_CHECKSUM_AT + 8:])
            if len(self._headers) < 4096:
                self._headers[(suffix, size, key_len)] = parts
        head, checksum, tail = parts
        return key + head + b"%06o\0 " % (checksum + key_sum) + tail


_SIZE_AT, _CHECKSUM_AT = 124, 148  # ustar header fields
_PACKED = PACKED.encode()


def make_decoder(members: MemberSet | None, keep: frozenset[str] | None) -> SampleDecoder | FieldDecoder:
    """The decoder for one reading loop: every field (`keep` None) or only `keep`'s."""
    return SampleDecoder(members) if keep is None else FieldDecoder(members, keep)
