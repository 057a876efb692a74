"""What an iterable dataset hands the DataLoader per planned position: samples, or one collated batch
per planned batch. Shared by `ShardDataset` and `Mixture`, whose cursors count the same items."""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator


def planned_items(samples: Iterator[dict[str, Any] | None], collate_fn: Callable[[list], Any] | None,
                  batch_size: int, last: int, on_item: Callable[[], None],
                  on_last: Callable[[], None]) -> Iterator[Any]:
    """Samples (None: a skipped sample, counted but not yielded), or with `collate_fn` one batch per
    `batch_size` planned samples. `on_item` runs for every planned item before it is handed out (the
    cursor counts it), `on_last` when item number `last` is reached (the epoch's end for this worker)."""
    if collate_fn is None:
        for i, sample in enumerate(samples):
            on_item()
            if i == last:
                on_last()
            if sample is not None:
                yield sample
        return
    i = 0
    while chunk := list(itertools.islice(samples, batch_size)):
        kept = [s for s in chunk if s is not None]
        on_item()
        # one item per planned batch, always: every rank keeps the same number of steps (DDP) and the
        # loader's cursor stays exact; a batch whose samples were all skipped has no keys
        batch = collate_fn(kept) if kept else {"__key__": []}
        if isinstance(batch, dict):
            batch["__skipped__"] = len(chunk) - len(kept)
        if i == last:
            on_last()
        i += 1
        yield batch
