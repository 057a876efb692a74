"""The member set every sample of an export has, from the manifest's field schema.

Why: a sample with a foreign member (a `.pickle` added) or without one the schema lists (`task`
missing, or the last members cut off by a manifest whose shard `bytes` is too small) would decode
into a dict of another shape and fail later, in collate, where neither the shard nor the sample is
known and `on_error="skip"` cannot help. Checked once per sample of the checked tar walk and once per
learned layout (a sample matching a layout has byte-identical member names, so the same set). In the
`npz` layout the set is the one after unpacking `arrays.npz` (`reader/npz.py`): the same as `members`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

ORIGINAL_IMAGE_EXTS = ("png", "jpg", "webp", "bmp")  # `encoding: original` keeps the source's format


@dataclass(frozen=True)
class MemberSet:
    """`fixed`: suffixes (`<field>.<ext>`) every sample has; `choices`: per image field kept in its
    original format, the suffixes of which each sample has exactly one. Size: O(fields)."""

    fixed: frozenset[str]
    choices: tuple[frozenset[str], ...]
    layout: str = "members"  # the split's shard layout (`reader/npz.py`): sets are checked after unpacking

    @classmethod
    def from_schema(cls, schema: dict[str, dict[str, Any]], layout: str = "members") -> "MemberSet":
        fixed: set[str] = set()
        choices: list[frozenset[str]] = []
        for name, spec in schema.items():
            member = spec["member"]
            if member == f"{name}.<{'|'.join(ORIGINAL_IMAGE_EXTS)}>":
                choices.append(frozenset(f"{name}.{ext}" for ext in ORIGINAL_IMAGE_EXTS))
            else:
                fixed.add(member)
            if "mask_member" in spec:
                fixed.add(spec["mask_member"])
        return cls(frozenset(fixed), tuple(choices), layout)

    def problem(self, suffixes: Iterable[str]) -> str | None:
        """What is wrong with a sample holding members `suffixes`, or None when it is what the schema says."""
        have = set(suffixes)
        missing = set(self.fixed - have)
        foreign = have - self.fixed
        for choice in self.choices:
            found = foreign & choice
            if len(found) == 1:
                foreign -= found
            elif not found:
                missing.add(min(choice).split(".", 1)[0] + ".<" + "|".join(ORIGINAL_IMAGE_EXTS) + ">")
        if not missing and not foreign:
            return None
        parts = [f"missing {sorted(missing)}"] if missing else []
        parts += [f"unexpected {sorted(foreign)}"] if foreign else []
        return "members do not match the manifest schema: " + ", ".join(parts)
