"""Finding exported windows in a split's shards: which ones to draw, and refusing a cut shard. Shared
by `robowds inspect` and the report.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from robowds.export.errors import UserError
from robowds.export.output.publish import load_finished_manifest
from robowds.export.store.location import StoreLocation
from robowds.reader.format import BLOCK, ShardFormatError, parse_header
from robowds.reader.manifest import ShardInfo, shards_of


def check_length(shard: ShardInfo, data: bytes, offsets: list[int], out: StoreLocation) -> None:
    """Refuse a shard whose length is not the manifest's, naming the first sample it cuts.

    Why: a shard cut at a member boundary holds samples that parse but lack their last members, and
    inspect printed such a partial window and exited 0. Comparing one length (the manifest's `bytes`)
    catches every cut before any sample is decoded; hashing the shard is `verify`'s job."""
    if len(data) == shard.bytes:
        return
    fix = f"`robowds verify {out}` checks every shard; export again to repair it"
    if len(data) > shard.bytes:
        raise UserError(f"shard {shard.path} is {len(data)} bytes, the manifest lists {shard.bytes}: it is not "
                        "the shard this export wrote", hint=fix)
    cut = next((i for i in range(shard.samples) if offsets[i + 1] > len(data)), None)
    head = f"shard {shard.path} is cut short ({len(data)} of {shard.bytes} bytes)"
    if cut is None:
        raise UserError(f"{head}: its end-of-archive blocks are missing", hint=fix)
    start, after = offsets[cut], shard.samples - cut - 1
    more = f", and the {after} sample(s) after it are missing" if after else ""
    key = _key_at(data, start, f"shard {shard.path}")
    what = f"sample {key!r} at byte {start} is incomplete" if key else f"sample {cut} at byte {start} is missing"
    raise UserError(f"{head}: {what}{more}", hint=fix)


def _key_at(data: bytes, start: int, where: str) -> str | None:
    """The key in the tar header at `start`, or None when no whole, valid header is there."""
    if start + BLOCK > len(data):
        return None
    try:
        name, _ = parse_header(data[start:start + BLOCK], where, start)
    except ShardFormatError:
        return None
    return name.partition(".")[0]



def random_windows(out: Path | str | StoreLocation, split: str, count: int, seed: int) -> list[int]:
    """`count` distinct sample indices of the split, drawn with `seed` (all of them if it has fewer)."""
    manifest = load_finished_manifest(out)
    total = sum(s.samples for s in shards_of(manifest, split))
    if not total:
        raise UserError(f"split {split!r} has no samples", hint="pick another --split")
    return sorted(np.random.default_rng(seed).choice(total, size=min(count, total), replace=False).tolist())
