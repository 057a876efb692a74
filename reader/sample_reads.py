"""Reading and decoding one pass's samples by id: where a sample lies, the read-ahead window, decoding,
the transform, and letting go of what was read. `ShardDataset` drives it for iteration and `ShardIndex`
for random access, so both hand out exactly the same sample for the same id and epoch.

Why its own module: the dataset holds the plan and the cursor (which ids, in which order, and how
far); this holds how a planned id becomes a sample. A `SampleReads` is fixed at the start of a pass
(the epoch its transform draws from included), so nothing here reads the dataset's mutable state.
Memory: the window of at most READ_AHEAD samples and READ_AHEAD_BYTES, plus `ReleaseBehind`'s
consumed ranges (one tuple per sample within its lag).
"""

from __future__ import annotations

import bisect
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from robowds.reader.dataset_args import sample_rng
from robowds.reader.format import ShardFormatError
from robowds.reader.heartbeat import Heartbeat, Pulse
from robowds.reader.layout import SampleDecoder
from robowds.reader.manifest import ShardInfo
from robowds.reader.members import MemberSet
from robowds.reader.release import ReleaseBehind
from robowds.reader.select import make_decoder
from robowds.reader.source import ShardReadError, ShardSource

READ_AHEAD = 64  # at most this many samples read ahead of decoding ...
READ_AHEAD_BYTES = 16 << 20  # ... and at most this many bytes (at least one sample)
READ_THREADS = 8  # remote reads in flight (they wait on the network, not the CPU)
Transform = Callable[[dict[str, Any], np.random.Generator], dict[str, Any]]


@dataclass(frozen=True)
class SampleReads:
    """How sample ids of one split become samples during one pass (or one epoch of random access)."""

    shards: list[ShardInfo]
    first: list[int]  # [S+1] first sample id of each shard
    members: MemberSet | None  # what every sample must hold, and how (the split's layout)
    keep: frozenset[str] | None  # fields decoded (None: all)
    cameras: list[str]  # video fields handed out [T, C, H, W] (the TCHW layout)
    on_error: str  # "raise" or "skip"
    transform: Transform | None
    seed: int
    epoch: int  # the epoch the transform's per-sample generator draws from
    heartbeat: Heartbeat | None = None  # a ShardLoader worker's record of what it reads (reader/heartbeat.py)
    keep_behind: int = 1  # samples kept mapped behind the newest (the batch size: collated before they go)
    release_pages: bool = True  # off only in bench_read's page-release A/B

    def decoder(self) -> Any:
        """A fresh decoder for these fields (it learns member layouts as it goes: one per pass)."""
        return make_decoder(self.members, self.keep)

    def samples(self, source: ShardSource, ids: Iterator[int], raw: bool = False) -> Iterator[dict[str, Any] | None]:
        """Decoded samples of `ids` in order (None = skipped). Reads run ahead of decoding: remote ones
        as coalesced requests in READ_THREADS threads (the GIL is released while they wait;
        `ShardSource.read_ahead`), local and node-cached ones by up to READ_AHEAD samples and
        READ_AHEAD_BYTES as read-ahead hints to the kernel for the mapped shard (and downloads into the
        node cache), so disk or network time overlaps decoding. Samples that repeat the member layout
        of an earlier one decode through that layout (`reader/layout.py`); the others through the
        checked tar walk. With `raw` (and every field decoded) a matched sample's fixed-shape arrays
        are `RawArray`s, for `Collate` to copy into the batch.
        A sample whose shard index cannot be had (missing, refused) is an error entry in the window,
        raised or skipped in its turn like a bad sample."""
        decoder = self.decoder()
        raw = raw and isinstance(decoder, SampleDecoder)
        pulse = self.heartbeat.pulse(self.shards) if self.heartbeat is not None else None
        if not source.mapped:
            for shard, start, size, pending in source.read_ahead(ids, lambda i: self.locate(i, source), READ_THREADS):
                yield self.decode(source, decoder, shard, start, size, pending, raw, pulse)
            return
        window: deque[tuple[Any, int, int, Any]] = deque()  # (shard, start, size, (path, stop) | error)
        behind = ReleaseBehind(source.release, keep=self.keep_behind) if self.release_pages else None
        ahead = 0  # bytes in `window`
        upcoming = iter(ids)
        waiting = next(upcoming, None)  # the next sample id not yet in `window`
        while True:
            while waiting is not None and len(window) < READ_AHEAD:
                try:
                    shard, start, stop = self.locate(waiting, source)
                except ShardReadError as exc:
                    window.append((None, 0, 0, exc))
                    waiting = next(upcoming, None)
                    continue
                if window and ahead + stop - start > READ_AHEAD_BYTES:
                    break
                if self.keep is None:  # with fields selected, the skipped members' bytes are never read
                    source.prefetch(shard.path, start, stop)
                window.append((shard, start, stop - start, (shard.path, stop)))
                ahead += stop - start
                waiting = next(upcoming, None)
            if not window:
                return
            shard, start, size, pending = window.popleft()
            ahead -= size
            yield self.decode(source, decoder, shard, start, size, pending, raw, pulse)
            if shard is not None and behind is not None:  # its pages leave RSS once far behind (reader/release.py)
                behind.consumed(shard.path, start, start + size)

    def decode(self, source: ShardSource, decoder: Any, shard: Any, start: int, size: int,
               pending: Any, raw: bool = False, pulse: Pulse | None = None) -> dict[str, Any] | None:
        """One sample; `pulse` (in a ShardLoader's worker) records its start and its decoding."""
        if isinstance(pending, ShardReadError):  # its shard's index could not be had
            if self.on_error == "skip":
                return None
            raise pending
        if pulse is not None:
            pulse.reading(shard, start)
        try:
            buf, offset = pending.result() if isinstance(pending, Future) else source.span(pending[0], start, pending[1])
            where = f"shard {shard.path}"
            sample = (decoder.decode(buf, offset, offset + size, where, start, raw=True) if raw
                      else decoder.decode(buf, offset, offset + size, where, start))
            for name in self.cameras:
                sample[name] = sample[name].transpose(0, 3, 1, 2)  # [T, H, W, C] -> [T, C, H, W] (a view)
        except (ShardFormatError, ShardReadError, ValueError, OSError) as exc:
            if self.on_error == "skip":
                return None
            message = str(exc) if str(exc).startswith("shard ") else f"shard {shard.path}: byte {start}: {exc}"
            raise ShardReadError(message) from exc
        if pulse is not None:
            pulse.decoded(sample["__key__"])
        if self.transform is not None:
            sample = self.transform(sample, sample_rng(self.seed, self.epoch, sample["__key__"]))
        return sample

    def locate(self, sample_id: int, source: ShardSource) -> tuple[Any, int, int]:
        """(shard, start, stop) of a sample: its shard's offset index comes from `source`, read when
        the shard is first read (`ShardSource.offsets`)."""
        k = bisect.bisect_right(self.first, sample_id) - 1  # not np.searchsorted: it releases the GIL,
        # and taking it back from the read-ahead threads cost ~15 us per sample (cProfile, large samples)
        shard = self.shards[k]
        offsets = source.offsets(shard)  # [samples + 1]
        i = sample_id - self.first[k]
        return shard, offsets[i], offsets[i + 1]
