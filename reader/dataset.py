"""`ShardDataset`: a PyTorch IterableDataset over one split of an export, driven by the epoch plan.

Each DataLoader worker computes the same plan (pure, from the manifest's counts, O(shards) memory) and
reads only its own positions, whose sample ids it computes chunk by chunk as it goes, by byte range.
The cursor is tiny: (epoch, start position, elastic history, the export generation whose shards the
epoch reads: reader/generations.py); resuming seeks straight to the first unconsumed sample.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Any, Callable, Iterator

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from robowds.reader.batching import SlotPool, SlotSpec
from robowds.reader.collation import Collate
from robowds.reader.cursor import DATASET_KEYS, as_cursor, check_keys, check_progress, export_id
from robowds.reader.dataset_args import checked_batching, resolve_topology
from robowds.reader.emit import planned_items
from robowds.reader.generations import counts_at, cursor_generation, epoch_begun, generations_of
from robowds.reader.heartbeat import Heartbeat
from robowds.reader.manifest import shards_of, split_layout, split_stats
from robowds.reader.members import MemberSet
from robowds.reader.plan import POLICIES, PlanSpec, RankPlan, Topology, materialise, worker_count
from robowds.reader.old_keywords import BATCHING, REMOTE, refuse_old_keywords
from robowds.reader.remote_options import Remote
from robowds.reader.sample_reads import SampleReads, Transform
from robowds.reader.select import select_fields
from robowds.reader.shard_cache import ShardCache
from robowds.reader.source import ShardSource, load_manifest

STATE_VERSION = 2  # 2: the per-position plan (reader/plan.py); 1: the materialising plan, another shuffled order


class _PooledCollate:
    """`Collate` writing each batch into a slot of the worker's pool."""

    def __init__(self, collate_fn: Collate, pool: SlotPool) -> None:
        self.collate_fn, self.pool = collate_fn, pool

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        return self.collate_fn.collate(samples, self.pool.storage)


