"""The key index of a split (`<split>.keys`): a sample's position from its key in O(log n) reads.

Keys are `<episode>_<anchor:06d>`, but export shuffles windows across a split's shards, so no key says
which shard holds it, and a shard's samples are not sorted by key. Export therefore writes, per
split, one file of `2 * samples` little-endian uint64: first every sample's key hash in ascending
order, then, entry for entry, the sample's position in the split (ties in position order):

    hash(key) = int.from_bytes(blake2b(key.encode("utf-8"), digest_size=8,
                                       person=b"robowds.keys.v1").digest(), "little")

The manifest lists it under `files` as `keys.<split>` (`path`, `bytes`, `sha256`, `samples`, and
`shards`: how many of the split's first shards it covers; `export --append` rewrites it), so
`verify` checks its sha256 like any side file and publish places and removes it with the export.

`KeyIndex.candidates(key)` binary-searches the hashes with ranged reads: the search's upper levels
(CACHED_LEVELS, at most 2**14 probes of 8 bytes: ~1.5 MB of Python ints at most, whatever the export's
size) are kept, the rest read (about log2(samples / KEY_BLOCK) 8-byte reads, then one read of at most
KEY_BLOCK hashes, 4 KiB, and one of the matching positions). At 100M samples that is ~18 probes for
the first lookup and ~4 once the upper levels are cached; nothing grows with the export but the
file (16 bytes a sample: 1.6 GB at 100M, read only where the search looks). The reader does not hash
the whole file (that would make the first lookup O(samples)): each candidate is confirmed against the
key in its sample's tar header (`ShardIndex.position`), so a damaged index can never return another
sample; `robowds verify` checks its sha256.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterable

import numpy as np

KEYS_PERSON = b"robowds.keys.v1"  # BLAKE2b personalisation: the hash is this file's alone
KEY_INDEX_DTYPE = np.dtype("<u8")
KEY_BLOCK = 512  # hashes read at once when the search has narrowed to this many (4 KiB)
CACHED_LEVELS = 14  # upper levels of the search kept per index: at most 2**14 - 1 probes
FILES_PREFIX = "keys."  # the manifest's `files` name of a split's key index: `keys.<split>`


class KeyIndexError(IOError):
    """A key index that cannot be read as the manifest lists it (names the file and the fix)."""


def key_index_path(split: str) -> str:
    """Where a split's key index lives, relative to the export (next to `<split>.wids.json`)."""
    return f"{split}.keys"  # not `.idx`: tools take `*.idx` for Energon's tar indexes


def key_hash(key: str) -> int:
    """The 64-bit hash of a sample key the index is sorted by."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8, person=KEYS_PERSON).digest(), "little")


def key_hashes(keys: Iterable[str]) -> np.ndarray:
    """`key_hash` of each key, in order: [n] uint64."""
    return np.fromiter((key_hash(k) for k in keys), dtype=np.uint64)


def encode_key_index(hashes: np.ndarray) -> bytes:
    """The file for samples whose key hashes in position order are `hashes` [N] uint64: the hashes
    sorted, then the position of each (a stable sort: equal hashes in position order). Memory: 24 bytes
    a sample while it is built (2.4 GB at 100M samples in one split)."""
    order = np.argsort(hashes, kind="stable")  # [N] positions by (hash, position)
    return hashes[order].astype(KEY_INDEX_DTYPE).tobytes() + order.astype(KEY_INDEX_DTYPE).tobytes()


class KeyIndex:
    """Lookups in one split's key index; `read(start, stop)` gives bytes [start, stop) of the file."""

    def __init__(self, path: str, samples: int, read: Callable[[int, int], bytes]) -> None:
        self.path, self.samples, self._read = path, int(samples), read
        self._probes: dict[int, int] = {}  # entry -> hash, for the search's upper CACHED_LEVELS levels
        self.reads = 0  # ranged reads of the file (for tests and benchmarks)

    def candidates(self, key: str) -> list[int]:
        """Positions whose key hash is key's (almost always none or one; the caller checks the key)."""
        wanted = key_hash(key)
        lo, hi, level = 0, self.samples, 0  # the first entry >= wanted is in [lo, hi]
        while hi - lo > KEY_BLOCK:
            mid = (lo + hi) // 2
            value = self._probes.get(mid)
            if value is None:
                value = int(self._entries(mid, mid + 1)[0])
                if level < CACHED_LEVELS:
                    self._probes[mid] = value
            lo, hi = (mid + 1, hi) if value < wanted else (lo, mid)
            level += 1
        found: list[int] = []
        start = lo
        while start < self.samples:  # equal hashes may run past the block (a collision): read on
            block = self._entries(start, min(self.samples, start + KEY_BLOCK))  # [<= KEY_BLOCK] uint64
            first = start + int(np.searchsorted(block, np.uint64(wanted), side="left"))
            last = start + int(np.searchsorted(block, np.uint64(wanted), side="right"))
            if last > first:
                positions = self._entries(self.samples + first, self.samples + last)  # [matches] uint64
                found.extend(int(p) for p in positions)
            if last < start + len(block):  # an entry past wanted is in the block: no more matches
                break
            start += len(block)
        return found

    def _entries(self, start: int, stop: int) -> np.ndarray:
        """Entries [start, stop) of the file: [stop - start] uint64."""
        size = KEY_INDEX_DTYPE.itemsize
        try:
            data = self._read(start * size, stop * size)
        except FileNotFoundError as exc:
            raise KeyIndexError(f"key index {self.path} is missing (the manifest lists it); fix: restore it from the "
                                "export it came with, or export again") from exc
        self.reads += 1
        if len(data) != (stop - start) * size:
            raise KeyIndexError(f"key index {self.path}: {len(data)} bytes at byte {start * size}, wanted "
                                f"{(stop - start) * size} (truncated; the manifest lists {self.samples} samples); "
                                "fix: restore it from the export it came with, or export again")
        return np.frombuffer(data, dtype=KEY_INDEX_DTYPE)
