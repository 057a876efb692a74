"""`robowds verify OUT --since G`: which shards verify reads, when it checks only what appends added.

An append only adds shards, numbered on after each split's last, and the manifest's `generations`
records each split's shard count once each generation was published (`reader/manifest.py`). So the
shards added after generation G are, per split, `shards[count_G:]` (`count_G` = 0 for a split G did
not have). `shards_to_check` is the one place that picks them, for the sequential verify and for any
parallel one; the rest of this module reads and checks `generations`.

Cost: O(generations x splits + shards) in Python; no shard is opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from robowds.export.errors import UserError
from robowds.reader.manifest import ShardInfo, shards_of


class GenerationsError(ValueError):
    """`generation` / `generations` of a manifest that do not describe its shards (edited or damaged)."""


@dataclass(frozen=True)
class ShardSelection:
    """What verify reads: `(split, shard)` in verify's order (splits sorted, shards as listed) and how
    many listed shards it leaves unread (those of generations <= `since`)."""

    shards: list[tuple[str, ShardInfo]]
    skipped: int
    since: int | None = None
    current: int = 1  # the export's generation


def generation_counts(manifest: dict[str, Any]) -> list[dict[str, int]]:
    """Per generation (entry g - 1 for generation g), each split's shard count once it was published,
    checked against the manifest's splits. A manifest without `generations` (exports before it) is
    generation 1 holding all its shards. Raises GenerationsError naming the entry and key."""
    now = {split: len(entry["shards"]) for split, entry in manifest["splits"].items()}
    if "generations" not in manifest:
        if manifest.get("generation", 1) != 1:
            raise GenerationsError(f"manifest.json: 'generation' is {manifest['generation']!r} but there is no "
                                   "'generations' list")
        return [now]
    entries = manifest["generations"]
    if not isinstance(entries, list) or not entries:
        raise GenerationsError("manifest.json: 'generations' must be a non-empty list")
    counts: list[dict[str, int]] = []
    for i, entry in enumerate(entries):
        at = f"manifest.json: generations[{i}]"
        shards = entry.get("shards") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or entry.get("generation") != i + 1 or isinstance(entry["generation"], bool):
            raise GenerationsError(f"{at}: 'generation' must be {i + 1} (entries are generations 1, 2, ... in order)")
        if not isinstance(shards, dict) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                   for n in shards.values()):
            raise GenerationsError(f"{at}: 'shards' must map each split to a shard count >= 0")
        for split in sorted(set(shards) | set(counts[-1] if counts else ())):
            n, before = shards.get(split, 0), counts[-1].get(split, 0) if counts else 0
            if split not in now:
                raise GenerationsError(f"{at}: split {split!r} is not one of the manifest's splits")
            if n > now[split]:
                raise GenerationsError(f"{at}: split {split!r} has {n} shard(s), the manifest lists {now[split]}")
            if n < before:
                raise GenerationsError(f"{at}: split {split!r} has {n} shard(s), fewer than generation {i}'s "
                                       f"{before} (appends only add shards)")
        counts.append(dict(shards))
    if counts[-1] != now:
        raise GenerationsError(f"manifest.json: generations[{len(counts) - 1}]: shards {counts[-1]} are not the "
                               f"manifest's {now}")
    if manifest.get("generation") != len(counts):
        raise GenerationsError(f"manifest.json: 'generation' is {manifest.get('generation')!r}, 'generations' "
                               f"has {len(counts)} entries")
    if entries[-1].get("job_id") != manifest.get("job_id"):
        raise GenerationsError(f"manifest.json: generations[{len(counts) - 1}]: 'job_id' is not the manifest's")
    return counts


def check_since(since: Any) -> int:
    """`since` as a generation to verify after: an int >= 1 (`shards_to_check` checks the upper end
    against the manifest); else one UserError."""
    if not isinstance(since, int) or isinstance(since, bool):
        raise UserError(f"--since must be a generation number (a whole number >= 1), got {since!r}",
                        hint="e.g. --since 1 checks only the shards the appends after the first export added")
    if since < 1:
        raise UserError(f"--since must be >= 1 (generation 1 is the first export), got {since}",
                        hint="--since 1 checks only the shards the appends added; leave --since out to check "
                             "every shard")
    return since


def shards_to_check(manifest: dict[str, Any], since: int | None = None, out: object = "OUT") -> ShardSelection:
    """The shards verify reads: all of them, or with `since` those the generations after it added.
    `since` outside 1..current is a UserError, and so are `generations` that do not describe the
    shards (plain verify, which reads every shard, reports those as a failure instead)."""
    splits = sorted(manifest["splits"])
    every = [(split, shard) for split in splits for shard in shards_of(manifest, split)]
    if since is None:
        return ShardSelection(every, 0)
    check_since(since)
    try:
        counts = generation_counts(manifest)
    except GenerationsError as exc:
        raise UserError(f"{exc}: --since cannot tell which shards the appends added",
                        hint="leave --since out to check every shard (the manifest is not as robowds wrote it: "
                             "edited or damaged)") from exc
    if since > len(counts):
        raise UserError(f"--since {since}: the export in {out} is at generation {len(counts)} (1 is its first "
                        "export, each append adds one)",
                        hint=f"pass a generation from 1 to {len(counts)} (the manifest's `generations` lists them), "
                             "or leave --since out to check every shard")
    start = counts[since - 1]  # split -> shards of generations <= since
    chosen = [(split, shard) for split in splits for shard in shards_of(manifest, split)[start.get(split, 0):]]
    return ShardSelection(chosen, len(every) - len(chosen), since, len(counts))
