"""verify's checks of what an export holds besides shards and side files, all derived from the manifest:
`<split>.wids.json`, Energon's `.nv-meta/.info.json`, the report's counts and `generations`.

Every append rewrites these (with the manifest), so `verify --since` checks them like plain verify
does. Each is a pure function of the manifest's shard list: cost O(shards), no shard opened.
"""

from __future__ import annotations

import json
from typing import Any

from robowds.export.check.result import VerifyResult
from robowds.export.check.since import GenerationsError, generation_counts
from robowds.export.output.energon import INFO_JSON
from robowds.export.output.publish import wids_index
from robowds.export.store.location import StoreLocation
from robowds.reader.manifest import shards_of


def check_derived(root: StoreLocation, manifest: dict[str, Any], result: VerifyResult) -> None:
    """Add a failure for each derived file or count that does not match the manifest."""
    for split in sorted(manifest["splits"]):
        rel = f"{split}.wids.json"
        if not root.is_file(rel):
            result.failures.append(f"file {rel}: missing")
        elif root.read_bytes(rel) != wids_index(split, manifest["splits"][split]):
            result.failures.append(f"file {rel}: does not list the manifest's shards of split {split!r} "
                                   "(paths, samples, bytes)")
    _check_info_json(root, manifest, result)
    _check_report(manifest, result)
    try:
        generation_counts(manifest)
    except GenerationsError as exc:
        result.failures.append(str(exc))


def _check_info_json(root: StoreLocation, manifest: dict[str, Any], result: VerifyResult) -> None:
    """`.nv-meta/.info.json`, where present: its `shard_counts` must be the manifest's shards and their
    sample counts, whoever wrote it (robowds, or `energon prepare`: the same counts), since Energon
    trusts them to read the shards. `dataset.yaml` and `split.yaml` may be the user's (publish keeps
    files it did not write), so verify does not judge them; an export without `.nv-meta/` passes."""
    if not root.is_file(INFO_JSON):
        return
    where = f"file {INFO_JSON}"
    try:
        counts = json.loads(root.read_bytes(INFO_JSON))["shard_counts"]
    except (ValueError, KeyError, TypeError) as exc:  # not JSON, not UTF-8, no shard_counts
        result.failures.append(f"{where}: not Energon's shard counts ({type(exc).__name__}: {exc})")
        return
    if not isinstance(counts, dict):
        result.failures.append(f"{where}: 'shard_counts' is not an object of shard path -> samples")
        return
    want = {s.path: s.samples for split in sorted(manifest["splits"]) for s in shards_of(manifest, split)}
    if counts != want:
        wrong = sorted(set(counts) ^ set(want) | {p for p in set(counts) & set(want) if counts[p] != want[p]})
        result.failures.append(f"{where}: shard_counts differ from the manifest's shards for {len(wrong)} "
                               f"shard(s), e.g. {wrong[0]}")


def _check_report(manifest: dict[str, Any], result: VerifyResult) -> None:
    """The report's per-split counts (`report.splits`: episodes, windows) and exported episodes against
    the splits they describe; a split the report names without episodes may be absent from `splits`."""
    report = manifest.get("report")
    if not isinstance(report, dict) or not isinstance(report.get("splits"), dict):
        return
    splits = manifest["splits"]
    for split in sorted(set(report["splits"]) | set(splits)):
        entry = splits.get(split, {"episodes": [], "samples": 0})
        want = {"episodes": len(entry.get("episodes", [])), "windows": entry["samples"]}
        got = report["splits"].get(split)
        if got != want:
            result.failures.append(f"manifest.json: report.splits[{split!r}] is {got}, the split holds {want}")
    exported = report.get("episodes", {}).get("exported")
    listed = sum(len(e.get("episodes", [])) for e in splits.values())
    if exported is not None and exported != listed:
        result.failures.append(f"manifest.json: report.episodes.exported is {exported}, the splits list {listed}")
