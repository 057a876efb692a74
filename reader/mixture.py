"""`Mixture`: one IterableDataset over several `ShardDataset`s, sampled by weight, exact and resumable.

Each position of the mixture's epoch picks a source and one of that source's draws by pure
arithmetic (`reader/mixing.py`), and draw k of a source reads the k-th position of that source's own
epoch plan. So the mixture has the same shape as one `ShardDataset`: a sequence of `samples_per_epoch`
positions per epoch, split into equal contiguous parts per rank (`pad` / `drop`), dealt to DataLoader
workers batch by batch round-robin, and a cursor that is only (epoch, positions consumed, elastic
history) plus a hash of the configuration: under 1 KB for any number of sources. `ShardLoader`
drives it exactly as it drives a `ShardDataset` (same cursor protocol).

Memory per worker: the sources' [shards] arrays, one `EpochOrder` per (source, source epoch) in use,
and the positions of the chunk being read (`CHUNK` positions, a few MB); nothing of size
`samples_per_epoch`.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from robowds.reader.cursor import MIXTURE_KEYS, as_cursor, check_export, check_keys, check_progress, export_mismatch, \
    exports_hash
from robowds.reader.dataset import ShardDataset
from robowds.reader.dataset_args import checked_batching, resolve_topology, sample_rng
from robowds.reader.emit import planned_items
from robowds.reader.generations import counts_at, epoch_begun
from robowds.reader.mixing import DEFAULT_BLOCK, MixPlan, SourcePlan, normalise_weights
from robowds.reader.old_keywords import BATCHING, refuse_old_keywords
from robowds.reader.plan import POLICIES, Topology, worker_chunks, worker_count
from robowds.reader.sample_reads import Transform
from robowds.reader.source import ShardSource

MIX_STATE_VERSION = 1
CHUNK = 1 << 13  # positions planned at a time per worker (each source reads ahead within them)
_NUMERIC = set("biuf")


def _member_key(member: str) -> str:
    """The sample dict key of a member file name (`joints_mask.npy` -> `joints_mask`)."""
    return member.rsplit(".", 1)[0]


def _fill_specs(schemas: Sequence[Mapping[str, Any]]) -> dict[str, tuple[Any, ...]]:
    """key -> (kind, dtype, shape) of every field and mask any source's manifest declares, for
    `fill_missing`: numeric fields are filled with zeros of the declared shape, masks with False
    (every step padded), text with "". The first source declaring a key decides its shape."""
    specs: dict[str, tuple[Any, ...]] = {}
    for schema in schemas:
        for name, spec in schema.items():
            dtype, shape = spec.get("dtype"), spec.get("shape")
            if shape is not None and isinstance(dtype, str) and dtype not in ("str", "json") \
                    and np.dtype(dtype).kind in _NUMERIC:
                specs.setdefault(name, ("zeros", dtype, tuple(shape)))
                mask = _member_key(spec["mask_member"]) if spec.get("mask_member") else f"{name}_mask"
                specs.setdefault(mask, ("zeros", "bool", tuple(shape[:1])))
            elif dtype == "str":
                specs.setdefault(name, ("text",))
    return specs


class Mixture(IterableDataset):
    """Samples (or, after `set_batching(..., collate_fn=...)`, batches) of several exports mixed by `weights`.

    `datasets`: `ShardDataset`s (their split, seed, shuffle and block decide each source's own order;
    their rank/world are ignored: the mixture splits its positions). `names`: one per source (default
    `source0`, ...), prefixed to keys as `<name>/<key>` and given as `__source__`. `transforms`: one
    per source (or a dict by name), `fn(sample, rng) -> sample`, mapping each source's sample to the
    common schema (`rng` seeded from (seed, epoch, prefixed key), as `ShardDataset`'s). `fill_missing`:
    a field that another source's manifest declares and this source's does not is filled with zeros
    of the declared shape and dtype, and its mask with False (all padding), before the transform.
    `samples_per_epoch`: positions per epoch (default: the sum of the sources' sizes). Batching is set
    by `ShardLoader(mixture, batch_size=...)`, or `set_batching` under a plain DataLoader.
    """

    @refuse_old_keywords("Mixture", dict.fromkeys(("batch_size", "drop_last", "collate_fn"), BATCHING))
    def __init__(self, datasets: Sequence[ShardDataset], weights: Sequence[float], *, seed: int = 0,
                 names: Sequence[str] | None = None, samples_per_epoch: int | None = None, block: int = DEFAULT_BLOCK,
                 policy: str = "pad", transforms: Sequence[Transform | None] | Mapping[str, Transform] | None = None,
                 fill_missing: bool = False, rank: int | None = None, world_size: int | None = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if len(weights) != len(datasets) or not datasets:
            raise ValueError(f"{len(datasets)} datasets but {len(weights)} weights: give one weight per dataset")
        self.datasets = list(datasets)
        self.weights = tuple(float(w) for w in normalise_weights(weights))
        self.names = list(names) if names is not None else [f"source{i}" for i in range(len(datasets))]
        if len(self.names) != len(datasets) or len(set(self.names)) != len(self.names):
            raise ValueError(f"names must be one distinct name per dataset, got {self.names}")
        self.sizes = tuple(int(sum(ds.counts)) for ds in self.datasets)  # [S] samples per source
        for name, size, w in zip(self.names, self.sizes, self.weights):
            if size == 0 and w > 0:
                raise ValueError(f"source {name!r} has no samples in its split but weight {w}")
        if isinstance(transforms, Mapping):
            unknown = set(transforms) - set(self.names)
            if unknown:
                raise ValueError(f"transforms for unknown sources {sorted(unknown)}; sources are {self.names}")
            transforms = [transforms.get(n) for n in self.names]
        self.transforms = list(transforms) if transforms is not None else [None] * len(datasets)
        if len(self.transforms) != len(datasets):
            raise ValueError("transforms: give one per dataset (None for none), or a dict by name")
        schemas = [{n: spec for n, spec in ds.manifest["schema"].items()
                    if getattr(ds, "keep", None) is None or n in ds.keep} for ds in self.datasets]  # fields= honoured
        every = _fill_specs(schemas)
        own = [_fill_specs([schema]) for schema in schemas]
        # per source: the fields (and masks) other sources declare and it does not, filled before its transform
        self.fill = [{k: v for k, v in every.items() if k not in mine} if fill_missing else {} for mine in own]
        self.seed, self.block, self.policy = int(seed), int(block), policy
        self._samples_per_epoch = samples_per_epoch  # None: the sum of the sizes of the shards the epoch reads
        self.source_generations = tuple(ds.generation for ds in self.datasets)  # [S] each source's export generation
        self._use(self.source_generations)  # sets plan_generations, sizes, length_per_epoch, exports
        self.rank, self.world_size = resolve_topology(rank, world_size)
        self.batch_size, self.drop_last, self.collate_fn = 1, False, None  # set by ShardLoader / set_batching
        self.epoch, self.start, self.history = 0, 0, ()  # the cursor (as ShardDataset's)
        self._yielded = 0
        self._worker: tuple[int, int] = (0, 1)
        self._plan: tuple[tuple, MixPlan] | None = None  # the cached plan, by (epoch, history, rank, world)

    def set_batching(self, batch_size: int, drop_last: bool = False,
                     collate_fn: Callable[[list[dict[str, Any]]], Any] | None = None) -> Mixture:
        """As `ShardDataset.set_batching`: the loader's batch size, drop_last and collate_fn, in place
        (ShardLoader calls it; call it yourself under a plain DataLoader). The sources' own batching is
        unused: the mixture deals its positions."""
        self.batch_size, self.drop_last, self.collate_fn = checked_batching(batch_size, drop_last, collate_fn)
        return self

    # -- what each source is --------------------------------------------------------------------
    def stats(self, name: str) -> dict[str, Any]:
        """The normalisation statistics of source `name`'s split, from its manifest (field -> stats)."""
        return self.datasets[self.names.index(name)].stats

    def config_hash(self) -> str:
        """What a cursor must agree on, hashed (so the cursor stays small for any number of sources):
        names, weights, and each source's split, size (the shards the current epoch reads) and plan
        parameters."""
        parts = [[n, w, ds.split, size, ds.seed, ds.shuffle, ds.block]
                 for n, w, ds, size in zip(self.names, self.weights, self.datasets, self.sizes)]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]

    def _counts(self, generations: Sequence[int]) -> list[tuple[int, ...]]:
        """Per source, samples per shard of the shards its generation in `generations` published."""
        return [counts_at(ds.counts, ds.generations, ds.split, g) for ds, g in zip(self.datasets, generations)]

    def _use(self, generations: Sequence[int]) -> None:
        """The epoch reads each source's shards of its generation in `generations` (the current ones, or
        a cursor's across an append: reader/generations.py): sizes, epoch length and export identities
        follow. Every rank loads the same cursor, so an epoch resumed across an append plans the same
        shards on all; the next epoch each rank's current ones (ranks must read the same manifests)."""
        self.plan_generations = tuple(generations)  # [S] part of the cursor
        self.sizes = tuple(sum(c) for c in self._counts(generations))  # [S] samples per source this epoch
        self.length_per_epoch = (int(self._samples_per_epoch) if self._samples_per_epoch is not None
                                 else sum(self.sizes))
        self.exports = exports_hash([ds.generations[g - 1].export for ds, g in zip(self.datasets, generations)])

    # -- the plan --------------------------------------------------------------------------------
    def plan(self, epoch: int | None = None) -> MixPlan:
        """This rank's plan for `epoch` (default the current one; cached): [S] and [K] arrays."""
        epoch = self.epoch if epoch is None else int(epoch)
        key = (epoch, self.history, self.rank, self.world_size, self.plan_generations)
        if self._plan is None or self._plan[0] != key:
            sources = [SourcePlan(counts, ds.seed, ds.shuffle, ds.block)
                       for ds, counts in zip(self.datasets, self._counts(self.plan_generations))]
            self._plan = (key, MixPlan(self.weights, self.length_per_epoch, sources, self.seed, epoch, self.block,
                                       self.policy, self.history, self.world_size, self.rank))
        return self._plan[1]

    def epoch_length(self) -> int:
        """Positions this rank reads in the current epoch (identical on every rank)."""
        n = self.plan().length
        return n // self.batch_size * self.batch_size if self.drop_last else n

    def __len__(self) -> int:
        n = self.epoch_length()
        return -(-n // self.batch_size) if self.collate_fn is not None else n

    def choices(self, positions: np.ndarray, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(source [P], sample id within that source's split [P]) at this rank's `positions` [P] of the
        epoch (default the current one). Pure arithmetic (`MixPlan.ids`)."""
        return self.plan(epoch).ids(positions)

    def sequence(self) -> list[tuple[str, int]]:
        """This rank's (source name, sample id) for the current epoch, materialised (tests, tools)."""
        s, ids = self.choices(np.arange(self.epoch_length(), dtype=np.int64))
        return [(self.names[a], b) for a, b in zip(s.tolist(), ids.tolist())]

    # -- the cursor (the protocol ShardLoader and ShardDataset share) ---------------------------
    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.start, self.history, self._yielded = int(epoch), 0, (), 0
            if self.plan_generations != self.source_generations:
                self._use(self.source_generations)  # a new epoch reads every shard of every source, appended ones too

    def at_epoch_end(self) -> bool:
        return 0 < self.epoch_length() <= self.start

    def next_epoch(self, finished: int) -> None:
        if self.epoch == finished:
            self.set_epoch(finished + 1)

    def cursor(self, consumed: int | None = None) -> dict[str, Any]:
        """JSON-serialisable; ~290 bytes plus ~3 per source (configuration and exports hashed; `generations`
        lists each source's generation)."""
        return {"version": MIX_STATE_VERSION, "kind": "mixture", "config": self.config_hash(),
                "samples_per_epoch": self.length_per_epoch, "seed": self.seed, "block": self.block,
                "policy": self.policy, "batch_size": self.batch_size, "epoch": self.epoch,
                "consumed": int(self.start if consumed is None else consumed), "world_size": self.world_size,
                "history": [[t.world_size, t.consumed] for t in self.history], "exports": self.exports,
                "generations": list(self.plan_generations)}

    def load_cursor(self, state: dict[str, Any]) -> None:
        """Continue where `state` stopped: another batch size or worker count needs nothing (the cursor
        counts positions); another world size re-plans the rest of the epoch (elastic).

        `state` is checked first (`reader/cursor.py`), as `ShardDataset.load_cursor` checks its own; the
        sources' exports through the `exports` hash (a cursor saved before it was recorded loads unchecked).
        A source appended to since (`generations`: reader/generations.py) finishes the epoch over the
        shards the epoch began with; the next epoch reads all of them."""
        state = as_cursor(state, "mixture cursor")
        if state.get("kind") != "mixture" or state.get("version") != MIX_STATE_VERSION:
            raise ValueError(f"not a mixture cursor of version {MIX_STATE_VERSION}: {state.get('kind')!r}, "
                             f"version {state.get('version')!r}")
        check_keys(state, MIXTURE_KEYS, "mixture cursor")
        generations = self._cursor_generations(state)
        now = self.plan_generations
        self._use(generations)  # what the cursor's epoch read; back to `now` if the cursor is refused
        try:
            check_export(state.get("exports"), self.exports, "mixture cursor", "exports", state["epoch"])
            mine = self.cursor()
            for key in ("config", "samples_per_epoch", "seed", "block", "policy"):
                if state[key] != mine[key]:
                    what = " (sources, weights, or a source's split, size or plan)" if key == "config" else ""
                    raise ValueError(f"mixture cursor was saved with {key}={state[key]!r}{what}, "
                                     f"this mixture has {mine[key]!r}")
            check_progress(state, self.length_per_epoch, "mixture cursor")
        except ValueError:
            self._use(now)
            raise
        if not epoch_begun(state):  # nothing of the epoch read: it reads every shard, as a new epoch
            self._use(self.source_generations)
        self.epoch = int(state["epoch"])
        history = tuple(Topology(int(w), int(c)) for w, c in state["history"])
        if int(state["world_size"]) == self.world_size:
            self.history, self.start = history, int(state["consumed"])
        else:
            self.history, self.start = history + (Topology(int(state["world_size"]), int(state["consumed"])),), 0
        self._yielded = 0

    def _cursor_generations(self, state: dict[str, Any]) -> tuple[int, ...]:
        """Each source's generation in the cursor (`generations`; a cursor without it, saved before it was
        recorded: the current ones), checked: one per source, each one its export has."""
        if "generations" not in state:
            return self.source_generations
        listed = state["generations"]
        if len(listed) != len(self.datasets) or not all(type(g) is int and g >= 1 for g in listed):
            raise ValueError(f"mixture cursor key 'generations' must list one integer >= 1 per source "
                             f"({len(self.datasets)}), got {json.dumps(listed)[:60]}: pass what state_dict() "
                             "returned, unchanged (through JSON is fine)")
        for name, g, last in zip(self.names, listed, self.source_generations):
            if g > last:
                raise export_mismatch(f"the cursor was saved at generation {g} of source {name!r}, whose export "
                                      f"has generations 1 to {last} (another export, or exported again)",
                                      "mixture cursor", "generations", state["epoch"])
        return tuple(listed)

    def state_dict(self) -> dict[str, Any]:
        """Stateful protocol (torchdata StatefulDataLoader calls it inside each worker)."""
        worker = {"id": self._worker[0], "workers": self._worker[1], "yielded": self._yielded}
        return {**self.cursor(), "worker": worker}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_cursor(state)
        if "worker" in state and self.start == state["consumed"] and state["worker"]["yielded"]:
            if state["batch_size"] != self.batch_size:
                raise ValueError(
                    f"this worker state was saved with batch_size={state['batch_size']}, this mixture has "
                    f"{self.batch_size}: a worker's progress counts its own batches, which another batch size deals "
                    "differently. Resume with ShardLoader (its cursor counts samples), or with the same batch size")
            self._yielded = state["worker"]["yielded"]

    # -- reading ---------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch for this worker's share, as `ShardDataset.__iter__` (same
        epoch moves, same round-robin dealing of batches)."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        self._worker = (worker, workers)
        epoch, length = self.epoch, self.epoch_length()
        unit = self.batch_size if self.collate_fn is not None else 1
        share = worker_count(length, self.start, self.batch_size, workers, worker)
        if workers == 1 and (self.at_epoch_end() or (self._yielded and self._yielded * unit >= share)):
            self.next_epoch(epoch)
            epoch, length = self.epoch, self.epoch_length()
            share = worker_count(length, self.start, self.batch_size, workers, worker)
        if workers > 1 and self._yielded and self._yielded * unit >= share \
                and (-(-(length - self.start) // self.batch_size) - 1) % workers == worker:
            raise ValueError(  # as ShardDataset: no worker can tell that the others finished too
                f"this state of a {workers}-worker StatefulDataLoader was saved after the last batch of epoch "
                f"{self.epoch}: the pass would be empty. Resume it with ShardLoader, or save before the last "
                f"batch, or start a new loader without the state after mixture.set_epoch({self.epoch + 1})")
        done = min(self._yielded * unit, share)
        items = -(-(share - done) // unit)
        last = items - 1 if workers == 1 else -1
        positions = worker_chunks(length, self.start, self.batch_size, workers, worker, skip=done, chunk=CHUNK)
        plan = self.plan()  # bound now: the cursor may move to the next epoch before the last chunk is read
        samples = self._samples((plan.ids(p) for p in positions), epoch, f"{self.rank}/{worker}")
        yield from planned_items(samples, self.collate_fn, self.batch_size, last, self._count_item,
                                 lambda: self.next_epoch(epoch))
        if workers > 1 and self.epoch == epoch:
            self.start, self._yielded = 0, 0

    def _count_item(self) -> None:
        self._yielded += 1

    def _samples(self, chunks: Iterator[tuple[np.ndarray, np.ndarray]], epoch: int,
                 jitter: str) -> Iterator[dict[str, Any] | None]:
        """Samples in position order. Each source reads its own ids through its dataset's read-ahead
        (`SampleReads.samples`), fed from one shared queue of planned chunks: a source that looks
        ahead pulls the next chunk, and the other sources' ids from it wait in their queues (bounded by
        about READ_AHEAD / weight positions)."""
        queues: list[deque[int]] = [deque() for _ in self.datasets]  # per source: sample ids planned
        order: deque[int] = deque()  # the source of each planned position not yet handed out

        def pull() -> bool:
            chunk = next(chunks, None)
            if chunk is None:
                return False
            source, ids = chunk
            order.extend(source.tolist())
            for s in np.unique(source).tolist():
                queues[s].extend(ids[source == s].tolist())
            return True

        def ids_of(s: int) -> Iterator[int]:
            while True:
                while not queues[s]:
                    if not pull():
                        return
                yield queues[s].popleft()

        readers: dict[int, Iterator[dict[str, Any] | None]] = {}
        while order or pull():
            s = order.popleft()
            if s not in readers:
                ds = self.datasets[s]
                source = ShardSource(ds.base, ds.storage_options, ds.verify, ds.retry, cache=ds.cache,
                                     shards=ds.shards, max_request_bytes=ds.max_request_bytes,
                                     jitter_key=f"{jitter}/{self.names[s]}")
                readers[s] = ds.reads().samples(source, ids_of(s))
            sample = next(readers[s])
            yield None if sample is None else self._finish(s, sample, epoch)

    def _finish(self, s: int, sample: dict[str, Any], epoch: int) -> dict[str, Any]:
        """The missing fields filled, then the source's transform; the key prefixed, `__source__` set."""
        name = self.names[s]
        key = f"{name}/{sample['__key__']}"
        for field, spec in self.fill[s].items():
            sample[field] = np.zeros(spec[2], dtype=spec[1]) if spec[0] == "zeros" else ""
        if self.transforms[s] is not None:
            sample = self.transforms[s](sample, sample_rng(self.seed, epoch, key))
        sample["__key__"], sample["__source__"] = key, name
        return sample
