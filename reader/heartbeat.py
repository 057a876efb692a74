"""Per-worker heartbeats of a `ShardLoader` pass, and the one error a stalled worker gets.

Why: torch's `DataLoader(timeout=N)` only says "DataLoader timed out after N seconds"; on a days-long
run that is all one learns of a transform that blocks or a network read that never returns. Each
DataLoader worker therefore keeps a record of what it is doing in memory shared with the main process,
which reads it when the timeout expires, without the worker's cooperation (the worker is stuck by
then): which shard, which byte offset, which key, and when it last made progress.

The records: one `RECORD`-byte slot per worker in one `multiprocessing.RawArray`, made by the main
process before the workers start and inherited by them (fork) or passed at their start (spawn,
forkserver: the array travels as a file descriptor). No files, no threads, no locks: a worker writes
its own slot with one `struct.pack_into` when it starts a sample and one when it has decoded it.
Cost, on the loaded 2-core development VM: 0.77 us a sample for both (CPU time, a tight loop); in
`SampleReads.samples` over 4 KB samples a paired, interleaved A/B measured a median +3.3 us on
~23 us (an A/A run of the same harness: +0.0, quartiles -4.2 / +2.9); bigger samples cost more to
read and the same to record, and `scripts/bench_read.py`'s run-to-run spread is larger. The main
process reads a slot only after the worker stopped sending batches, when nothing writes it any more
(a read racing a write could mix two samples' fields; it cannot crash).
Times are `time.monotonic()`, one clock for every process of the machine (CLOCK_MONOTONIC). Size:
RECORD bytes per worker; a shard is recorded by its index in the split (the main process has the same
list), so a record has a fixed size whatever the paths. The worker the main process waits on is the
one that owes the pass's next batch: the plan deals batch k to worker k % workers (`ShardLoader`).
"""

from __future__ import annotations

import multiprocessing
import os
import struct
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from torch.utils.data import get_worker_info

RECORD = 256  # bytes per worker
KEY_BYTES = 200  # a key's first bytes kept (keys are episode id / window: far shorter)
_START = struct.Struct("<qiiqdB")  # at 0: pid, shard, source, byte offset, time, stage
_READ = struct.Struct("<iiqdB")  # at 8: shard, source, byte offset, time, stage
_KEY = struct.Struct(f"<dBH{KEY_BYTES}s")  # at 24: time, stage, key length, key
_KEY_AT = 24
STARTED, READING, DECODED = 1, 2, 3  # stages (0: no record: the worker has not started)
TIMEOUT_PREFIX = "DataLoader timed out after"  # torch's message when its `timeout` expires


class WorkerStalled(RuntimeError):
    """A DataLoader worker sent no batch within `ShardLoader`'s timeout; the message names the worker,
    the shard, the sample (key or byte offset) and its last progress, then (as the CLI's user errors
    do) the fix on a `  fix:` line. A RuntimeError, as torch's bare timeout error was, so code that
    caught that still catches this."""


@dataclass(frozen=True)
class Beat:
    """A worker's record as the main process reads it. `age_s`: seconds since its last progress."""

    pid: int
    shard: int  # index in the split's shard list (of dataset `source` in a Mixture); -1: none yet
    source: int
    offset: int  # byte offset of the sample in its shard
    stage: int
    key: str
    age_s: float


class Pulse:
    """The worker side: writes this worker's record as samples start and are decoded. Two calls per
    sample, each one `pack_into` and one clock read (methods bound once: this runs per sample)."""

    __slots__ = ("raw", "at", "source", "index", "clock", "pack_read", "pack_key")

    def __init__(self, raw: Any, worker: int, source: int, shards: Sequence[Any]) -> None:
        self.raw, self.at, self.source = raw, worker * RECORD, source
        self.index = {s.path: k for k, s in enumerate(shards)}  # O(shards) once per worker and pass (~10 ms at 100k)
        self.clock, self.pack_read, self.pack_key = time.monotonic, _READ.pack_into, _KEY.pack_into

    def reading(self, shard: Any, offset: int) -> None:
        """A sample's read starts: its shard and byte offset."""
        self.pack_read(self.raw, self.at + 8, self.index.get(shard.path, -1), self.source, offset, self.clock(), READING)

    def decoded(self, key: str) -> None:
        """Its bytes are read and decoded; what follows is the transform and the batch's collation.
        (Keys come from tar names decoded as strict UTF-8: encoding them cannot fail.)"""
        data = key.encode()
        self.pack_key(self.raw, self.at + _KEY_AT, self.clock(), DECODED, len(data), data)


