"""Remote sample bytes in plan order, fetched ahead as coalesced ranged requests.

The reader knows the plan, so it knows which samples come next and where each lies. This module looks
ahead in that order (up to `lookahead` samples and `lookahead_bytes`), groups the samples it sees into
request spans (`reader/spans.py`: one GET for samples of a shard that lie close together, at most
`max_request_bytes`), fetches the spans in a thread pool (the GIL is released while they wait on the
network) and hands each sample back in plan order as a future of its own bytes. A new group is
planned when half of the previous one has been handed out, so the network never idles while the
consumer decodes, and the bytes held stay under about two look-ahead windows.

A span whose request fails for good fails all its samples with that request's error (which names
shard, byte range and URL), except where the failure may not concern every sample: `alone(exc)`
(a truncated object: the samples before the cut are intact) sends each sample as its own request,
so exactly the unreadable ones fail or are skipped.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Hashable, Iterator, TypeVar

from robowds.reader.spans import Span, request_spans

S = TypeVar("S")  # whatever identifies a shard to the caller (a ShardInfo)
Read = Callable[[S, int, int], tuple[Any, int]]  # (shard, start, stop) -> (buffer, where start is in it)

MAX_REQUEST_BYTES = 4 << 20  # default bound of one coalesced request (Remote(max_request_bytes=))
LOOKAHEAD = 1024  # samples planned ahead (positions are cheap; the bytes bound below is what matters)
LOOKAHEAD_BYTES = 16 << 20  # sample bytes planned ahead (at least one sample)
MAX_GAP_BYTES = 64 << 10  # bytes of other samples a request may read and drop to join two samples


def fetch_in_order(entries: Iterator[tuple[S, int, int] | BaseException], read: Read, *,
                   key: Callable[[S], Hashable], threads: int, max_request_bytes: int,
                   max_gap_bytes: int = MAX_GAP_BYTES, lookahead: int = LOOKAHEAD,
                   lookahead_bytes: int = LOOKAHEAD_BYTES,
                   alone: Callable[[BaseException], bool] = lambda exc: False,
                   ) -> Iterator[tuple[S | None, int, int, Future | BaseException]]:
    """For each entry, in order: (shard, start, size, future of (buffer, offset)); an entry that is
    an exception (its sample could not be located) comes back as (None, 0, 0, exception).

    `max_request_bytes` <= 0 reads every sample as its own request. The pool is shut down when the
    generator ends or is closed (pending requests cancelled, running ones finish)."""
    pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="robowds-fetch")
    window: deque[tuple[Any, int, int, Any]] = deque()  # (shard, start, size, Future | exception)
    held = 0  # sample bytes in `window`
    upcoming = iter(entries)
    pending: Any = next(upcoming, None)  # the next entry not yet planned
    try:
        while True:
            if pending is not None and (len(window) <= lookahead // 2 and held <= lookahead_bytes // 2):
                group, pending = _take(pending, upcoming, lookahead - len(window), lookahead_bytes - held)
                for entry in _submit(pool, group, read, key, max_request_bytes, max_gap_bytes, alone):
                    window.append(entry)
                    held += entry[2]
            if not window:
                return
            entry = window.popleft()
            held -= entry[2]
            yield entry
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _take(first: Any, rest: Iterator[Any], count: int, budget: int) -> tuple[list[Any], Any]:
    """The next entries, from `first`: at most `count` and (after the first) `budget` sample bytes;
    returns them and the first entry not taken (None at the end)."""
    group, size = [first], 0 if isinstance(first, BaseException) else first[2] - first[1]
    while len(group) < max(1, count):
        entry = next(rest, None)
        if entry is None:
            return group, None
        extra = 0 if isinstance(entry, BaseException) else entry[2] - entry[1]
        if size + extra > budget:
            return group, entry
        group.append(entry)
        size += extra
    return group, next(rest, None)


def _submit(pool: ThreadPoolExecutor, group: list[Any], read: Read, key: Callable[[Any], Hashable],
            max_request_bytes: int, max_gap_bytes: int, alone: Callable[[BaseException], bool],
            ) -> list[tuple[Any, int, int, Any]]:
    """Plan `group`'s requests, submit them in plan order, and return its window entries."""
    located = [(i, e) for i, e in enumerate(group) if not isinstance(e, BaseException)]
    spans = request_spans([(key(e[0]), e[1], e[2]) for _, e in located], max_request_bytes, max_gap_bytes)
    futures: list[Any] = [e if isinstance(e, BaseException) else Future() for e in group]
    for span in spans:
        members = [(located[m][1], futures[located[m][0]]) for m in span.members]
        pool.submit(_fetch_span, pool, read, members[0][0][0], span, members, alone)
    return [(None, 0, 0, e) if isinstance(e, BaseException) else (e[0], e[1], e[2] - e[1], f)
            for e, f in zip(group, futures)]


def _fetch_span(pool: ThreadPoolExecutor, read: Read, shard: Any, span: Span,
                members: list[tuple[tuple[Any, int, int], Future]], alone: Callable[[BaseException], bool]) -> None:
    """One request; each member's future gets its own bytes (a copy, so that a sample kept by the
    consumer does not keep the whole span alive) or the request's error."""
    try:
        buf, offset = read(shard, span.start, span.stop)
    except Exception as exc:  # noqa: BLE001 - handed to the samples' futures, raised where they are used
        if len(members) > 1 and alone(exc):
            for (s, start, stop), future in members:  # each its own request, in parallel
                try:
                    pool.submit(_fetch_span, pool, read, s, Span(span.key, start, stop, (0,)),
                                [((s, start, stop), future)], alone)
                except RuntimeError as shut:  # the consumer went away (the pool is shut down)
                    future.set_exception(shut)
            return
        for _, future in members:
            future.set_exception(exc)
        return
    if len(members) == 1:
        members[0][1].set_result((buf, offset))
        return
    view = memoryview(buf)
    for (_, start, stop), future in members:
        low = offset + start - span.start
        future.set_result((bytes(view[low:low + stop - start]), 0))
