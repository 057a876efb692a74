"""Checking a cursor before it is loaded: what `ShardDataset`, `ShardLoader` and `Mixture` accept.

Why: a cursor comes back from a checkpoint, a JSON file or a hand edit. Loaded unchecked, a wrong one
does not fail cleanly: `consumed=-5` re-reads 5 samples, `consumed=10**9` silently ends the epoch, a
missing key or a string for an integer is a KeyError or TypeError deep in the plan, and a cursor of
another export of the same split and size resumes at positions that are that export's samples. So
every key is checked for presence, type (a JSON bool is not an integer) and range, unknown keys are
refused, `consumed` and each elastic `history` entry must fit the epoch as the saved topology split it,
and the export the cursor was saved on must be the one being read, or one it was appended to
(`reader/generations.py`). Each problem is one `ValueError` naming the key.

Pure: no I/O, no torch; each check is O(keys + history entries x their world sizes).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from robowds.reader.plan import POLICIES, Topology, rank_share, remaining_ranges

EXPORT_ID_CHARS = 16  # hex digits of the manifest's job_id a cursor records (64 bits: enough to tell exports apart)


@dataclass(frozen=True)
class Key:
    """One cursor key: its JSON type, the smallest value an integer may take, the values a string may
    take, and whether a cursor of today's robowds always has it (`required`: older cursors lack the
    others, which are then not checked)."""

    kind: type
    minimum: int | None = None
    choices: tuple[str, ...] = ()
    required: bool = True
    nullable: bool = False


# What `ShardDataset.cursor()` / `state_dict()` write (`reader/dataset.py`); versions 1 and 2 share them.
DATASET_KEYS: dict[str, Key] = {
    "version": Key(int), "split": Key(str), "samples": Key(int, 0), "seed": Key(int), "shuffle": Key(bool),
    "block": Key(int), "policy": Key(str, choices=POLICIES), "batch_size": Key(int, 1), "epoch": Key(int, 0),
    "consumed": Key(int, 0), "world_size": Key(int, 1), "history": Key(list),
    "export": Key(str, required=False, nullable=True),  # the export's identity (absent before it was recorded)
    "generation": Key(int, 1, required=False),  # whose shards the epoch reads (reader/generations.py; absent before)
    "worker": Key(dict, required=False),  # a StatefulDataLoader worker's progress (`state_dict` only)
}
# What `Mixture.cursor()` / `state_dict()` write (`reader/mixture.py`).
MIXTURE_KEYS: dict[str, Key] = {
    "version": Key(int), "kind": Key(str), "config": Key(str), "samples_per_epoch": Key(int, 0), "seed": Key(int),
    "block": Key(int), "policy": Key(str, choices=POLICIES), "batch_size": Key(int, 1), "epoch": Key(int, 0),
    "consumed": Key(int, 0), "world_size": Key(int, 1), "history": Key(list),
    "exports": Key(str, required=False),  # a hash of the sources' export identities (absent before it was recorded)
    "generations": Key(list, required=False),  # per source, whose shards the epoch reads (absent before)
    "worker": Key(dict, required=False),
}
WORKER_KEYS: dict[str, Key] = {"id": Key(int, 0), "workers": Key(int, 1), "yielded": Key(int, 0)}
_JSON_NAMES = {int: "an integer", str: "a string", bool: "true or false", list: "a list", dict: "an object"}
_FROM_STATE_DICT = "pass what state_dict() returned, unchanged (through JSON is fine)"


def export_id(manifest: Mapping[str, Any]) -> str | None:
    """The identity a cursor records for an export: the first hex digits of its manifest's `job_id`
    (a hash of the source, the resolved config and the tool version, so two exports of the same split
    and size with another seed or store differ). None for a manifest without one (written by hand)."""
    job = manifest.get("job_id")
    return job[:EXPORT_ID_CHARS] if isinstance(job, str) and job else None


def exports_hash(ids: Sequence[str | None]) -> str:
    """A mixture's sources' export identities as one hash, so its cursor stays small for any number
    of sources: 16 hex digits."""
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()[:16]


def as_cursor(state: Any, what: str) -> dict[str, Any]:
    """`state` itself if it is a dict (a JSON object), else one ValueError saying what was passed."""
    if not isinstance(state, dict):
        raise ValueError(f"{what} must be a dict (a JSON object), got {type(state).__name__}: {_FROM_STATE_DICT}")
    return state


def check_keys(state: dict[str, Any], keys: Mapping[str, Key], what: str) -> None:
    """Every required key present, every key present of its JSON type and range, no key robowds does
    not write; `history` a list of [world_size >= 1, consumed >= 0] pairs, `worker` an object of
    `WORKER_KEYS`."""
    unknown = sorted(set(state) - set(keys), key=str)
    if unknown:
        raise ValueError(f"{what} key {unknown[0]!r} is not one robowds writes (its keys: {', '.join(keys)}): "
                         f"{_FROM_STATE_DICT}")
    for name, key in keys.items():
        if name in state:
            _check_value(state[name], key, f"{what} key {name!r}")
        elif key.required:
            raise ValueError(f"{what} key {name!r} is missing: {_FROM_STATE_DICT}")
    for i, entry in enumerate(state["history"]):
        if not (isinstance(entry, list) and len(entry) == 2):
            raise ValueError(f"{what} key 'history': entry {i} must be a [world_size, consumed] pair, "
                             f"got {_shown(entry)}")
        _check_value(entry[0], Key(int, 1), f"{what} key 'history': entry {i}'s world_size")
        _check_value(entry[1], Key(int, 0), f"{what} key 'history': entry {i}'s consumed")
    if "worker" in state:
        worker = state["worker"]
        check_keys_flat(worker, WORKER_KEYS, f"{what} key 'worker'")
        if worker["id"] >= worker["workers"]:
            raise ValueError(f"{what} key 'worker': id {worker['id']} is not below workers {worker['workers']}")


def check_keys_flat(state: dict[str, Any], keys: Mapping[str, Key], what: str) -> None:
    """`check_keys` for a nested object of plain keys (no history, no worker)."""
    unknown = sorted(set(state) - set(keys), key=str)
    if unknown:
        raise ValueError(f"{what}: {unknown[0]!r} is not one robowds writes (its keys: {', '.join(keys)})")
    for name, key in keys.items():
        if name not in state:
            raise ValueError(f"{what}: {name!r} is missing: {_FROM_STATE_DICT}")
        _check_value(state[name], key, f"{what}: {name!r}")


def check_progress(state: dict[str, Any], samples: int, what: str) -> None:
    """`consumed` and each `history` entry fit the epoch of `samples` positions as the topology that
    saved them split it: each of W ranks reads rank_share(remaining, W) positions, so no count may be
    above that (a cursor at the epoch's very end has exactly it). Cost: O(history^2 x world sizes)."""
    history, policy = state["history"], state["policy"]
    for i, (world, consumed) in enumerate(history):
        share = _share(samples, history[:i], world, policy)
        if consumed > share:
            raise ValueError(f"{what} key 'history': entry {i} says each of {world} ranks consumed {consumed} "
                             f"positions of epoch {state['epoch']}, but each had {share}: {_FROM_STATE_DICT}")
    share = _share(samples, history, state["world_size"], policy)
    if state["consumed"] > share:
        raise ValueError(f"{what} key 'consumed' is {state['consumed']}, but each of {state['world_size']} ranks "
                         f"reads {share} positions of epoch {state['epoch']} ({samples} samples, policy "
                         f"{policy!r}{', after the elastic history' if history else ''}): {_FROM_STATE_DICT}")


def check_export(saved: str | None, mine: str | None, what: str, key: str, epoch: int) -> None:
    """The cursor was saved on the export being read (`key` "export": a dataset's export identity;
    "exports": the hash of a mixture's sources' identities). A cursor without the identity (saved
    before robowds recorded it) or an export without one (a manifest without `job_id`) cannot be
    checked and is accepted."""
    if saved is None or mine is None or saved == mine:
        return
    if key == "export":
        where = (f"the cursor was saved on export {saved}, this dataset reads export {mine} (the first "
                 f"{EXPORT_ID_CHARS} hex digits of each manifest's job_id)")
    else:
        where = (f"the cursor was saved on sources whose exports hash to {saved}, this mixture's hash to {mine} "
                 f"(a source is another export: exported again, or another folder)")
    raise export_mismatch(where, what, key, epoch)


def export_mismatch(where: str, what: str, key: str, epoch: int) -> ValueError:
    """The one message for a cursor loaded on an export it was not saved on (`where` says which
    exports), with the fix; `reader/generations.py` uses it for cursors across an append too."""
    return ValueError(
        f"{what} key {key!r}: {where}: its positions would be another export's samples. Fix: load the cursor "
        f"with the export(s) it was saved from, or drop it and start afresh (a new loader without the cursor, "
        f"or set_epoch({epoch + 1}) for the next epoch)")


def _share(samples: int, history: Sequence[Sequence[int]], world: int, policy: str) -> int:
    """Positions per rank when `world` ranks split what `history` left of an epoch of `samples`."""
    lo, hi = remaining_ranges(samples, tuple(Topology(w, c) for w, c in history), policy)  # [K], [K]
    return rank_share(int((hi - lo).sum()), world, policy)


def _check_value(value: Any, key: Key, where: str) -> None:
    if value is None and key.nullable:
        return
    ok = (isinstance(value, int) and not isinstance(value, bool)) if key.kind is int else isinstance(value, key.kind)
    if not ok:
        raise ValueError(f"{where} must be {_JSON_NAMES[key.kind]}, got {_shown(value)}: {_FROM_STATE_DICT}")
    if key.minimum is not None and value < key.minimum:
        raise ValueError(f"{where} is {value}, must be >= {key.minimum}: {_FROM_STATE_DICT}")
    if key.choices and value not in key.choices:
        raise ValueError(f"{where} is {value!r}, must be one of {', '.join(map(repr, key.choices))}")


def _shown(value: Any) -> str:
    """A value as the user would recognise it, cut short."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text[:60]
