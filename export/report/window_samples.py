"""Finding exported windows in a split's shards: which ones to draw (`pick_windows`), reading them in
one pass (`read_windows`), and refusing a cut shard. Shared by `robowds inspect` and the report.
"""

from __future__ import annotations

import io
from typing import Any, Sequence

import numpy as np

from robowds.export.errors import UserError
from robowds.export.store.location import RemoteStoreError, StoreLocation
from robowds.reader.decode import decode_sample
from robowds.reader.format import BLOCK, ShardFormatError, parse_header, read_sample
from robowds.reader.manifest import ManifestError, ShardIndexError, ShardInfo, shard_index, shards_of
from robowds.reader.npz import unpack


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


def random_windows(manifest: dict[str, Any], split: str, count: int, seed: int) -> list[int]:
    """`count` distinct sample indices of the split, drawn with `seed` (all of them if it has fewer); an
    empty split is a user error (inspect's `--out-dir`)."""
    if not sum(s.samples for s in split_shards(manifest, split)):
        raise UserError(f"split {split!r} has no samples", hint="pick another --split")
    return pick_windows(manifest, split, count, seed)


def pick_windows(manifest: dict[str, Any], split: str, count: int, seed: int) -> list[int]:
    """`count` distinct sample indices of the split drawn with `seed`, sorted ([] for an empty split).

    The one draw of inspect's `--out-dir --seed` and of the report's window and overlay sections, so the
    same seed shows the same windows everywhere. O(count) memory: `choice` without replacement on an
    integer population draws a permutation's prefix, O(total) time (~5 ms for 600k windows)."""
    total = sum(s.samples for s in split_shards(manifest, split))
    if not total:
        return []
    return sorted(np.random.default_rng(seed).choice(total, size=min(count, total), replace=False).tolist())


def split_shards(manifest: dict[str, Any], split: str) -> list[ShardInfo]:
    """`shards_of`, with a manifest that does not parse as robowds wrote it refused as a user error."""
    try:
        return shards_of(manifest, split)
    except ManifestError as exc:
        raise UserError(str(exc), hint="the manifest is not as robowds wrote it (edited or damaged): "
                        "export again into a new folder") from exc


def read_windows(out: StoreLocation, manifest: dict[str, Any], split: str, indices: Sequence[int]) -> list[dict[str, Any]]:
    """The decoded samples at `indices` (positions in the split's shard order), in the order given.

    Each shard that holds one is opened once and only the chosen samples' byte ranges are read, after
    its offset index: O(chosen bytes + touched shards' indexes), not O(split). On object storage the
    file reads ahead in `StoreLocation` blocks (4 MiB): a GET per sample not in the block before it,
    never the whole shard. A shard whose size is not the manifest's is refused as `check_length` names
    the cut (inspect's message)."""
    shards = split_shards(manifest, split)
    firsts = np.cumsum([0, *(s.samples for s in shards)])  # [shards + 1]: the split index of each shard's first sample
    wanted = sorted(set(int(i) for i in indices))
    outside = [i for i in wanted if not 0 <= i < firsts[-1]]
    if outside:
        raise UserError(f"no sample with index {outside[0]} in split {split!r} ({int(firsts[-1])} samples)",
                        hint="pick indices from 0 to the split's sample count - 1")
    found: dict[int, dict[str, Any]] = {}
    owner = np.searchsorted(firsts, wanted, side="right") - 1  # [k] the shard of each wanted index
    for number in sorted(set(owner.tolist())):
        shard = shards[number]
        local = [i - int(firsts[number]) for i, o in zip(wanted, owner.tolist()) if o == number]
        for i, sample in zip(local, _read_shard_samples(out, shard, local)):
            found[i + int(firsts[number])] = sample
    return [found[int(i)] for i in indices]


def _read_shard_samples(out: StoreLocation, shard: ShardInfo, local: list[int]) -> list[dict[str, Any]]:
    """The decoded samples at the sorted positions `local` of one shard, read through one open file."""
    where = f"shard {shard.path}"
    fix = f"`robowds verify {out}` checks every shard; export again to repair it"
    try:
        offsets = shard_index(shard, out.read_bytes).tolist()  # [samples + 1]
        samples = []
        with out.open(shard.path) as fh:
            if fh.seek(0, io.SEEK_END) != shard.bytes:  # cut or replaced: named as inspect names it
                check_length(shard, out.read_bytes(shard.path), offsets, out)
            for i in local:
                start, stop = offsets[i], offsets[i + 1]
                fh.seek(start)
                blob = fh.read(stop - start)
                try:
                    key, members = read_sample(memoryview(blob), where, start)
                    samples.append(decode_sample(key, unpack(members, where, start)))
                except ValueError as exc:  # ShardFormatError too: a damaged shard, named once with its byte
                    text = str(exc) if str(exc).startswith("shard ") else f"{where}: byte {start}: {exc}"
                    raise UserError(text, hint=fix) from exc
        return samples
    except RemoteStoreError as exc:
        raise UserError(str(exc), hint=exc.hint) from exc
    except ShardIndexError as exc:  # missing, or not the one the manifest lists
        raise UserError(exc.problem, hint=exc.fix) from exc
    except FileNotFoundError as exc:
        raise UserError(f"{where} is missing from {out}", hint=fix) from exc


def sampled_windows(out: StoreLocation, manifest: dict[str, Any], split: str, count: int,
                    seed: int) -> list[dict[str, Any]]:
    """The decoded windows of `pick_windows(manifest, split, count, seed)`, in sample-index order: what
    the report's window and overlay sections draw, so the same seed gives them the same windows."""
    return read_windows(out, manifest, split, pick_windows(manifest, split, count, seed))