class Heartbeat:
    """The records of one pass's workers (`workers` x RECORD bytes of shared memory). `source` is the
    dataset's index in a Mixture (0 for a ShardDataset), stamped on the records its samples write."""

    def __init__(self, workers: int, source: int = 0, raw: Any = None) -> None:
        self.workers, self.source = workers, source
        self.raw = raw if raw is not None else multiprocessing.RawArray("B", workers * RECORD)

    def for_source(self, source: int) -> Heartbeat:
        """The same records, for the `source`-th dataset of a Mixture."""
        return Heartbeat(self.workers, source, self.raw)

    def started(self, worker: int) -> None:
        """In the worker, first thing (`WorkerStart`): its pid, for the main process to stop it."""
        _START.pack_into(self.raw, worker * RECORD, os.getpid(), -1, self.source, 0, time.monotonic(), STARTED)

    def pulse(self, shards: Sequence[Any]) -> Pulse | None:
        """This worker's writer (None outside a DataLoader worker: nothing to watch in-process)."""
        info = get_worker_info()
        return None if info is None or info.id >= self.workers else Pulse(self.raw, info.id, self.source, shards)

    def read(self, worker: int) -> Beat:
        base = worker * RECORD
        pid, shard, source, offset, _, stage = _START.unpack_from(self.raw, base)
        when, stage, size, key = _KEY.unpack_from(self.raw, base + _KEY_AT)
        age = time.monotonic() - when if pid else 0.0
        text = key[:size].decode("utf-8", "replace") if stage == DECODED else ""
        return Beat(pid, shard, source, offset, stage if pid else 0, text, age)


@dataclass(frozen=True)
class WorkerStart:
    """`worker_init_fn` of a ShardLoader pass: records the worker's start, then runs the user's own."""

    heartbeat: Heartbeat
    then: Callable[[int], None] | None = None

    def __call__(self, worker: int) -> None:
        self.heartbeat.started(worker)
        if self.then is not None:
            self.then(worker)


def is_timeout(exc: BaseException) -> bool:
    """Whether `exc` is torch's DataLoader timeout (the only RuntimeError with this message)."""
    return isinstance(exc, RuntimeError) and str(exc).startswith(TIMEOUT_PREFIX)


def shard_location(dataset: Any, source: int, shard: int) -> tuple[str, str]:
    """(path or URL of shard `shard` of source `source`, the key prefix a Mixture gives its samples)."""
    datasets = getattr(dataset, "datasets", None) or [dataset]
    names = getattr(dataset, "names", None)
    if not 0 <= source < len(datasets) or not 0 <= shard < len(datasets[source].shards):
        return "(unknown shard)", ""
    ds = datasets[source]
    path, base = ds.shards[shard].path, ds.base
    where = base.rstrip("/") + "/" + path if "://" in base else os.path.join(base, path)
    return where, f"{names[source]}/" if names else ""


def describe(beat: Beat, dataset: Any) -> str:
    """What the worker was doing and when it last made progress, from its record."""
    if beat.stage == 0:
        return "it has not started (no heartbeat: still starting up, or stuck in worker_init_fn)"
    last = f"its last progress was {beat.age_s:.1f} s ago, when it"
    if beat.stage == STARTED:
        return f"{last} started: it has read no sample yet (it is planning its share or opening its first shard)"
    where, prefix = shard_location(dataset, beat.source, beat.shard)
    if beat.stage == READING:
        return (f"{last} started reading the sample at byte {beat.offset} of shard {where} (its key not read "
                "yet): that read or its decoding has not finished")
    return (f"{last} decoded sample {prefix + beat.key!r} (byte {beat.offset} of shard {where}): it is in its "
            "transform or in collating its batch since")


def stop_stalled(heartbeat: Heartbeat, worker: int, timeout: float, dataset: Any) -> WorkerStalled:
    """The error for `worker`, which owes the next batch; the worker itself is stopped at once.

    Stopped because torch's shutdown would join it for 5 s and only then kill it; SIGTERM from its
    parent makes a torch worker exit at once with status 0, which torch does not report as a crash.
    Only a child process of this one with the recorded pid is signalled (a child's pid cannot be
    reused before it is reaped)."""
    beat = heartbeat.read(worker)
    for child in multiprocessing.active_children():
        if beat.pid and child.pid == beat.pid:
            child.terminate()
    pid = f" (pid {beat.pid})" if beat.pid else ""
    return WorkerStalled(
        f"DataLoader worker {worker}{pid} of {heartbeat.workers} stalled: no batch for {timeout:g} s "
        f"(ShardLoader timeout={timeout:g}): {describe(beat, dataset)}\n"
        "  fix: find what blocks there (a transform waiting on something, a network read that never returns); "
        "if it is only slow, give ShardLoader a longer timeout= in seconds (0 or None: no bound)")
