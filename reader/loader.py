"""`ShardLoader`: a plain `torch.utils.data.DataLoader` plus the cursor of what it has handed out.

The dataset yields whole planned batches (collated inside the workers) and the DataLoader collects
them round-robin from its workers, which is the plan's order; so after k batches this rank has
consumed exactly min(start + k * batch_size, epoch length) positions. No DataLoader internals are
touched or subclassed. A `Mixture` (reader/mixture.py) has the same cursor protocol and is driven the
same way. The cursor counts samples, so it loads with another batch size (or worker count) and
continues at the next unconsumed sample. With workers, a `ShardDataset` collated by `Collate` builds
its batches in reused shared memory (`reader/batching.py`); the batches handed out are the same.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from torch.utils.data import DataLoader

from robowds.reader.batching import SlotBatch, SlotReceiver
from robowds.reader.collation import Collate, collate as default_collate
from robowds.reader.dataset import ShardDataset
from robowds.reader.mixture import Mixture


def _already_collated(batch: Any) -> Any:
    """Batches are collated in the workers; torch's default_convert would walk them again (~10%)."""
    return batch


class ShardLoader:
    def __init__(self, dataset: ShardDataset | Mixture, batch_size: int, num_workers: int = 0,
                 collate_fn: Callable[[list[dict[str, Any]]], Any] = default_collate, drop_last: bool = False,
                 **dataloader_kwargs: Any) -> None:
        if dataloader_kwargs.get("persistent_workers"):
            raise ValueError("persistent_workers would keep stale cursors in the workers; ShardLoader restarts them")
        for key in ("batch_size", "shuffle", "sampler", "batch_sampler"):
            if key in dataloader_kwargs:
                raise ValueError(f"{key} is decided by the plan; do not pass it to ShardLoader")
        dataset.set_batching(batch_size, drop_last, collate_fn)  # the plan's whole batches, collated in workers
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.num_workers = int(num_workers)
        self.kwargs = dataloader_kwargs
        self.skipped = 0  # samples skipped with on_error="skip", over this loader's life
        self._slots = SlotReceiver()  # workers' batches in reused shared memory (reader/batching.py)

    def __len__(self) -> int:
        """Batches in a full epoch for this rank (the same on every rank)."""
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch; the next iterator is the next epoch.

        The dataset's `start` is the cursor: the workers got their copy when the iterator was made,
        so it is advanced here, in the parent, batch by batch, as batches are handed out. Just before
        the epoch's last batch is handed out the cursor moves to the next epoch at position 0, so a
        new iterator (and a `state_dict()` taken from then on) continues there even when this one is
        never exhausted: Lightning takes exactly `len(loader)` batches per epoch and then asks for a
        new iterator. An explicit `set_epoch` or `load_state_dict` after that point wins."""
        ds = self.dataset
        ds._yielded = 0
        if ds.at_epoch_end():  # a cursor saved at the very end of an epoch (an earlier version did)
            ds.next_epoch(ds.epoch)
        epoch, length, position = ds.epoch, ds.epoch_length(), ds.start
        loader = DataLoader(ds, batch_size=None, num_workers=self.num_workers, collate_fn=_already_collated,
                            **self.kwargs)
        spec = None
        if self.num_workers > 0 and isinstance(ds, ShardDataset) and type(ds.collate_fn) is Collate:
            spec = ds._slots = self._slots.start(self.num_workers)  # the workers get it with their copy of ds
        try:
            batches = iter(loader)
        finally:
            if spec is not None:
                ds._slots = None  # only this pass's workers hold its pipes and slots
        try:
            yield from self._hand_out(batches, epoch, length, position)
        finally:
            del batches  # the workers stop before the pass's slots go to another pass
            if spec is not None:
                self._slots.finish(spec)

    def _hand_out(self, batches: Iterator[Any], epoch: int, length: int, position: int) -> Iterator[Any]:
        ds = self.dataset
        for batch in batches:
            if isinstance(batch, SlotBatch):
                batch = self._slots.open(batch)
            position = min(position + self.batch_size, length)
            if ds.epoch == epoch:  # not moved by an explicit set_epoch / load_state_dict meanwhile
                if position >= length:
                    ds.next_epoch(epoch)
                else:
                    ds.start = position
            if isinstance(batch, dict):
                self.skipped += int(batch.pop("__skipped__", 0))
            yield batch
            del batch  # not kept while the next one is awaited: its slot can be reused sooner

    def state_dict(self) -> dict[str, Any]:
        """Small and JSON-serialisable: the plan parameters, the epoch and how far this rank got."""
        return self.dataset.cursor()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state` stopped; the dataset checks it first (every key, the export it was
        saved on: `reader/cursor.py`), so a wrong cursor is one ValueError naming the key."""
        self.dataset.load_cursor(state)
