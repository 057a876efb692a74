"""Request spans: the byte ranges of samples about to be read, in plan order, grouped into fewer and
larger ranged requests. Pure: no I/O, no state.

Why: against object storage every request pays a round trip (20-100 ms), whatever its size, so one
GET per 12 KB sample is latency-bound (625 GETs for 625 samples). The reader knows the plan, so it
knows which samples come next and where each lies: samples of one shard that lie close together
(adjacent, or separated by at most `max_gap_bytes` of other samples' bytes, which are read and
dropped) become one request, bounded by `max_request_bytes` so that a request's bytes (held until its
samples are decoded) and the cost of retrying it stay small. Within one look-ahead window the plan
reads from a few shards at a time (it permutes blocks of consecutive samples), so unshuffled reads
become one request per `max_request_bytes` and shuffled ones one per cluster of nearby samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence


@dataclass(frozen=True)
class Span:
    """One ranged request: bytes [start, stop) of the object `key`, covering the samples `members`
    (indices into the input, ascending: plan order)."""

    key: Hashable
    start: int
    stop: int
    members: tuple[int, ...]

    @property
    def size(self) -> int:
        return self.stop - self.start


def request_spans(ranges: Sequence[tuple[Hashable, int, int]], max_request_bytes: int,
                  max_gap_bytes: int = 0) -> list[Span]:
    """Group sample ranges [(key, start, stop)] (in plan order) into request spans.

    Guarantees (tests/test_reader_spans.py checks them with hypothesis):
    - every input index is a member of exactly one span, whose key equals its key and whose
      [start, stop) contains its range;
    - a span of two or more members is at most `max_request_bytes` long (a single sample larger
      than that is one span of its own size); `max_request_bytes <= 0` gives one span per sample;
    - between consecutive members (in byte order) of a span lie at most `max_gap_bytes` bytes that
      no member needs, so the bytes read and dropped are bounded;
    - spans come in plan order: sorted by their first member, so the request the next sample
      needs is issued first.

    Samples of one key are sorted by offset and swept once, greedily: O(n log n) for n ranges."""
    by_key: dict[Hashable, list[int]] = {}
    for i, (key, start, stop) in enumerate(ranges):
        if stop < start:
            raise ValueError(f"range {i} of {key!r} ends before it starts: {start}-{stop}")
        by_key.setdefault(key, []).append(i)
    spans: list[Span] = []
    for key, indices in by_key.items():
        indices.sort(key=lambda i: (ranges[i][1], ranges[i][2]))
        members: list[int] = []
        low = high = 0
        for i in indices:
            _, start, stop = ranges[i]
            if members and max_request_bytes > 0 and start - high <= max_gap_bytes \
                    and max(high, stop) - low <= max_request_bytes:
                members.append(i)
                high = max(high, stop)
                continue
            if members:
                spans.append(Span(key, low, high, tuple(sorted(members))))
            members, low, high = [i], start, stop
        if members:
            spans.append(Span(key, low, high, tuple(sorted(members))))
    spans.sort(key=lambda s: s.members[0])
    return spans
