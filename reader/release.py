"""Letting go of the mapped shard pages a reader has consumed, so RSS stays flat over an epoch.

Local samples are zero-copy views of memory-mapped shards (`reader/source.py`). Every page a sample
touches stays mapped into the process (counted as RssFile, and by container limits and Kubernetes'
working set) until its mapping is unmapped, which happens only when no view of it is left: over one
epoch of a 1.3 GB raw-frame export RSS climbed to 1.66 GB. `ReleaseBehind` follows the samples in
the order they are handed out and, once a sample is `lag_bytes` (and `keep` samples) behind the
newest, asks the kernel to drop its pages from this process (`madvise(MADV_DONTNEED)` through
`ShardSource.release`).

Why that is safe while the user still holds arrays viewing those pages: shards are mapped read-only
and shared (`mmap.ACCESS_READ`: MAP_SHARED, PROT_READ), so MADV_DONTNEED only removes the page table
entries; the next access faults the same bytes in again from the page cache (or the file). Nothing is
ever written to these pages, so no content can be lost (tests/test_release_pages.py keeps an array,
drops its pages and compares every value). The page cache itself is left alone (no
`posix_fadvise(DONTNEED)`): other readers of the same shards, and the next epoch, still find the bytes
in memory. A dropped page still in use costs one minor fault when touched again; the lag makes that
rare (a batch is collated, i.e. copied, before its samples fall `keep` samples behind).

Ranges are widened to FAULT_AROUND-aligned blocks: a read fault maps the cached pages around the
faulting one too (Linux `fault_around_bytes`, 64 KiB by default), so a sample's read also maps its
neighbours' pages; dropping the whole block lets nothing a read mapped stay behind. Memory: one
(shard, start, stop) tuple per sample within the lag (neighbours in the same shard are merged).
"""

from __future__ import annotations

from collections import deque
from typing import Callable

FAULT_AROUND = 64 * 1024  # Linux's default fault_around_bytes: what one read fault may map
RELEASE_LAG_BYTES = 32 << 20  # consumed bytes kept mapped behind the newest sample (2x the read-ahead)

Release = Callable[[str, int, int], None]  # (shard path, start, stop): drop those pages of the mapping


class ReleaseBehind:
    """Consumed byte ranges, in the order they were handed out; the oldest are released once more than
    `lag_bytes` and more than `keep` samples are behind."""

    def __init__(self, release: Release, lag_bytes: int = RELEASE_LAG_BYTES, keep: int = 1) -> None:
        self.release, self.lag_bytes, self.keep = release, int(lag_bytes), max(1, int(keep))
        self._ranges: deque[list] = deque()  # [path, start, stop, samples, bytes]: FAULT_AROUND-aligned, merged
        self._bytes = 0  # consumed sample bytes in `_ranges`
        self._samples = 0  # samples in `_ranges`
        self.released = 0  # bytes handed to `release` (aligned), for tests and benchmarks

    def consumed(self, path: str, start: int, stop: int) -> None:
        """Sample bytes [start, stop) of shard `path` have been handed out."""
        low = start - start % FAULT_AROUND
        high = stop + (-stop) % FAULT_AROUND
        last = self._ranges[-1] if self._ranges else None
        if (last is not None and last[0] == path and low <= last[2] and high >= last[1]
                and last[4] < self.lag_bytes // 4):  # merged up to a quarter of the lag, so the oldest goes in time
            last[1], last[2] = min(last[1], low), max(last[2], high)  # touching: one range
            last[3], last[4] = last[3] + 1, last[4] + stop - start
        else:
            self._ranges.append([path, low, high, 1, stop - start])
        self._bytes += stop - start
        self._samples += 1
        while self._ranges and self._bytes > self.lag_bytes and self._samples - self._ranges[0][3] >= self.keep:
            path, low, high, samples, size = self._ranges.popleft()
            self._samples -= samples
            self._bytes -= size
            self.release(path, low, high)
            self.released += high - low

    def flush(self) -> None:
        """Release everything still held (the pass has ended)."""
        while self._ranges:
            path, low, high, _, _ = self._ranges.popleft()
            self.release(path, low, high)
            self.released += high - low
        self._bytes = self._samples = 0
