"""`ShardIndex`: random access to one split of an export, a map-style dataset over its shard indexes.

`ds[i]` is sample i of the split's concatenated shard order (the order of `ShardDataset(shuffle=False)`),
located through the shard's `<shard>.tar.idx` offsets and decoded by the same code iteration uses
(`SampleReads.locate` / `decode`, field selection included), so it is exactly what iteration
yields for that sample. Use it with any sampler:

    ds = ShardIndex("OUT", "train", fields=["joints", "actions"])
    loader = DataLoader(ds, batch_size=32, sampler=DistributedSampler(ds), collate_fn=collate, num_workers=2)

Costs: a lookup by position is a bisect over the shards' first ids (O(log shards)), the shard's index
read once (then cached, as iteration caches it: `ShardSource.offsets`) and one read of the sample's
bytes: a view of the mapped shard when local, one ranged request when remote (random order gives no
neighbours to coalesce). Memory: O(shards) plus the bounded index cache; a local sample's mapped pages
are dropped from RSS once 16-32 MiB of later samples were read (`reader/release.py`).

Lookup by key (`by_key`, `position`): keys are `<episode>_<anchor>`, but the export shuffles windows
across a split's shards, so no key says which shard holds it. Exports since key indexes list one per
split (`<split>.keys`, `reader/keys.py`): a lookup is a binary search of its key hashes by ranged
reads (O(log samples): ~18 8-byte reads at 100M samples the first time, ~4 once the search's upper
levels are cached, at most 2**14 of them per process), then one header read that confirms the key.
Memory: bounded by that cache, whatever the export's size; the first lookup reads one shard's offset
index, not every shard's.

Shards the key index does not cover (exports made before key indexes, and appends to those; its
`shards` count says how many it covers) are searched as before: each shard's key -> position map is built
only when a lookup first needs it, from its samples' tar headers (the key is the member name before
the first dot: one 512-byte header per sample, a view when local, whose mapped pages are dropped
again once the shard is read, one ranged read per sample in READ_THREADS threads when remote),
shards scanned in order until the key is found. Such a lookup costs O(samples of the shards scanned
before it) header reads the first time and a dict lookup per cached shard after; the maps are kept
up to KEY_CACHE_ENTRIES keys (least recently used shard out: ~100 B per key, ~50 MB). Exporting
again writes the index.
"""

from __future__ import annotations

import bisect
import os
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

from torch.utils.data import Dataset

from robowds.reader.dataset import ShardDataset
from robowds.reader.format import BLOCK, MAX_NAME_BYTES
from robowds.reader.keys import FILES_PREFIX, KeyIndex
from robowds.reader.layout import SampleDecoder
from robowds.reader.manifest import ShardInfo
from robowds.reader.release import ReleaseBehind
from robowds.reader.sample_reads import READ_THREADS
from robowds.reader.select import make_decoder
from robowds.reader.source import ShardReadError, ShardSource

KEY_CACHE_ENTRIES = 1 << 19  # keys kept in per-shard maps (LRU by shard)


