"""The export plan: splits, sample keys, the global window order and shard boundaries. Pure.

Everything here is a function of episode ids, window counts/sizes, the config and the seed, never of
worker count or timing, which is what makes the shards byte-reproducible.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from typing import Mapping, Sequence

import numpy as np

from robowds.export.errors import UserError, config_error

KEY_CHARS = re.compile(r"[^A-Za-z0-9_-]")
KEY_PREFIX_MAX = 40
SPLIT_RULE = "a fraction in [0, 1], a list of episode ids or rest"  # what a split's rule must be
# 2: each episode's split and key prefix are functions of its id (and the seed) alone (split_draw,
# key_prefix); 1 (unrecorded): a seeded permutation of all ids, and positions among colliding ids.
# Part of the job id, so an export planned the old way is never taken as up to date, nor resumed.
PLAN_VERSION = 2
SPLIT_PERSON = b"robowds.split.v1"  # BLAKE2b personalisation (at most 16 bytes): separates the two hashes
KEY_PERSON = b"robowds.key.v1"


def split_draw(episode_id: str, seed: int) -> float:
    """The uniform number in [0, 1) that places `episode_id` among the fractions of `splits` under `seed`.

    Exactly: `int.from_bytes(blake2b(f"{seed}:{episode_id}".encode("utf-8"), digest_size=8,
    person=b"robowds.split.v1").digest(), "big") / 2**64` (`seed` in decimal; the colon cannot occur
    in it, so the message names one (seed, id) pair). Python's `hash` is salted per process and numpy's
    generators are free to change their streams between versions; BLAKE2b is fixed by RFC 7693, so
    another implementation (or a later robowds) reproduces every split."""
    digest = hashlib.blake2b(f"{seed}:{episode_id}".encode("utf-8"), digest_size=8, person=SPLIT_PERSON).digest()
    return int.from_bytes(digest, "big") / 2.0 ** 64


def assign_splits(episode_ids: Sequence[str], rules: Mapping[str, object], seed: int,
                  declared: Mapping[str, str] | None = None) -> dict[str, str]:
    """Episode -> split, where each episode's split is a function of (its id, the seed, the rules) alone:
    adding or removing episodes never moves another one, so a grown store exported again (or appended
    to) keeps every old episode in its split.

    Precedence: the store's `split` column (`declared`), then the rules' explicit id lists, then the
    fractions, then the `rest` split. For the fractions, each remaining episode draws
    u = `split_draw(id, seed)` in [0, 1) and goes to the first fraction rule, in the order the rules
    are given, whose cumulative fraction (the running float sum f1, f1 + f2, ... of the fraction
    rules' values) exceeds u; an episode with u at or past the last sum goes to `rest`. So a fraction
    holds in expectation, not exactly (12 episodes with `val: 0.2` may give 0, 1, 2, 3... val
    episodes: binomial); the export's report counts what each split got (`report.splits`).

    Why not a seeded permutation of the sorted ids with rounded counts (robowds before `PLAN_VERSION`
    2): every id's place in the permutation, and each split's count, depended on the whole list, so
    adding one episode moved others between splits. Cost: one 8-byte BLAKE2b per free episode (~1 us;
    0.1 s at 100k episodes), no state beyond the output mapping."""
    declared = dict(declared or {})
    out: dict[str, str] = {}
    known = set(episode_ids)
    for ep, split in declared.items():
        out[ep] = split
    for name, rule in rules.items():
        if isinstance(rule, list):
            for ep in map(str, rule):
                if ep not in known:
                    some = ", ".join(sorted(known)[:3])
                    raise UserError(f"config splits.{name} names episode {ep!r}, which the store does not have",
                                    hint=f"list episode ids the store has (e.g. {some}), or give splits.{name} a "
                                         f"fraction, e.g. --set splits.{name}=0.1")
                if ep in out and out[ep] != name:
                    raise UserError(f"episode {ep!r} is assigned to both {out[ep]!r} and {name!r}",
                                    hint=f"name {ep!r} in one split's list only (the store's split column, where "
                                         "it has one, places episodes too)")
                out[ep] = name
    bounds: list[tuple[float, str]] = []  # (cumulative fraction, split) in the rules' order
    total = 0.0
    for name, rule in rules.items():
        if isinstance(rule, (int, float)) and not isinstance(rule, bool):
            if not 0.0 <= float(rule) <= 1.0:
                raise config_error(f"splits.{name}", rule, SPLIT_RULE, "0.1")
            total += float(rule)
            bounds.append((total, name))
        elif not isinstance(rule, list) and rule != "rest":
            raise config_error(f"splits.{name}", rule, SPLIT_RULE, "0.1")
    if total > 1.0 + 1e-9:
        raise config_error("splits", dict(rules), "fractions that add up to at most 1",
                           "{train: rest, val: 0.1, test: 0.1}", note=f"these add up to {total:g}")
    rest = next(name for name, rule in rules.items() if rule == "rest")
    for ep in episode_ids:
        if ep not in out:
            u = split_draw(ep, seed)
            out[ep] = next((name for bound, name in bounds if u < bound), rest)
    return out


def key_prefixes(episode_ids: Sequence[str]) -> dict[str, str]:
    """A tar-safe, unique key prefix per episode, a function of its id alone (`key_prefix`), so adding
    or removing episodes never changes another episode's sample keys. Two ids whose prefixes would
    still be equal (a 48-bit hash collision, or an id spelling another's hashed prefix) are a UserError
    naming both: the fix is renaming one, and no prefix may depend on which other ids exist."""
    out: dict[str, str] = {}
    owner: dict[str, str] = {}  # prefix -> the id that has it
    for ep in sorted(episode_ids):
        prefix = key_prefix(ep)
        if prefix in owner:
            raise UserError(f"episodes {owner[prefix]!r} and {ep!r} get the same sample key prefix {prefix!r}",
                            hint="rename one of them in the store (ids made of A-Z a-z 0-9 _ - and at most "
                                 f"{KEY_PREFIX_MAX} characters are used as they are)")
        owner[prefix] = ep
        out[ep] = prefix
    return out


def key_prefix(episode_id: str) -> str:
    """An episode's key prefix: its id where that is tar-safe already (1 to `KEY_PREFIX_MAX` characters
    of [A-Za-z0-9_-]); else the id with other characters replaced by `-`, cut to 27 characters (empty:
    `ep`), then `-` and 12 hex digits of `blake2b(id.encode("utf-8"), digest_size=6,
    person=b"robowds.key.v1")`: at most 40 characters.

    Why every changed id gets the hash, not only ids that collide with another after the change (as
    before `PLAN_VERSION` 2, which appended the id's position among the sorted colliding ids): whether
    an id collides depends on which other ids exist ("a.b" alone would be `a-b`, but not once "a b"
    or "a-b" joins it), so no rule that leaves a lone changed id as it is can keep every key when the
    store grows. 48 bits: two changed ids sharing their first 27 characters collide with probability
    ~n^2 / 2^49 (1e-5 at 100k such ids), and then `key_prefixes` refuses them by name."""
    if 0 < len(episode_id) <= KEY_PREFIX_MAX and not KEY_CHARS.search(episode_id):
        return episode_id
    safe = KEY_CHARS.sub("-", episode_id)[:KEY_PREFIX_MAX - 13] or "ep"
    digest = hashlib.blake2b(episode_id.encode("utf-8"), digest_size=6, person=KEY_PERSON).hexdigest()
    return f"{safe}-{digest}"


def window_order(window_counts: Sequence[int], seed: int, split_name: str, shuffle: bool) -> np.ndarray:
    """Global order of a split's windows as (episode position, window position) rows: [W, 2] int64.

    Windows are enumerated episode by episode; with `shuffle` the enumeration is permuted uniformly
    (seeded by seed and split). Only integers are held, never window data.
    """
    counts = np.asarray(window_counts, dtype=np.int64)
    episode = np.repeat(np.arange(len(counts), dtype=np.int64), counts)  # [W]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]) if len(counts) else np.zeros(0, np.int64)
    within = np.arange(len(episode), dtype=np.int64) - np.repeat(starts, counts)  # [W]
    rows = np.stack([episode, within], axis=1)
    if shuffle and len(rows):
        rng = np.random.default_rng([seed, zlib.crc32(split_name.encode())])
        rows = rows[rng.permutation(len(rows))]
    return rows


def pack_shards(sizes: Sequence[int], max_samples: int, max_bytes: int, overhead: int,
                min_shards: int = 1) -> list[tuple[int, int]]:
    """[start, stop) runs of consecutive samples: a shard closes before it would pass `max_samples` or
    `max_bytes` (including the tar's `overhead`); a sample larger than `max_bytes` gets a shard of its own.

    A split of at least `min_shards` samples gets at least `min_shards` shards, so that every DataLoader
    worker of a plain webdataset pipeline has a shard to read (it refuses fewer shards than workers):
    when the greedy packing gives fewer, the samples are first cut into `min_shards` runs whose counts
    differ by at most one, and each run is packed greedily (so the limits still hold). Splits that the
    limits already cut into enough shards are packed exactly as without `min_shards`."""
    bounds = _greedy(sizes, 0, len(sizes), max_samples, max_bytes, overhead)
    if len(bounds) >= min_shards or len(sizes) < min_shards:
        return bounds
    cuts = [len(sizes) * k // min_shards for k in range(min_shards + 1)]  # balanced: counts differ by <= 1
    return [b for lo, hi in zip(cuts, cuts[1:]) for b in _greedy(sizes, lo, hi, max_samples, max_bytes, overhead)]


def _greedy(sizes: Sequence[int], lo: int, hi: int, max_samples: int, max_bytes: int,
            overhead: int) -> list[tuple[int, int]]:
    """Greedy packing of samples [lo, hi): close a shard when the next sample would not fit."""
    bounds: list[tuple[int, int]] = []
    start, total = lo, overhead
    for i in range(lo, hi):
        size = sizes[i]
        count = i - start
        if count and (count >= max_samples or total + size > max_bytes):
            bounds.append((start, i))
            start, total = i, overhead
        total += size
    if hi > start:
        bounds.append((start, hi))
    return bounds
