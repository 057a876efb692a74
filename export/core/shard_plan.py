"""The export plan: splits, sample keys, the global window order and shard boundaries. Pure.

Everything here is a function of episode ids, window counts/sizes, the config and the seed, never of
worker count or timing, which is what makes the shards byte-reproducible.
"""

from __future__ import annotations

import re
import zlib
from typing import Mapping, Sequence

import numpy as np

from robowds.export.errors import UserError, config_error

KEY_CHARS = re.compile(r"[^A-Za-z0-9_-]")
KEY_PREFIX_MAX = 40
SPLIT_RULE = "a fraction in [0, 1], a list of episode ids or rest"  # what a split's rule must be


def assign_splits(episode_ids: Sequence[str], rules: Mapping[str, object], seed: int,
                  declared: Mapping[str, str] | None = None) -> dict[str, str]:
    """Episode -> split. Precedence: the store's `split` column, explicit id lists, then seeded fractions
    of the remaining episodes (a seeded permutation of the sorted ids; counts rounded), rest to 'rest'."""
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
    fractions = [float(r) for r in rules.values()
                 if isinstance(r, (int, float)) and not isinstance(r, bool) and 0.0 <= r <= 1.0]
    if sum(fractions) > 1.0 + 1e-9:
        raise config_error("splits", dict(rules), "fractions that add up to at most 1",
                           "{train: rest, val: 0.1, test: 0.1}", note=f"these add up to {sum(fractions):g}")
    free = [ep for ep in sorted(episode_ids) if ep not in out]
    order = np.random.default_rng([seed, 0x5B117]).permutation(len(free))
    pos = 0
    rest = next(name for name, rule in rules.items() if rule == "rest")
    for name, rule in rules.items():
        if isinstance(rule, (int, float)) and not isinstance(rule, bool):
            if not 0.0 <= float(rule) <= 1.0:
                raise config_error(f"splits.{name}", rule, SPLIT_RULE, "0.1")
            count = int(round(float(rule) * len(free)))
            for idx in order[pos:pos + count]:
                out[free[idx]] = name
            pos += count
        elif not isinstance(rule, list) and rule != "rest":
            raise config_error(f"splits.{name}", rule, SPLIT_RULE, "0.1")
    for idx in order[pos:]:
        out[free[idx]] = rest
    return out


def key_prefixes(episode_ids: Sequence[str]) -> dict[str, str]:
    """A tar-safe, unique key prefix per episode: its id with unsafe characters replaced, shortened.
    Ids that collide after that get their position in sorted order appended (and more, should that
    spell another episode's prefix)."""
    safe = {ep: KEY_CHARS.sub("-", ep)[:KEY_PREFIX_MAX] or "ep" for ep in sorted(episode_ids)}
    counts: dict[str, int] = {}
    for s in safe.values():
        counts[s] = counts.get(s, 0) + 1
    out = {ep: s for ep, s in safe.items() if counts[s] == 1}
    used = set(out.values())
    for i, (ep, s) in enumerate(safe.items()):
        if ep in out:
            continue
        candidate, bump = f"{s[:KEY_PREFIX_MAX - 8]}-{i:06d}", 0
        while candidate in used:
            bump += 1
            candidate = f"{s[:KEY_PREFIX_MAX - 16]}-{i:06d}-{bump}"
        out[ep] = candidate
        used.add(candidate)
    return out


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
