"""Field selection: `ShardDataset(..., fields=[...])` / `exclude=[...]` decodes only the chosen members.

Why: a sample of an export with a camera holds a window of JPEG frames next to kilobytes of state and
actions; decoding the frames costs milliseconds, the arrays microseconds. A policy trained on
state/action alone should pay only for those.

Names are the manifest schema's fields; a field's mask member (`<field>_mask`) goes with it; `__key__`
and `meta` are always kept. What is skipped:
- local (memory-mapped) shards: unselected members are neither decoded nor touched (their pages are
  never read by us; the kernel's fault-around may still map neighbours), through a learned layout
  reduced to the selected members (`FieldDecoder`);
- remote shards: the whole sample is fetched (members of a sample are stored in sorted suffix order,
  so a field and its mask are rarely adjacent to the next selected field: a range per member would
  multiply requests), and only the selected members are decoded.
"""

from __future__ import annotations

from typing import Any, Iterable

from robowds.reader.decode import decode_sample
from robowds.reader.format import META_FIELD, ShardFormatError, mask_field, read_sample
from robowds.reader.layout import Buffer, SampleDecoder, SampleLayout
from robowds.reader.members import MemberSet


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
        raise ValueError(f"{META_FIELD!r} cannot be excluded: it is always kept (it names the sample's episode and anchor)")
    names = {name for name in chosen if name not in set(dropped)}
    if META_FIELD in schema:
        names.add(META_FIELD)
    keep = set(names) | {mask_field(name) for name in names if "mask_member" in schema[name]}
    every = set(schema) | {mask_field(name) for name, spec in schema.items() if "mask_member" in spec}
    return None if keep >= every else frozenset(keep)


def reduce_layout(layout: SampleLayout | None, keep: frozenset[str]) -> SampleLayout | None:
    """`layout` checking and decoding only the members of fields in `keep`: a sample of the layout's
    length whose selected members' headers are byte-identical to the learned ones (key included) holds
    them at the learned offsets; the unselected members are not read at all."""
    if layout is None:
        return None
    return SampleLayout(layout.key_len, tuple(s for s in layout.slots if s.field in keep), layout.varying)


class FieldDecoder(SampleDecoder):
    """A `SampleDecoder` that decodes only the fields in `keep` (`select_fields`).

    Layouts are learned from whole samples (the parent's rules: checked walk first, member set
    checked), then matched in their reduced form; a sample that does not match goes through the checked
    walk of all its members (so a corrupt one is still one error with shard and byte), and only the
    selected members are decoded. The dict holds the selected fields in the checked walk's order."""

    def __init__(self, members: MemberSet | None, keep: frozenset[str]) -> None:
        super().__init__(members)
        self.keep = keep
        self._reduced: dict[int, SampleLayout | None] = {}  # sample length -> reduced layout

    def decode(self, buf: Buffer, start: int, stop: int, where: str, base: int) -> dict[str, Any]:
        length = stop - start
        layout = self._reduced.get(length)
        if layout is not None and stop <= len(buf):
            sample = layout.match(buf, start)
            if sample is not None:
                self.matched += 1
                return sample
        key, members = read_sample(memoryview(buf)[start:stop], where, base)
        problem = self.members.problem(members) if self.members is not None else None
        if problem is not None:
            raise ShardFormatError(f"{where}: byte {base}: sample {key!r}: {problem}")
        sample = decode_sample(key, members, self.keep)
        self._learn(buf, start, stop, self._layouts.get(length))
        self._reduced[length] = reduce_layout(self._layouts.get(length), self.keep)
        return sample


def make_decoder(members: MemberSet | None, keep: frozenset[str] | None) -> SampleDecoder:
    """The decoder for one reading loop: every field (`keep` None) or only `keep`'s."""
    return SampleDecoder(members) if keep is None else FieldDecoder(members, keep)
