"""Batches from DataLoader workers in reused shared memory (`ShardLoader` with `num_workers > 0`).

Why: a batch built in a worker must be in shared memory to reach the main process without a copy,
and fresh shared memory is expensive: torch's `UntypedStorage._new_shared` fallocates the tmpfs file
and every 4 KiB page then faults on first write, in the worker and again in the main process when the
trainer reads it. On the 2-core development VM a fresh 16 MB shared batch cost 45 ms to fill against
3 ms for memory already mapped (`scripts/bench_read.py`'s large samples: 32 x 500 KB), and each
storage crossed as a file descriptor over a socket connection of its own (~1-2 ms a batch).

So each worker keeps a small pool of shared storages ("slots", at most MAX_SLOTS). A slot's storage
crosses to the main process once, with its first batch; the main process keeps it mapped, and later
batches in that slot cross as a few bytes (slot id, offsets, dtypes, shapes) besides their lists
(keys, meta, text). `ShardLoader` starts new workers every pass (epoch); the main process gives the
slots it holds and the trainer has released to the next pass's workers, so after the first pass no
batch needs fresh shared memory at all.

When a slot may be reused (the safety argument): the main process hands the trainer tensors that are
views of ONE torch storage made with `torch.from_numpy` over a numpy view of the slot. That storage
holds the numpy view, and the view has a `weakref.finalize`. Every tensor, view, slice, `.numpy()`
array or DLPack capsule derived from the batch keeps that storage, hence the numpy view, alive;
`share_memory_()` or a pickle to another process copies it out first. Only when the last of them is
gone does the finalizer run: it marks the slot free in the main process and writes its id to a pipe
that only the worker holding the slot reads. The worker reuses a slot only after reading its id
there, and the next pass's workers get only slots marked free (a pipe write and read, or the fork
of a new worker, order the main process's last reads before the worker's next writes, on any CPU),
so memory the trainer may still hold is never written. `pin_memory=True` copies into pinned memory
in the loader's pin thread and drops the views at once. A slot whose batch the trainer keeps is not
reused while it is kept; a pass's slots go to another pass only once its iterator has ended (its
workers stopped). When no slot is free and MAX_SLOTS exist, the batch gets a fresh storage as before. Memory: at most MAX_SLOTS x the largest batch per worker, plus what the
trainer holds; freed with the `ShardLoader` (or a smaller slot when a larger batch needs its place).
"""

from __future__ import annotations

import multiprocessing
import secrets
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch

MAX_SLOTS = 8  # per worker: the loader's prefetch (2 per worker) + the trainer's batch + the pin thread's, with room
SLOT_ROUND = 1 << 16  # slot sizes are rounded up to this, so batches whose padded length varies still fit
SlotId = tuple  # (token of the pass that made it, worker, n): unique for the loader's life
_OPEN: dict[str, "SlotReceiver"] = {}  # token -> the main process's receiver of a running pass (pin thread)


@dataclass(frozen=True)
class SlotSpec:
    """What the workers of one pass get with the dataset: the pass's token, per worker the read end of
    the pipe on which the main process returns released slot ids, and the free slots it gives them."""

    token: str
    releases: tuple[Connection, ...]  # [workers]
    given: tuple[tuple[tuple[SlotId, torch.UntypedStorage], ...], ...]  # [workers] x (id, storage)


