"""Letting go of the mapped shard pages a reader has consumed, so RSS stays flat over an epoch.

Local samples are zero-copy views of memory-mapped shards (`reader/source.py`). Every page a sample
touches stays mapped into the process (counted as RssFile, and by container limits and Kubernetes'
working set) until its mapping is unmapped, which happens only when no view of it is left: over one
epoch of a 1.3 GB raw-frame export RSS climbed to 1.66 GB. `ReleaseBehind` follows the samples in
the order they are handed out and, once a sample is `lag_bytes` + `chunk_bytes` (and `keep` samples)
behind the newest, asks the kernel to drop its pages from this process (`madvise(MADV_DONTNEED)`
through `ShardSource.release`).

Why that is safe while the user still holds arrays viewing those pages: shards are mapped read-only
and shared (`mmap.ACCESS_READ`: MAP_SHARED, PROT_READ), so MADV_DONTNEED only removes the page table
entries; the next access faults the same bytes in again from the page cache (or the file). Nothing is
ever written to these pages, so no content can be lost (tests/test_release_pages.py keeps an array,
drops its pages and compares every value). The page cache itself is left alone (no
`posix_fadvise(DONTNEED)`): other readers of the same shards, and the next epoch, still find the bytes
in memory. A dropped page still in use costs one minor fault when touched again; the lag makes that
rare (a batch is collated, i.e. copied, before its samples fall `keep` (the batch size) behind).

Ranges are widened to FAULT_AROUND-aligned blocks: a read fault maps the cached pages around the
faulting one too (Linux `fault_around_bytes`, 64 KiB by default), so a sample's read also maps its
neighbours' pages; dropping the whole block lets nothing a read mapped stay behind.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

FAULT_AROUND = 64 * 1024  # Linux's default fault_around_bytes: what one read fault may map
RELEASE_LAG_BYTES = 16 << 20  # consumed bytes kept mapped behind the newest sample (the read-ahead's size)
RELEASE_CHUNK_BYTES = 16 << 20  # released together, once this much more than the lag is behind

Release = Callable[[str, int, int], None]  # (shard path, start, stop): drop those pages of the mapping


class ReleaseBehind:
    """Consumed byte ranges, in the order they were handed out. Once `lag_bytes` + `chunk_bytes` are
    behind, the oldest go until `lag_bytes` (and at least `keep` samples) are left: one release per
    shard, of the span from the first to the last byte of its ranges going.

    Why spans, a chunk at a time: one madvise is a system call and a TLB flush (1-8 us measured on the
    2-core VM; zapping a large folio's page table entries is cheap), against ~150 us to read a 500 KB
    sample. A span may cover samples consumed more recently, or not yet: their pages are dropped too,
    which is safe (they fault back in when touched). What releasing does cost (~11% of a touch-only
    zero-copy pass's CPU, paired A/B in `scripts/bench_read.py --release-only`) is mostly not the
    calls: about half is the widened blocks' pages of neighbours not read yet faulting in a second
    time. That is the price of flat RSS: releasing only each sample's own pages faults no page twice,
    but keeps the neighbours' pages a read mapped until those are read, or forever where this reader
    never reads them, a growth with the export's size (docs/benchmark-runs/read.md).
    Memory: one tuple per sample within lag + chunk."""

    def __init__(self, release: Release, lag_bytes: int = RELEASE_LAG_BYTES, keep: int = 1,
                 chunk_bytes: int = RELEASE_CHUNK_BYTES) -> None:
        self.release, self.lag_bytes, self.keep = release, int(lag_bytes), max(1, int(keep))
        self.chunk_bytes = int(chunk_bytes)
        self._limit = self.lag_bytes + self.chunk_bytes  # behind more than this: release down to the lag
        self._ranges: deque[tuple[str, int, int]] = deque()  # (path, start, stop) as handed out, oldest first
        self._bytes = 0  # consumed sample bytes in `_ranges`
        self.released = 0  # bytes handed to `release` (aligned spans), for tests and benchmarks

    def consumed(self, path: str, start: int, stop: int) -> None:
        """Sample bytes [start, stop) of shard `path` have been handed out. Called once per sample, so
        it only records the range (~0.5 us); aligning and grouping wait for `_release_oldest`, once per
        chunk."""
        self._ranges.append((path, start, stop))
        self._bytes += stop - start
        if self._bytes > self._limit and len(self._ranges) > self.keep:
            self._release_oldest()

    def _release_oldest(self) -> None:
        """Release the oldest ranges until `lag_bytes` (and at least `keep` samples) are left: one
        FAULT_AROUND-aligned span per shard."""
        spans: dict[str, list[int]] = {}  # shard -> [first byte, end] of its ranges going now
        ranges = self._ranges
        while self._bytes > self.lag_bytes and len(ranges) > self.keep:
            path, start, stop = ranges.popleft()
            self._bytes -= stop - start
            span = spans.get(path)
            if span is None:
                spans[path] = [start, stop]
            else:
                span[0], span[1] = min(span[0], start), max(span[1], stop)
        for path, (low, high) in spans.items():
            low, high = low - low % FAULT_AROUND, high + (-high) % FAULT_AROUND
            self.release(path, low, high)
            self.released += high - low
