"""Checking one shard of an export against its manifest entry: what a `verify --workers` pool worker
runs (`check_shard`), so this module imports only what that needs.

Why its own module: a pool worker imports the module of the function it runs. From `verify.py` that
was the manifest loader, the store package (pyarrow, yaml), tqdm and the side-file readers, ~0.6 s of
CPU before its first shard on the 2-core VM, against ~0.2 s for numpy, Pillow and the reader's format
modules here; with 2 workers that start-up is the whole difference from 2x
(docs/benchmark-runs/verify.md).
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from robowds.export.store.location import StoreLocation
from robowds.reader.format import ShardFormatError, decode_npy, group_samples, iter_members
from robowds.reader.manifest import ShardIndexError, ShardInfo, shard_index
from robowds.reader.npz import PACKED, pack, unpack

IMAGE_EXTS = ("png", "jpg", "webp", "bmp")


def _fits(shape: tuple[int, ...], schema_shape: list[int | None]) -> bool:
    """Whether an array shape matches the schema's, where None in the schema means any size."""
    return len(shape) == len(schema_shape) and all(want is None or got == want for got, want in zip(shape, schema_shape))


def check_sample(schema: dict[str, Any], split: str, key: str, members: dict[str, memoryview]) -> list[str]:
    """Problems of one decoded sample against the manifest's field schema (empty list = fine)."""
    problems = []
    expected = set()
    for name, spec in schema.items():
        kind = spec["kind"]
        if kind == "video":
            expected |= {spec["member"], spec["mask_member"]}
            try:
                from robowds.reader.decode import decode_member
                frames = decode_member(spec["member"].split(".", 1)[1], members[spec["member"]])
                mask = decode_npy(members[spec["mask_member"]])
            except (KeyError, ValueError, OSError) as exc:
                problems.append(f"video field {name!r}: {type(exc).__name__}: {exc}")
                continue
            if frames.dtype != np.uint8 or not _fits(frames.shape, spec["shape"]):
                problems.append(f"video field {name!r}: {frames.dtype.name}{list(frames.shape)}, schema says "
                                f"uint8{spec['shape']}")
            if mask.shape != (spec["shape"][0],):
                problems.append(f"mask of {name!r}: shape {list(mask.shape)}")
        elif kind == "timeseries":
            expected |= {spec["member"], spec["mask_member"]}
            if spec["member"] not in members or spec["mask_member"] not in members:
                problems.append(f"field {name!r} or its mask is missing")
                continue
            try:
                values, mask = decode_npy(members[spec["member"]]), decode_npy(members[spec["mask_member"]])
            except ValueError as exc:  # object dtype, a payload shorter than its header's shape, a bad header
                problems.append(f"field {name!r} or its mask does not decode: {exc}")
                continue
            shape = tuple(spec["shape"])
            if values.dtype.name != spec["dtype"] or values.shape != shape:
                problems.append(f"field {name!r}: {values.dtype.name}{list(values.shape)}, schema says "
                                f"{spec['dtype']}{list(shape)}")
            if mask.dtype != np.bool_ or mask.shape != shape[:1]:
                problems.append(f"mask of {name!r}: {mask.dtype.name}{list(mask.shape)}, expected bool[{shape[0]}]")
            elif spec["pad"] == "zero" and values.shape == shape and np.any(values[~mask] != 0):
                problems.append(f"field {name!r}: padded steps are not zero")
        elif kind == "text":
            expected.add(spec["member"])
            try:
                bytes(members[spec["member"]]).decode("utf-8")
            except (KeyError, UnicodeDecodeError) as exc:
                problems.append(f"text field {name!r}: {type(exc).__name__}")
        elif kind == "image":
            found = [f"{name}.{ext}" for ext in IMAGE_EXTS if f"{name}.{ext}" in members]
            expected |= set(found)
            if len(found) != 1:
                problems.append(f"image field {name!r}: {len(found)} members")
                continue
            try:
                with Image.open(io.BytesIO(bytes(members[found[0]]))) as img:
                    size = (img.height, img.width, 3)
                    img.convert("RGB")
            except Exception as exc:  # Pillow raises many types for bad data
                problems.append(f"image field {name!r} does not decode: {exc}")
                continue
            if spec.get("shape") and not _fits(size, spec["shape"]):
                problems.append(f"image field {name!r}: {size[1]}x{size[0]} pixels, schema says shape {spec['shape']}")
        elif kind == "value":
            expected.add(spec["member"])
            try:
                decode_npy(members[spec["member"]])
            except (KeyError, ValueError) as exc:
                problems.append(f"value field {name!r}: {exc}")
        elif kind == "meta":
            expected.add(spec["member"])
            try:
                meta = json.loads(bytes(members[spec["member"]]))
                if meta.get("split") != split or set(meta) != set(spec["keys"]):
                    problems.append(f"meta.json {meta} does not match split {split!r} / keys {spec['keys']}")
            except (KeyError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                problems.append(f"meta.json: {type(exc).__name__}: {exc}")
    extra = set(members) - expected
    if extra:
        problems.append(f"unexpected members {sorted(extra)}")
    return problems


def unpacked(members: dict[str, memoryview], layout: str, where: str, offset: int) -> dict[str, memoryview]:
    """A sample's members as the `members` layout holds them. For an `npz` split (`reader/npz.py`):
    the packed `arrays.npz` checked (structure and every entry's CRC-32), byte-identical to what the
    export writes for its entries, holding every `.npy` member; then unpacked. Raises
    ShardFormatError naming the shard byte."""
    if layout != "npz":
        return members
    entries = unpack(members, where, offset, check_crc=True)
    packed = pack({suffix: bytes(data) for suffix, data in entries.items()})
    if PACKED in members and bytes(members[PACKED]) != packed.get(PACKED):
        raise ShardFormatError(f"{where}: byte {offset}: {PACKED!r} holds its entries in another order or "
                               "encoding than robowds writes (re-export)")
    if set(packed) != set(members):
        raise ShardFormatError(f"{where}: byte {offset}: members {sorted(members)}, the npz layout packs every "
                               f".npy member into {PACKED!r}: expected {sorted(packed)}")
    return entries


@dataclass(frozen=True)
class ShardTask:
    """One shard to check: what a pool worker needs (all picklable; the schema is small)."""

    root: StoreLocation
    split: str
    shard: ShardInfo
    schema: dict[str, Any]
    layout: str = "members"


@dataclass
class ShardCheck:
    """What checking one shard found, in the order the serial check met it: `events` are failure
    messages (str) and sample keys (`(key, byte offset)`), so the keys' uniqueness across shards is
    decided in shard order by `ShardReplay`, the same messages in the same places whatever the number
    of workers. `read`: the shard was there to read (it counts in `result.shards`)."""

    events: list[str | tuple[str, int]] = field(default_factory=list)
    samples: int = 0
    read: bool = False


def check_shard(task: ShardTask) -> ShardCheck:
    """Check one shard against its manifest entry: size, sha256, offset index, every member (a pool
    task: it reads the shard whole, once, and holds it while it checks it)."""
    root, shard, out = task.root, task.shard, ShardCheck()
    where = f"shard {shard.path}"
    if not root.is_file(shard.path):
        out.events.append(f"{where}: missing")
        return out
    size = root.size(shard.path)
    if size != shard.bytes:
        out.events.append(f"{where}: {size} bytes, manifest says {shard.bytes}")
        return out
    data = root.read_bytes(shard.path)
    if hashlib.sha256(data).hexdigest() != shard.sha256:
        out.events.append(f"{where}: sha256 does not match the manifest")
    try:
        index: list[int] | None = shard_index(shard, root.read_bytes).tolist()  # [samples + 1]
    except ShardIndexError as exc:  # missing, or not the file the manifest lists
        out.events.append(str(exc))
        index = None
    said = "manifest" if shard.offsets is not None else f"index {shard.index_path}"
    try:
        samples = list(group_samples(iter_members(data, where), where))
        offsets = [off for _, off, _ in samples]
        if len(samples) != shard.samples:
            out.events.append(f"{where}: {len(samples)} samples, manifest says {shard.samples}")
        elif index is not None and offsets != index[:-1]:
            bad = next(i for i, (a, b) in enumerate(zip(offsets, index)) if a != b)
            out.events.append(f"{where}: sample {bad} ({samples[bad][0]}) at byte {offsets[bad]}, "
                              f"{said} says {index[bad]}")
        for key, offset, members in samples:
            out.events.append((key, offset))
            try:
                members = unpacked(members, task.layout, where, offset)
            except ShardFormatError as exc:
                out.events.append(f"{exc} (key {key})")
                continue
            for problem in check_sample(task.schema, task.split, key, members):
                out.events.append(f"{where}: key {key} (byte {offset}): {problem}")
        out.samples = len(samples)
    except (ShardFormatError, ValueError) as exc:  # format errors name the shard themselves
        out.events.append(str(exc) if str(exc).startswith(where) else f"{where}: {exc}")
    out.read = True
    return out
