"""Request spans (reader/spans.py): whatever the plan order and sample sizes, every sample is in exactly
one request that contains its bytes, no request of several samples exceeds the bound, the bytes read
and dropped between samples stay under the gap bound, and requests come in plan order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robowds.reader.spans import request_spans


@st.composite
def planned_ranges(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    """Sample ranges of a few shards in a shuffled plan order (repeats allowed: `pad` repeats samples)."""
    shards = []
    for s in range(draw(st.integers(1, 4))):
        sizes = draw(st.lists(st.integers(1, 5000), min_size=1, max_size=30))
        offsets = [0]
        for size in sizes:
            offsets.append(offsets[-1] + size)
        shards.append([(f"shard-{s}", a, b) for a, b in zip(offsets, offsets[1:])])
    pool = [r for shard in shards for r in shard]
    picks = draw(st.lists(st.integers(0, len(pool) - 1), min_size=0, max_size=60))
    return [pool[i] for i in picks]


@given(planned_ranges(), st.integers(-1, 20000), st.integers(0, 3000))
@settings(max_examples=200, deadline=None)
def test_spans_cover_each_sample_once_bounded_and_in_plan_order(
        ranges: list[tuple[str, int, int]], bound: int, gap: int) -> None:
    spans = request_spans(ranges, bound, gap)
    members = [i for span in spans for i in span.members]
    assert sorted(members) == list(range(len(ranges)))  # each sample exactly once
    for span in spans:
        assert list(span.members) == sorted(span.members)
        for i in span.members:
            key, start, stop = ranges[i]
            assert key == span.key and span.start <= start <= stop <= span.stop
        if len(span.members) > 1:
            assert 0 < span.size <= bound
        else:
            assert (span.start, span.stop) == ranges[span.members[0]][1:]
        # bytes no member needs: the span minus the union of its members, piece by piece <= gap
        covered = sorted(ranges[i][1:] for i in span.members)
        assert covered[0][0] == span.start and max(b for _, b in covered) == span.stop
        reach = covered[0][1]
        for start, stop in covered[1:]:
            assert start - reach <= gap
            reach = max(reach, stop)
    firsts = [span.members[0] for span in spans]
    assert firsts == sorted(firsts)  # requests in plan order


def test_adjacent_samples_become_one_request_per_bound() -> None:
    """Unshuffled: 10 adjacent 1000-byte samples with a 4000-byte bound are 3 requests (4 + 4 + 2)."""
    ranges = [("a", 1000 * i, 1000 * (i + 1)) for i in range(10)]
    spans = request_spans(ranges, 4000)
    assert [(s.start, s.stop, s.members) for s in spans] == [
        (0, 4000, (0, 1, 2, 3)), (4000, 8000, (4, 5, 6, 7)), (8000, 10000, (8, 9))]
    assert [s.members for s in request_spans(ranges, 0)] == [(i,) for i in range(10)]


def test_interleaved_shards_and_gaps() -> None:
    """Plan order a0 b0 a2 b1 a1: the a-samples form one request (a1 fills the gap), the b-samples
    another; with no gap allowed, a sample two places away is its own request."""
    ranges = [("a", 0, 10), ("b", 0, 10), ("a", 20, 30), ("b", 10, 20), ("a", 10, 20)]
    assert [(s.key, s.start, s.stop, s.members) for s in request_spans(ranges, 100)] == [
        ("a", 0, 30, (0, 2, 4)), ("b", 0, 20, (1, 3))]
    without_a1 = ranges[:4]
    assert [(s.key, s.members) for s in request_spans(without_a1, 100, 0)] == [
        ("a", (0,)), ("b", (1, 3)), ("a", (2,))]
    assert [(s.key, s.members) for s in request_spans(without_a1, 100, 10)] == [("a", (0, 2)), ("b", (1, 3))]


def test_a_sample_larger_than_the_bound_is_one_request_alone() -> None:
    spans = request_spans([("a", 0, 10), ("a", 10, 5000), ("a", 5000, 5010)], 100)
    assert [(s.start, s.stop, s.members) for s in spans] == [(0, 10, (0,)), (10, 5000, (1,)), (5000, 5010, (2,))]
    with pytest.raises(ValueError, match="ends before it starts"):
        request_spans([("a", 10, 5)], 100)
