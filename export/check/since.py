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
from robowds.reader.generations import generations_of
from robowds.reader.manifest import ManifestError, ShardInfo, shards_of


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
    checked against the manifest's splits by the reader's own check (`reader/generations.py`, which
    a resumed cursor relies on). A manifest without `generations` (exports before it) is generation 1
    holding all its shards. Raises GenerationsError naming the entry."""
    try:
        return [dict(g.shards) for g in generations_of(manifest)]
    except ManifestError as exc:
        raise GenerationsError(str(exc)) from exc


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