class ShardDataset(IterableDataset):
    """Samples (or, after `set_batching(..., collate_fn=...)`, batches) of one split, for this rank and
    DataLoader worker.

    The constructor takes what decides which samples are read and how they are decoded; how a URL is
    read is one `remote=Remote(...)` value (reader/remote_options.py). Batching is set afterwards by
    whoever batches: `ShardLoader(ds, batch_size=...)` does it, and with a plain torch `DataLoader` or
    torchdata's `StatefulDataLoader` call `ds.set_batching(batch_size)` (the loader's batch size: the
    plan pads or drops each rank's share to whole batches, and batches are dealt to workers
    round-robin, so that every rank gets the same number of batches and the loader's output order is
    the plan's order). `fields` / `exclude` (schema field names) decode only those fields, masks with
    them, `__key__` and `meta` always (`reader/select.py`). 15 parameters (the old remote and batching
    keywords raise a TypeError naming their new form: reader/old_keywords.py).
    """

    # Internal, not an option: bench_read's page-release A/B (`--release-rounds`) turns it off on an instance to
    # measure what letting go of consumed pages costs (reader/release.py); every reader keeps it on.
    _release_pages = True

    @refuse_old_keywords("ShardDataset", {**{f.name: REMOTE for f in dataclasses.fields(Remote)},
                                           **dict.fromkeys(("batch_size", "drop_last", "collate_fn"), BATCHING)})
    def __init__(self, source: str | os.PathLike[str], split: str = "train", *, shuffle: bool = True, seed: int = 0,
                 block: int = 4096, policy: str = "pad", rank: int | None = None, world_size: int | None = None,
                 transform: Transform | None = None, verify: bool = False, on_error: str = "raise",
                 remote: Remote | None = None, video_layout: str = "THWC", fields: list[str] | None = None,
                 exclude: list[str] | None = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if video_layout not in ("THWC", "TCHW"):
            raise ValueError("video_layout must be 'THWC' (as stored) or 'TCHW'")
        if on_error not in ("raise", "skip"):
            raise ValueError("on_error must be 'raise' or 'skip'")
        if remote is not None and not isinstance(remote, Remote):
            raise TypeError(f"remote must be a robowds.reader.Remote, got {type(remote).__name__}")
        self.remote = remote if remote is not None else Remote()  # how a URL is read (reader/remote_options.py)
        self.retry, self.storage_options = self.remote.retry, self.remote.options  # attempts and backoff, fsspec's
        self.manifest, self.base = load_manifest(source, self.storage_options, self.retry)
        self.split = split
        self.export_id = export_id(self.manifest)  # what the cursor records of the export (reader/cursor.py)
        self.generations = generations_of(self.manifest)  # [generations] what each append added (reader/generations.py)
        self.generation = len(self.generations)  # the export's; the current epoch's plan reads `plan_generation`'s
        self.shards = shards_of(self.manifest, split)
        self.counts = tuple(s.samples for s in self.shards)
        self._first: list[int] = [0, *itertools.accumulate(self.counts)]  # [S+1] first sample id of each shard
        self.rank, self.world_size = resolve_topology(rank, world_size)
        self.seed, self.shuffle, self.block, self.policy = int(seed), bool(shuffle), int(block), policy
        # set by ShardLoader (or `set_batching`): single samples until then
        self.batch_size, self.drop_last, self.collate_fn = 1, False, None
        self.transform, self.on_error = transform, on_error
        self.verify = {s.path: s.sha256 for s in self.shards} if verify else None
        # remote reads: coalesced requests (reader/fetch.py), an optional node cache (reader/shard_cache.py)
        self.max_request_bytes = self.remote.max_request_bytes
        self.cache = (ShardCache(os.fspath(self.remote.cache_dir), self.remote.cache_limit_bytes)
                      if self.remote.cache_dir is not None else None)
        # what every sample must hold, and how (the split's layout: members, or npz: reader/npz.py)
        self.members = MemberSet.from_schema(self.manifest["schema"], split_layout(self.manifest, split))
        self.keep = select_fields(self.manifest["schema"], fields, exclude)  # fields decoded (None: all)
        self.cameras = ([n for n, s in self.manifest["schema"].items() if s.get("kind") == "video"
                         and (self.keep is None or n in self.keep)] if video_layout == "TCHW" else [])
        self.epoch, self.start, self.history = 0, 0, ()  # the cursor
        self.plan_generation = self.generation  # the cursor too: an epoch resumed across an append keeps its shards
        self._yielded = 0  # items this worker copy yielded since `start` (Stateful protocol)
        self._worker: tuple[int, int] = (0, 1)
        self._sequence: tuple[tuple, RankPlan] | None = None  # the cached plan, by (epoch, history, rank, world,
        # plan generation)
        self._slots: SlotSpec | None = None  # set by ShardLoader for its workers' pass (reader/batching.py)
        self._heartbeat: Heartbeat | None = None  # likewise: what each worker reads (reader/heartbeat.py)

    def set_batching(self, batch_size: int, drop_last: bool = False,
                     collate_fn: Callable[[list[dict[str, Any]]], Any] | None = None) -> ShardDataset:
        """Batch size (the loader's), whether the rank's last partial batch is dropped, and `collate_fn`:
        with one the dataset yields collated batches (use `DataLoader(batch_size=None)`), without it
        single samples (the loader batches them with the same `batch_size`). In place; returns the
        dataset, for `DataLoader(ShardDataset(...).set_batching(32), batch_size=32)`. ShardLoader calls
        it, so its users never do. The cursor records `batch_size` as before."""
        self.batch_size, self.drop_last, self.collate_fn = checked_batching(batch_size, drop_last, collate_fn)
        return self

    @property
    def stats(self) -> dict[str, Any]:
        """This split's normalisation statistics from the manifest (`split_stats`), for `Normalize`."""
        return split_stats(self.manifest, self.split)

    # -- the plan --------------------------------------------------------------------------------
    def plan_counts(self) -> tuple[int, ...]:
        """Samples per shard of the shards the current epoch reads: every shard, or, for an epoch resumed
        from a cursor saved before an append, the shards of its generation (the first ones: appends add
        shards at the end, so sample ids do not move). [S]"""
        return counts_at(self.counts, self.generations, self.split, self.plan_generation)

    def plan_spec(self) -> PlanSpec:
        return PlanSpec(self.plan_counts(), self.seed, self.shuffle, self.block, self.policy, self.history)

    def plan(self) -> RankPlan:
        """This rank's plan for the current epoch (cached): O(shards) memory, sample ids per position.
        Under DDP every rank loads the same cursor, so an epoch resumed across an append is planned over
        the same shards on all (`plan_generation`, from the cursor); every other epoch reads the shards of
        the manifest this rank loaded, so ranks must load the same one (docs/reader.md)."""
        key = (self.epoch, self.history, self.rank, self.world_size, self.plan_generation)
        if self._sequence is None or self._sequence[0] != key:
            self._sequence = (key, RankPlan(self.plan_spec(), self.epoch, self.world_size, self.rank))
        return self._sequence[1]

    def sequence(self) -> np.ndarray:
        """This rank's sample ids for the current epoch, in order: [R] int64. Materialised, for tools
        and tests; reading never builds it."""
        plan = self.plan()
        return materialise(plan.ids, plan.length)

    def epoch_length(self) -> int:
        """Samples this rank reads in the current epoch (identical on every rank)."""
        n = self.plan().length
        return n // self.batch_size * self.batch_size if self.drop_last else n

    def __len__(self) -> int:
        n = self.epoch_length()
        return -(-n // self.batch_size) if self.collate_fn is not None else n

    def set_epoch(self, epoch: int) -> None:
        """Move to `epoch` (cursor at its start) unless the cursor is already in it (a resume).

        Explicit, so it wins over the automatic move to the next epoch: called after an epoch
        ended (the cursor already at epoch + 1, position 0), `set_epoch(epoch)` reads that epoch again."""
        if epoch != self.epoch:
            self.epoch, self.start, self.history, self._yielded = int(epoch), 0, (), 0
            self.plan_generation = self.generation  # a new epoch reads every shard, appended ones too

    def at_epoch_end(self) -> bool:
        """Whether the cursor stands after the last sample of a non-empty epoch (a cursor saved there
        by an earlier version, or `consumed` = the epoch length): the next pass is the next epoch."""
        length = self.epoch_length()
        return 0 < length <= self.start

    def next_epoch(self, finished: int) -> None:
        """The cursor moves to epoch `finished + 1`, position 0, if it is still in epoch `finished`
        (an explicit `set_epoch` or `load_state_dict` in the meantime wins)."""
        if self.epoch == finished:
            self.set_epoch(finished + 1)

    # -- the cursor ------------------------------------------------------------------------------
    def cursor(self, consumed: int | None = None) -> dict[str, Any]:
        """JSON-serialisable cursor; `consumed` = positions read in this epoch by this rank."""
        return {"version": STATE_VERSION, "split": self.split, "samples": sum(self.plan_counts()), "seed": self.seed,
                "shuffle": self.shuffle, "block": self.block, "policy": self.policy, "batch_size": self.batch_size,
                "epoch": self.epoch, "consumed": int(self.start if consumed is None else consumed),
                "world_size": self.world_size, "history": [[t.world_size, t.consumed] for t in self.history],
                "export": self.generations[self.plan_generation - 1].export, "generation": self.plan_generation}

    def load_cursor(self, state: dict[str, Any]) -> None:
        """Continue where `state` stopped; a different world size re-plans the rest of the epoch.

        `state` is checked first (`reader/cursor.py`): each key present, of its type and range, no
        unknown key, `consumed` within the epoch as the saved topology split it, and saved on this
        export (its `export` key: a cursor saved before robowds recorded it loads unchecked), or on an
        earlier generation of it (`generation`, reader/generations.py): then the rest of the epoch reads
        that generation's shards, exactly the samples the epoch began with."""
        state = as_cursor(state, "cursor")
        version = state.get("version")
        if version not in (1, STATE_VERSION):
            raise ValueError(f"cursor version {version!r} is not {STATE_VERSION}")
        check_keys(state, DATASET_KEYS, "cursor")
        same_order = version == 1 and (not state.get("shuffle") or (not state.get("consumed") and not state.get("history")))
        if version == 1 and not same_order:
            raise ValueError(
                f"this cursor (version 1) was saved in the middle of epoch {state.get('epoch')} by an earlier robowds "
                "whose shuffled order differs from this one's: resuming it would repeat some samples of that epoch and "
                f"skip others. Start the next epoch instead: a new dataset with set_epoch({state['epoch'] + 1})")
        generation = cursor_generation(state, self.generations, "cursor")
        mine = {**self.cursor(), "samples": sum(counts_at(self.counts, self.generations, self.split, generation))}
        for key in ("split", "samples", "seed", "shuffle", "block", "policy"):
            if state[key] != mine[key]:
                at = f" at generation {generation}" if key == "samples" and generation < self.generation else ""
                raise ValueError(f"cursor was saved with {key}={state[key]!r}, this dataset has {mine[key]!r}{at}")
        check_progress(state, mine["samples"], "cursor")
        self.plan_generation = generation if epoch_begun(state) else self.generation
        self.epoch = int(state["epoch"])
        history = tuple(Topology(int(w), int(c)) for w, c in state["history"])
        if int(state["world_size"]) == self.world_size:  # positions do not depend on workers or batch size
            self.history, self.start = history, int(state["consumed"])
        else:  # elastic: what the old topology consumed is removed, the rest re-planned from 0
            self.history, self.start = history + (Topology(int(state["world_size"]), int(state["consumed"])),), 0
        self._yielded = 0

    def state_dict(self) -> dict[str, Any]:
        """Stateful protocol (torchdata StatefulDataLoader calls it inside each worker)."""
        return {**self.cursor(), "worker": {"id": self._worker[0], "workers": self._worker[1], "yielded": self._yielded}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_cursor(state)
        if self.start == state["consumed"] and "worker" in state:
            if state["worker"]["yielded"] and state["batch_size"] != self.batch_size:
                raise ValueError(  # a worker's progress is in its own round-robin batches of the old size
                    f"this StatefulDataLoader worker state was saved with batch_size={state['batch_size']}, this "
                    f"dataset has batch_size={self.batch_size}: each worker's progress counts its own batches, "
                    "which another batch size deals to other positions. Resume with the same batch size, or use "
                    "ShardLoader, whose cursor counts samples and continues with any batch size")
            self._yielded = state["worker"]["yielded"]

    # -- reading ---------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch for this copy of the dataset (this DataLoader worker's share).

        The cursor lives in the copy that hands the items out. A copy that reads the rank's whole
        sequence (no DataLoader workers, as in `DataLoader(num_workers=0)` and torchdata's
        `StatefulDataLoader(num_workers=0)`, or a single worker) moves itself to the next epoch just
        before it hands out the epoch's last item: a new pass, and a `state_dict()` taken at that point,
        are the next epoch from its start, whether or not the consumer went on to exhaust this pass
        (Lightning takes exactly `len(loader)` batches and never does). With 2 or more workers no copy
        sees the whole rank: a pass that ran to its end leaves the copy at the start of the same epoch
        (a new iterator gets fresh copies of the parent's dataset anyway), so call `set_epoch` per epoch
        or use `ShardLoader`, whose cursor lives in the parent."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        self._worker = (worker, workers)
        if workers == 1 and (self.at_epoch_end() or self._share_done()):
            self.next_epoch(self.epoch)  # a state saved after the last item by an earlier version
        if workers > 1 and self._share_done() and self._holds_last_batch():
            raise ValueError(
                f"this state of a {workers}-worker StatefulDataLoader was saved after the last batch of epoch "
                f"{self.epoch}: each worker gets only its own state, so none can tell that the others finished "
                f"too, and the pass would be empty. Resume it with ShardLoader, or save before the last batch, "
                f"or start a new loader without the state after ds.set_epoch({self.epoch + 1})")
        epoch, length = self.epoch, self.epoch_length()
        unit = self.batch_size if self.collate_fn is not None else 1
        share = worker_count(length, self.start, self.batch_size, workers, worker)  # positions of this worker
        done = min(self._yielded * unit, share)  # of them already handed out (a loaded Stateful state)
        share -= done
        items = -(-share // unit)  # what this pass hands out: samples, or batches
        last = items - 1 if workers == 1 else -1  # the item after which this copy moves to the next epoch
        source = ShardSource(self.base, self.storage_options, self.verify, self.retry, cache=self.cache,
                             shards=self.shards, max_request_bytes=self.max_request_bytes,
                             jitter_key=f"{self.rank}/{worker}")
        chunks = self.plan().worker_ids(length, self.start, self.batch_size, workers, worker, skip=done)
        samples = self.reads().samples(source, (i for chunk in chunks for i in chunk.tolist()), raw=self._raw_batches())
        collate_fn, pool = self.collate_fn, None
        if self._slots is not None and info is not None and type(collate_fn) is Collate:
            pool = SlotPool(self._slots, worker)  # batches in reused shared memory (reader/batching.py)
            collate_fn = _PooledCollate(collate_fn, pool)
        items = planned_items(samples, collate_fn, self.batch_size, last, self._count_item,
                              lambda: self.next_epoch(epoch))
        yield from items if pool is None else map(pool.pack, items)
        if workers > 1 and self.epoch == epoch:
            # a worker's share ran to its end: this copy starts the same epoch again (persistent workers)
            self.start, self._yielded = 0, 0

    def _share_done(self) -> bool:
        """Whether this copy has handed out every item of its share of the epoch (a loaded state)."""
        if self._yielded == 0:
            return False
        worker, workers = self._worker
        unit = self.batch_size if self.collate_fn is not None else 1
        return self._yielded * unit >= worker_count(self.epoch_length(), self.start, self.batch_size, workers, worker)

    def _holds_last_batch(self) -> bool:
        """Whether this worker's share holds the rank's last batch of the epoch (batches are dealt
        round-robin from the cursor)."""
        worker, workers = self._worker
        batches = -(-(self.epoch_length() - self.start) // self.batch_size)
        return batches > 0 and (batches - 1) % workers == worker

    def _raw_batches(self) -> bool:
        """Whether samples go to collation with their fixed-shape arrays as bytes in place (`RawArray`),
        which `Collate` copies straight into the batch tensors. Only for `Collate` itself (a custom
        collate_fn, or a subclass, gets ndarrays as before), and not when a transform or the TCHW
        camera layout needs the arrays first."""
        return type(self.collate_fn) is Collate and self.transform is None and not self.cameras

    def _count_item(self) -> None:
        self._yielded += 1

    def reads(self) -> SampleReads:
        """How this copy turns sample ids into samples now (`reader/sample_reads.py`): fixed for a pass,
        the current epoch (what the transform draws from) included."""
        return SampleReads(self.shards, self._first, self.members, self.keep, self.cameras, self.on_error,
                           self.transform, self.seed, self.epoch, self._heartbeat, self.batch_size,
                           self._release_pages)
