"""`ShardLoader`: a plain `torch.utils.data.DataLoader` plus the cursor of what it has handed out.

The dataset yields whole planned batches (collated inside the workers) and the DataLoader collects
them round-robin from its workers, which is the plan's order; so after k batches this rank has
consumed exactly min(start + k * batch_size, epoch length) positions. No DataLoader internals are
touched or subclassed. A `Mixture` (reader/mixture.py) has the same cursor protocol and is driven the
same way. The cursor counts samples, so it loads with another batch size (or worker count) and
continues at the next unconsumed sample. With workers, a `ShardDataset` collated by `Collate` builds
its batches in reused shared memory (`reader/batching.py`); the batches handed out are the same.
With workers, a batch that does not come within `timeout` seconds is one `WorkerStalled` error naming
the worker, its shard, its sample and its last progress, read from the workers' heartbeats
(`reader/heartbeat.py`); a temporary folder too long for the workers' sockets is refused up front
(`reader/socket_dir.py`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch.multiprocessing
from torch.utils.data import DataLoader

from robowds.reader.batching import SlotBatch, SlotReceiver
from robowds.reader.collation import Collate, collate as default_collate
from robowds.reader.dataset import ShardDataset
from robowds.reader.heartbeat import Heartbeat, WorkerStart, is_timeout, stop_stalled
from robowds.reader.mixture import Mixture
from robowds.reader.socket_dir import check_socket_dir

# Seconds a batch may take to come from a worker before the pass fails (`WorkerStalled`). It must
# never fire on a healthy read, however slow:
# - a worker's first batch also waits for the worker to start (a spawned worker imports torch: 10-30 s
#   on a busy node) and to read its first shards' indexes;
# - a remote read that keeps failing gives up by itself, with the shard and byte range in its message,
#   after `RetryPolicy().bound_s()` = 307.5 s (5 attempts of at most 60 s each, plus backoff): the
#   loader's bound is above that, so a throttled read that succeeds on its 5th attempt is not cut
#   short and one that fails keeps its clearer error;
# - a first read through the node cache downloads a whole shard (256 MB, the export's default shard
#   size, at a slow 10 MB/s: ~26 s), and the node's other workers wait for that download.
# And it must fire before NCCL's default 600 s collective timeout: the other ranks wait in their
# all-reduce for the stalled rank, and that watchdog's error names no worker. Energon's 60 s watchdog
# would fire on the slow first reads above. 0 or None: no bound.
DEFAULT_TIMEOUT_S = 480.0


def _already_collated(batch: Any) -> Any:
    """Batches are collated in the workers; torch's default_convert would walk them again (~10%)."""
    return batch


class ShardLoader:
    """A torch DataLoader over a ShardDataset or Mixture, with the cursor of what it handed out.

    `timeout` (seconds; with `num_workers` >= 1): how long a batch may take to come from its worker
    before the pass raises `WorkerStalled`, naming the worker, its shard, sample and last progress, and
    stops the worker (DEFAULT_TIMEOUT_S; 0 or None: wait for ever). With `num_workers=0` the samples
    are read in this process and no timeout applies (as in torch). Other keywords go to the DataLoader."""

    def __init__(self, dataset: ShardDataset | Mixture, batch_size: int, num_workers: int = 0,
                 collate_fn: Callable[[list[dict[str, Any]]], Any] = default_collate, drop_last: bool = False,
                 timeout: float | None = DEFAULT_TIMEOUT_S, **dataloader_kwargs: Any) -> None:
        if dataloader_kwargs.get("persistent_workers"):
            raise ValueError("persistent_workers would keep stale cursors in the workers; ShardLoader restarts them")
        for key in ("batch_size", "shuffle", "sampler", "batch_sampler"):
            if key in dataloader_kwargs:
                raise ValueError(f"{key} is decided by the plan; do not pass it to ShardLoader")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not timeout >= 0):
            raise ValueError(f"timeout must be seconds >= 0 (0 or None: no bound), got {timeout!r}")
        dataset.set_batching(batch_size, drop_last, collate_fn)  # the plan's whole batches, collated in workers
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.num_workers = int(num_workers)
        self.timeout = float(timeout or 0) if timeout != float("inf") else 0.0  # 0: no bound
        if self.num_workers > 0:  # before any worker starts: a long TMPDIR would hang the loader
            check_socket_dir(torch.multiprocessing.get_sharing_strategy())
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
        kwargs, heartbeat = self.kwargs, None
        if self.num_workers > 0:  # each worker records what it reads, for the timeout's message
            heartbeat = Heartbeat(self.num_workers)
            kwargs = {**kwargs, "timeout": self.timeout,
                      "worker_init_fn": WorkerStart(heartbeat, kwargs.get("worker_init_fn"))}
        loader = DataLoader(ds, batch_size=None, num_workers=self.num_workers, collate_fn=_already_collated,
                            **kwargs)
        spec = None
        if self.num_workers > 0 and isinstance(ds, ShardDataset) and type(ds.collate_fn) is Collate:
            spec = ds._slots = self._slots.start(self.num_workers)  # the workers get it with their copy of ds
        sources = ds.datasets if isinstance(ds, Mixture) else [ds]
        for s, source in enumerate(sources):
            source._heartbeat = heartbeat if heartbeat is None else heartbeat.for_source(s)
        try:
            batches = iter(loader)
        finally:
            if spec is not None:
                ds._slots = None  # only this pass's workers hold its pipes and slots
            for source in sources:
                source._heartbeat = None  # ... and its heartbeat
        try:
            yield from self._hand_out(batches, epoch, length, position, heartbeat)
        finally:
            del batches  # the workers stop before the pass's slots go to another pass
            if spec is not None:
                self._slots.finish(spec)

    def _hand_out(self, batches: Iterator[Any], epoch: int, length: int, position: int,
                  heartbeat: Heartbeat | None) -> Iterator[Any]:
        ds = self.dataset
        received = 0  # batches of this pass: the plan deals batch k to worker k % num_workers, as torch asks
        while True:
            stalled = None
            try:
                batch = next(batches)
            except StopIteration:
                return
            except RuntimeError as exc:
                if heartbeat is None or not is_timeout(exc):
                    raise
                stalled = stop_stalled(heartbeat, received % self.num_workers, self.timeout, ds)
            if stalled is not None:
                # raised here, not in the except block: torch's error would be its context, and its
                # frames hold the DataLoader iterator, whose workers then outlive the pass for as long as
                # the caller keeps the error; without them `__iter__` drops the iterator on the way out
                del batches
                raise stalled
            received += 1
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