@dataclass(frozen=True)
class SlotBatch:
    """A batch whose tensors lie in one slot of its worker's pool: what crosses to the main process.

    `storage` is the slot's storage the first time the slot is sent (torch shares it by file
    descriptor), else None; `tensors` maps a field to (dtype, shape, byte offset in the slot);
    `order` is the batch dict's key order; `rest` the other values (lists, counters)."""

    token: str
    worker: int
    slot: SlotId
    storage: torch.UntypedStorage | None
    used: int  # bytes of the slot the tensors span
    order: tuple[str, ...]
    tensors: dict[str, tuple[torch.dtype, tuple[int, ...], int]]
    rest: dict[str, Any]
    dropped: tuple[SlotId, ...]  # slots the worker replaced by larger ones: the main process unmaps them

    def pin_memory(self, device: Any = None) -> dict[str, Any]:
        """Called by the DataLoader's pin thread (torch calls `pin_memory()` on objects that have it)."""
        batch = _OPEN[self.token].open(self)
        return {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


class SlotPool:
    """The worker side: hands `Collate` a free slot's storage for each batch and packs the batch."""

    def __init__(self, spec: SlotSpec, worker: int) -> None:
        self.token, self.worker, self.releases = spec.token, worker, spec.releases[worker]
        self.slots: dict[SlotId, torch.UntypedStorage] = dict(spec.given[worker])
        self.free: set[SlotId] = set(self.slots)  # given slots are free and already mapped in the main process
        self.sent: set[SlotId] = set(self.slots)
        self.dropped: list[SlotId] = []
        self.made = 0
        self.current: SlotId | None = None  # the slot of the batch being built

    def storage(self, nbytes: int) -> torch.UntypedStorage | None:
        """A storage of at least `nbytes` for the next batch, or None (no slot: allocate a fresh one)."""
        while self.releases.poll():
            self.free.add(self.releases.recv())
        fits = [i for i in self.free if self.slots[i].nbytes() >= nbytes]
        if not fits and len(self.slots) >= MAX_SLOTS and self.free:  # replace a free slot that is too small
            small = min(self.free, key=lambda i: self.slots[i].nbytes())
            self.free.discard(small)
            self.sent.discard(small)
            del self.slots[small]
            self.dropped.append(small)
        if fits:
            slot = min(fits, key=lambda i: self.slots[i].nbytes())
            self.free.discard(slot)
        elif len(self.slots) < MAX_SLOTS:
            slot, self.made = (self.token, self.worker, self.made), self.made + 1
            self.slots[slot] = torch.UntypedStorage._new_shared(max(1, -(-nbytes // SLOT_ROUND) * SLOT_ROUND))
        else:
            self.current = None
            return None
        self.current = slot
        return self.slots[slot]

    def pack(self, batch: Any) -> Any:
        """The batch as it crosses: a SlotBatch when its tensors were made in a slot, else unchanged."""
        slot, self.current = self.current, None
        if slot is None or not isinstance(batch, dict):
            return batch
        storage = self.slots[slot]
        base = storage.data_ptr()
        tensors: dict[str, tuple[torch.dtype, tuple[int, ...], int]] = {}
        rest: dict[str, Any] = {}
        used = 0
        for name, value in batch.items():
            if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() == base:
                offset = value.storage_offset() * value.element_size()
                tensors[name] = (value.dtype, tuple(value.shape), offset)
                used = max(used, offset + value.numel() * value.element_size())
            else:
                rest[name] = value
        first = slot not in self.sent
        self.sent.add(slot)
        dropped, self.dropped = tuple(self.dropped), []
        return SlotBatch(self.token, self.worker, slot, storage if first else None, used, tuple(batch),
                         tensors, rest, dropped)


@dataclass
class _Pass:
    """A running pass: its spec, the write ends of its release pipes, and which worker holds which slot."""

    spec: SlotSpec
    writers: list[Connection]
    owner: dict[SlotId, int]


class SlotReceiver:
    """The main process side, for a loader's life: keeps every slot mapped, turns SlotBatches into
    dicts of tensors whose release it records (and reports to the slot's worker), and gives the free
    slots to the workers of each new pass. Size: O(slots)."""

    def __init__(self) -> None:
        self.slots: dict[SlotId, tuple[torch.UntypedStorage, np.ndarray]] = {}  # id -> (storage, [nbytes] uint8)
        self.held: set[SlotId] = set()  # slots with a batch the trainer may still hold
        self.passes: dict[str, _Pass] = {}  # token -> a pass whose workers may still run

    def __reduce__(self) -> tuple[type, tuple[()]]:
        """A copy (a pickled loader) starts with no slots: slots belong to this process's passes."""
        return (SlotReceiver, ())

    def start(self, workers: int) -> SlotSpec:
        """The spec for a new pass of `workers` workers: the slots no trainer batch and no other running
        pass holds are dealt out round-robin."""
        taken = {i for run in self.passes.values() for i in run.owner}
        free = [i for i in self.slots if i not in self.held and i not in taken]
        for i in free[workers * MAX_SLOTS:]:  # more free slots than the pass can use: unmap the rest
            del self.slots[i]
        free = free[:workers * MAX_SLOTS]
        given = tuple(tuple((i, self.slots[i][0]) for i in free[w::workers]) for w in range(workers))
        pipes = [multiprocessing.Pipe(duplex=False) for _ in range(workers)]  # (read end, write end)
        spec = SlotSpec(secrets.token_hex(8), tuple(r for r, _ in pipes), given)
        owner = {i: w for w in range(workers) for i, _ in given[w]}
        self.passes[spec.token] = _Pass(spec, [w for _, w in pipes], owner)
        _OPEN[spec.token] = self
        return spec

    def finish(self, spec: SlotSpec) -> None:
        """End of a pass, its workers stopped: close its pipes; its slots are free for the next pass."""
        run = self.passes.pop(spec.token, None)
        _OPEN.pop(spec.token, None)
        if run is not None:
            for conn in (*run.writers, *spec.releases):
                conn.close()

    def open(self, batch: SlotBatch) -> dict[str, Any]:
        for slot in batch.dropped:
            self.slots.pop(slot, None)
        if batch.storage is not None:
            whole = torch.empty(0, dtype=torch.uint8).set_(batch.storage, 0, (batch.storage.nbytes(),))
            self.slots[batch.slot] = (batch.storage, whole.numpy())
        run = self.passes.get(batch.token)
        if run is not None:
            run.owner[batch.slot] = batch.worker
        region = self.slots[batch.slot][1][:batch.used]  # a fresh ndarray object: its life is the batch's
        self.held.add(batch.slot)
        weakref.finalize(region, self._release, batch.token, batch.slot)
        storage = torch.from_numpy(region).untyped_storage()  # holds `region` until its last tensor dies
        del region
        out: dict[str, Any] = {}
        for name in batch.order:
            if name in batch.tensors:
                dtype, shape, offset = batch.tensors[name]
                item = dtype.itemsize
                out[name] = torch.empty(0, dtype=dtype).set_(storage, offset // item, shape)
            else:
                out[name] = batch.rest[name]
        return out

    def _release(self, token: str, slot: SlotId) -> None:
        """The finalizer of a batch's numpy view: its tensors are all gone, the slot may be reused."""
        self.held.discard(slot)
        run = self.passes.get(token)
        if run is not None and slot in run.owner:
            try:
                run.writers[run.owner[slot]].send(slot)
            except (OSError, ValueError):  # the pass is ending (pipe closed): the next pass gets the slot
                pass
