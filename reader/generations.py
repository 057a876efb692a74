"""Which shards an epoch plan reads when the export grew: generations, and a cursor's across an append.

Why: `robowds export --append` adds shards at the end of each split's list and raises the manifest's
`generation` (`reader/manifest.py` says what `generations` holds). A run that saved its cursor in the
middle of an epoch and restarts on the grown export must finish that epoch over exactly the samples
it began with: the plan is a pure function of the shard counts, and new shards would change every
position. So a cursor records the generation its epoch's plan reads (`generation`, with that
generation's job id as `export`), the plan keeps that generation's shards (each split's first
`generations[g - 1]["shards"][split]`: appends only add at the end, so their sample ids are the same
in the grown export), and the next epoch, or any dataset without a cursor, reads every shard.

The refusals keep what `reader/cursor.py` guards: a cursor is loaded only on the export it was saved
on, here meaning an export whose generation g is the cursor's (same job id). A cursor of another
export, or of an OUT exported again (its generations list another job at g, or stops before g), is
refused naming both.

Pure: no I/O, no torch; O(generations) per call (one entry per append, never per shard or sample).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from robowds.reader.cursor import EXPORT_ID_CHARS, export_mismatch
from robowds.reader.manifest import ManifestError


@dataclass(frozen=True)
class Generation:
    """One entry of the manifest's `generations`: the job that wrote it (`export`: the first hex
    digits of its job id, as a cursor records them; None where the manifest has no job id) and, per
    split, the split's shard count once it was published."""

    generation: int
    export: str | None
    shards: Mapping[str, int]


def generations_of(manifest: Mapping[str, Any], where: str = "manifest.json") -> tuple[Generation, ...]:
    """The manifest's generations, oldest first, checked: numbered 1, 2, ..., each split's shard count
    an integer that never shrinks and never passes the split's shards, the last one's every shard (so
    the current epoch never silently leaves a listed shard out). A manifest written before
    generations were recorded is generation 1 with every shard. A damaged entry is a `ManifestError`
    naming it (never a KeyError in a DataLoader worker)."""
    splits = manifest.get("splits", {})
    listed = manifest.get("generations")
    job = manifest.get("job_id")
    if listed is None:
        if manifest.get("generation", 1) != 1:
            raise ManifestError(f"{where}: 'generation' is {manifest['generation']!r} but there is no 'generations' "
                                "list")
        export = job[:EXPORT_ID_CHARS] if isinstance(job, str) and job else None
        return (Generation(1, export, {s: len(e["shards"]) for s, e in splits.items()}),)
    if not isinstance(listed, list) or not listed:
        raise ManifestError(f"{where}: 'generations' must be a non-empty list, got {str(listed)[:60]}")
    out: list[Generation] = []
    for i, entry in enumerate(listed):
        at = f"{where}: generations entry {i}"
        number = entry.get("generation") if isinstance(entry, dict) else None
        if number != i + 1 or isinstance(number, bool):
            raise ManifestError(f"{at}: must be an object with 'generation' {i + 1} (generations are numbered on "
                                f"from 1)")
        shards, entry_job = entry.get("shards"), entry.get("job_id")
        if not isinstance(entry_job, str) or not entry_job or not isinstance(shards, dict):
            raise ManifestError(f"{at}: needs a 'job_id' string and a 'shards' object (split -> shard count)")
        for split, count in shards.items():
            have = len(splits[split]["shards"]) if split in splits else 0
            before = out[-1].shards.get(split, 0) if out else 0
            if not isinstance(count, int) or isinstance(count, bool) or not before <= count <= have:
                raise ManifestError(f"{at}: split {split!r} shard count {str(count)[:20]} must be an integer from "
                                    f"{before} (the generation before) to {have} (the split's shards)")
        out.append(Generation(i + 1, entry_job[:EXPORT_ID_CHARS], dict(shards)))
    for split, entry in splits.items():  # the last generation is the export as it stands: every shard
        if out[-1].shards.get(split, 0) != len(entry["shards"]):
            raise ManifestError(f"{where}: generations entry {len(out) - 1} (the last) counts "
                                f"{out[-1].shards.get(split, 0)} shards of split {split!r}, the split lists "
                                f"{len(entry['shards'])}")
    if isinstance(job, str) and listed[-1]["job_id"] != job:  # the last generation is the manifest's own job
        raise ManifestError(f"{where}: generations entry {len(out) - 1} (the last) has job_id "
                            f"{listed[-1]['job_id'][:EXPORT_ID_CHARS]}..., the manifest's is {job[:EXPORT_ID_CHARS]}...")
    if manifest.get("generation", len(out)) != len(out):
        raise ManifestError(f"{where}: 'generation' is {manifest.get('generation')!r}, 'generations' lists "
                            f"{len(out)}")
    return tuple(out)


def counts_at(counts: Sequence[int], table: Sequence[Generation], split: str, generation: int) -> tuple[int, ...]:
    """Samples per shard of `split` as generation `generation` published it: the first shards of
    `counts` (the split's, all generations) that generation counted. [shards at g]"""
    return tuple(counts[:table[generation - 1].shards.get(split, 0)])


def cursor_generation(state: Mapping[str, Any], table: Sequence[Generation], what: str) -> int:
    """The generation whose shards the cursor's epoch reads, after checking the cursor was saved on
    this export: its (`generation`, `export`) must be an entry of `table`. A cursor without
    `generation` (saved before robowds recorded it) is at the generation whose job id is its `export`
    (the last one, on an unchanged export), or, without `export` either, the last one; a cursor or
    export without a job id is not checked. ValueError in `check_export`'s words otherwise."""
    saved, mine, last = state.get("export"), table[-1].export, len(table)
    if "generation" not in state:
        found = [g.generation for g in table if saved is not None and g.export == saved]
        if saved is None or mine is None or found:
            return found[-1] if found else last
        where = (f"the cursor was saved on export {saved}, this dataset reads export {mine} (the first "
                 f"{EXPORT_ID_CHARS} hex digits of each manifest's job_id)")
        raise export_mismatch(where, what, "export", state["epoch"])
    g = state["generation"]
    if g > last:
        raise export_mismatch(f"the cursor was saved at generation {g} of export {saved}, this dataset reads export "
                              f"{mine}, which has generations 1 to {last} (another export, or OUT exported again)",
                              what, "generation", state["epoch"])
    at = table[g - 1].export
    if saved is None or at is None or saved == at:
        return g
    if g == last:
        where = (f"the cursor was saved on export {saved}, this dataset reads export {mine} (the first "
                 f"{EXPORT_ID_CHARS} hex digits of each manifest's job_id)")
    else:
        where = (f"the cursor was saved on export {saved} (generation {g}), this dataset reads export {mine} "
                 f"(generation {last}), whose generation {g} is export {at} (another export, or OUT exported again)")
    raise export_mismatch(where, what, "export", state["epoch"])


def epoch_begun(state: Mapping[str, Any]) -> bool:
    """Whether the cursor's epoch has handed anything out: positions consumed, an elastic history, or
    a torchdata worker's progress. An epoch not begun (a cursor saved at an epoch's end: `(epoch + 1,
    0)`) reads every shard after an append, as a new epoch does; nothing of it was read, so nothing
    repeats or is skipped. A state of one of several torchdata workers counts as begun: one worker
    cannot tell what the others handed out, and all must plan the same shards."""
    worker = state.get("worker") or {"workers": 1, "yielded": 0}
    return bool(state["consumed"] or state["history"] or worker["yielded"] or worker["workers"] > 1)