class ShardIndex(Dataset):
    """Samples of one split by position (`ds[i]`, i in [0, len(ds))) or by key (`ds.by_key(key)`).

    The options mean what they mean for `ShardDataset` (`fields`/`exclude`, `transform` with the
    per-sample generator of (`seed`, `epoch`, key), `video_layout`, `verify`, `remote=Remote(...)`); errors are
    raised (a map-style dataset has no sample to skip to). Picklable for DataLoader workers: each
    process opens its own shards on first use."""

    def __init__(self, source: str | os.PathLike[str], split: str = "train", fields: list[str] | None = None, *,
                 exclude: list[str] | None = None, transform: Any = None, seed: int = 0, epoch: int = 0,
                 **options: Any) -> None:
        # the iteration dataset in plan order 0..N-1 on one rank: its locate and decode are reused as they are
        self.dataset = ShardDataset(source, split, shuffle=False, seed=seed, rank=0, world_size=1, fields=fields,
                                    exclude=exclude, transform=transform, on_error="raise", **options)
        self.dataset.set_epoch(epoch)
        self._reads = self.dataset.reads()  # how ids become samples at this epoch: built once, not per lookup
        self.split = split
        self._open: tuple[int, ShardSource, SampleDecoder] | None = None  # (pid, source, decoder) per process
        self._keys: OrderedDict[int, dict[str, int]] = OrderedDict()  # shard -> key -> sample in shard
        self._cached_keys = 0
        self._key_file: tuple[int, KeyIndex] | None = None  # (pid, the split's key index) per process
        self._behind: ReleaseBehind | None = None  # samples read, their pages dropped once far behind

    @property
    def manifest(self) -> dict[str, Any]:
        return self.dataset.manifest

    def set_epoch(self, epoch: int) -> None:
        """The epoch `transform`'s per-sample generator sees (as in iteration)."""
        self.dataset.set_epoch(epoch)
        self._reads = self.dataset.reads()

    def __len__(self) -> int:
        return self.dataset._first[-1]

    def __getitem__(self, i: int) -> dict[str, Any]:
        n = len(self)
        index = int(i)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"sample {i} is outside split {self.split!r} ({n} samples)")
        source, decoder = self._reader()
        shard, start, stop = self._reads.locate(index, source)
        sample = self._reads.decode(source, decoder, shard, start, stop - start, (shard.path, stop))
        assert sample is not None  # on_error="raise"
        if self._behind is not None:  # its mapped pages leave RSS once far enough behind (reader/release.py)
            self._behind.consumed(shard.path, start, stop)
        return sample

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_open"], state["_keys"], state["_cached_keys"], state["_key_file"] = None, OrderedDict(), 0, None
        state["_behind"] = None
        return state

    def _reader(self) -> tuple[ShardSource, SampleDecoder]:
        """This process's source and decoder (a forked worker opens its own: mapped files and remote
        clients are not shared across processes)."""
        if self._open is None or self._open[0] != os.getpid():
            ds = self.dataset
            source = ShardSource(ds.base, ds.storage_options, ds.verify, ds.retry, cache=ds.cache, shards=ds.shards,
                                 max_request_bytes=ds.max_request_bytes, jitter_key=f"index/{os.getpid()}")
            self._open = (os.getpid(), source, make_decoder(ds.members, ds.keep))
            self._keys, self._cached_keys = OrderedDict(), 0
            self._behind = ReleaseBehind(source.release) if source.mapped else None
        return self._open[1], self._open[2]

    # -- by key ----------------------------------------------------------------------------------
    def by_key(self, key: str) -> dict[str, Any]:
        """The sample whose `__key__` is `key` (KeyError if the split has none)."""
        return self[self.position(key)]

    def position(self, key: str) -> int:
        """The position of `key` in the split: from the split's key index where it has one (each
        candidate confirmed by its sample's header), else, and in shards the index does not cover,
        cached shards first, then the others in order, each one's map built from its headers when
        first scanned."""
        covered = 0  # shards the key index covers: a key not found in it is in none of them
        keys = self._key_index()
        if keys is not None:
            index, covered = keys
            for found in index.candidates(key):
                if found < self.dataset._first[covered] and self._key_at(found) == key:
                    return found
        for k in list(self._keys):
            found = self._keys[k].get(key)
            if found is not None:
                self._keys.move_to_end(k)
                return self.dataset._first[k] + found
        for k in range(covered, len(self.dataset.shards)):
            if k in self._keys:
                continue
            found = self._shard_keys(k).get(key)
            if found is not None:
                return self.dataset._first[k] + found
        raise KeyError(f"no sample {key!r} in split {self.split!r}")

    def positions(self) -> Iterator[tuple[str, int]]:
        """(key, position) of every sample in order, read from the headers shard by shard (not cached)."""
        for k in range(len(self.dataset.shards)):
            base = self.dataset._first[k]
            for i, key in enumerate(self._read_keys(self.dataset.shards[k])):
                yield key, base + i

    def _shard_keys(self, k: int) -> dict[str, int]:
        """Shard k's key -> sample map, built and cached (LRU, KEY_CACHE_ENTRIES keys in all)."""
        keys = {key: i for i, key in enumerate(self._read_keys(self.dataset.shards[k]))}
        self._keys[k] = keys
        self._cached_keys += len(keys)
        while self._cached_keys > KEY_CACHE_ENTRIES and len(self._keys) > 1:
            self._cached_keys -= len(self._keys.popitem(last=False)[1])
        return keys

    def _key_index(self) -> tuple[KeyIndex, int] | None:
        """This process's reader of the split's key index and the shards it covers (None: the export
        has none for this split)."""
        entry = self.manifest.get("files", {}).get(FILES_PREFIX + self.split)
        if entry is None:
            return None
        source, _ = self._reader()
        if self._key_file is None or self._key_file[0] != os.getpid():
            self._key_file = (os.getpid(), KeyIndex(entry["path"], int(entry["samples"]),
                                                    lambda start, stop: source.read_file(entry["path"], start, stop)))
        covered = min(int(entry["shards"]), len(self.dataset.shards))
        return self._key_file[1], covered

    def _key_at(self, position: int) -> str:
        """The key of the sample at `position`, from its first tar header (one 512-byte read)."""
        k = bisect.bisect_right(self.dataset._first, position) - 1
        shard = self.dataset.shards[k]
        source, _ = self._reader()
        offsets = source.offsets(shard)  # [samples + 1]
        return self._header_key(source, shard, offsets[position - self.dataset._first[k]])

    @staticmethod
    def _header_key(source: ShardSource, shard: ShardInfo, start: int) -> str:
        """The key named by the tar header at byte `start` of `shard`: its member name before the first dot."""
        buf, at = source.span(shard.path, start, start + BLOCK)
        name = bytes(buf[at:at + MAX_NAME_BYTES]).split(b"\0", 1)[0]
        if b"." not in name:
            raise ShardReadError(f"shard {shard.path}: byte {start}: no member name <key>.<field>.<ext> here")
        return name.split(b".", 1)[0].decode("utf-8")

    def _read_keys(self, shard: ShardInfo) -> list[str]:
        """The keys of `shard`'s samples in order: [samples] from their first tar headers."""
        source, _ = self._reader()
        offsets = source.offsets(shard)  # [samples + 1]

        def key_at(i: int) -> str:
            return self._header_key(source, shard, offsets[i])

        if source.mapped:
            keys = [key_at(i) for i in range(shard.samples)]
            source.release(shard.path, 0, shard.bytes)  # one page per header read: out of RSS again
            return keys
        with ThreadPoolExecutor(READ_THREADS) as pool:
            return list(pool.map(key_at, range(shard.samples)))
