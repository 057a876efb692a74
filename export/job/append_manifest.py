"""The manifest of an appended export: the old manifest with the new episodes' shards and counts added.

Built from `report.build_manifest` of the new episodes alone (whose `stats` and `schema` already come
from the merged statistics state: old state + new episodes') and the old manifest: per split the old
shards then the new ones, samples and bytes summed, episodes in the store's order (as a full export
lists them). The report's counts (`episodes`, `windows`, `splits`, `repairs`, `missing_streams`,
`storage`) are summed; `duration_s`, `masked_fraction`, `video` and `float32_loss` come from the
report parts saved in `stats-state.msgpack` merged with the new episodes' (`report_state.py`), so the
whole report is a full export's of the grown store but for `storage.output_bytes` and
`storage.amplification` (the same samples placed in other shards: other tar sizes).

An export whose `stats-state.msgpack` has no report parts (made before them): its append sums
`duration_s` as rounded and keeps the old export's `masked_fraction`, `video` and `float32_loss`
(the new episodes' where it has none), and saves no parts, so later appends to it do the same; a
full export with `--overwrite` brings the parts back.
"""

from __future__ import annotations

import copy
from typing import Any

from robowds.export.job.report import SplitStats, build_manifest, first_generation, generation_entry
from robowds.export.job.report_state import merge_report_parts
from robowds.export.job.spec import JobSpec


def merged_manifest(old: dict[str, Any], *, job: JobSpec, resolved: dict[str, Any], records: list[dict[str, Any]],
                    shards: list[dict[str, Any]], source: str, job_id: str,
                    split_stats: SplitStats, parts: dict[str, Any] | None) -> dict[str, Any]:
    """The appended export's manifest (`files` is set by the caller, with the side files). `parts`:
    the report parts of old and new episodes merged (`report_state.merge_parts`), None when the old
    export saved none (module docstring)."""
    new = build_manifest(schema=job.schema, job=job, resolved=resolved, records=records, shards=shards,
                         source=source, job_id=job_id, split_stats=split_stats)
    order = job.index  # episode id -> its place in the store
    doc = copy.deepcopy(old)
    doc.update({"job_id": job_id, "tool_version": new["tool_version"], "schema": new["schema"],
                "stats": new["stats"], "source": {"fingerprint": source, "episodes": len(job.schema.episode_ids)}})
    splits = {}
    for split in sorted(set(old["splits"]) | set(new["splits"])):
        a = old["splits"].get(split, {"episodes": [], "samples": 0, "bytes": 0, "shards": []})
        b = new["splits"].get(split, {"episodes": [], "samples": 0, "bytes": 0, "shards": []})
        splits[split] = {**a, **{k: v for k, v in b.items() if k not in ("episodes", "samples", "bytes", "shards")},
                         "episodes": sorted([*a["episodes"], *b["episodes"]], key=order.__getitem__),
                         "samples": a["samples"] + b["samples"], "bytes": a["bytes"] + b["bytes"],
                         "shards": [*a["shards"], *b["shards"]]}
    doc["splits"] = splits
    # exports before generations were written are generation 1: their own job and shards
    before = old.get("generations") or first_generation(old["job_id"], old["splits"])["generations"]
    generation = before[-1]["generation"] + 1
    doc["generation"], doc["generations"] = generation, [*before, generation_entry(generation, job_id, splits)]
    doc["report"] = _merged_report(old["report"], new["report"], order, {r["episode_id"] for r in records}, parts)
    return doc


def _merged_report(a: dict[str, Any], b: dict[str, Any], order: dict[str, int], added: set[str],
                   parts: dict[str, Any] | None) -> dict[str, Any]:
    """Report of old (`a`) + new (`b`, of the episodes `added`) episodes; an episode rejected before
    and tried again (it is in `added`) counts as new only."""
    retried = added
    rejected = sorted([*(r for r in a["episodes"]["rejected"] if r["episode_id"] not in retried and
                         r["episode_id"] in order), *b["episodes"]["rejected"]], key=lambda r: order[r["episode_id"]])
    out = {**b, **a}  # without parts: masked_fraction, video and float32_loss are the old export's (docstring)
    if parts is not None:  # duration_s, masked_fraction, video, float32_loss (when some field loses precision)
        out.update(merge_report_parts(a, b, parts, order))
    exported = a["episodes"]["exported"] + b["episodes"]["exported"]
    out["episodes"] = {"total": exported + len(rejected), "exported": exported, "rejected": rejected}
    out["windows"] = {k: a["windows"][k] + b["windows"][k] for k in a["windows"]}
    if parts is None:
        out["duration_s"] = round(a["duration_s"] + b["duration_s"], 6)
    out["splits"] = {s: {k: a["splits"].get(s, {}).get(k, 0) + b["splits"].get(s, {}).get(k, 0)
                         for k in ("episodes", "windows")} for s in sorted(set(a["splits"]) | set(b["splits"]))}
    repairs: dict[str, dict[str, int]] = copy.deepcopy(a["repairs"])
    for name, counts in b["repairs"].items():
        for k, v in counts.items():
            repairs.setdefault(name, {})[k] = repairs.get(name, {}).get(k, 0) + v
    out["repairs"] = repairs
    missing = copy.deepcopy(a.get("missing_streams", {}))
    for name, entry in b.get("missing_streams", {}).items():
        acc = missing.setdefault(name, {"episodes": 0, "episode_ids": []})
        acc["episodes"] += entry["episodes"]
        acc["episode_ids"] = sorted(acc["episode_ids"] + entry["episode_ids"], key=order.__getitem__)[:20]
    if missing:
        out["missing_streams"] = dict(sorted(missing.items()))
    source_bytes = b["storage"]["source_bytes"]  # the grown store's
    output_bytes = a["storage"]["output_bytes"] + b["storage"]["output_bytes"]
    out["storage"] = {"source_bytes": source_bytes, "output_bytes": output_bytes,
                      "amplification": round(output_bytes / source_bytes, 4) if source_bytes else None}
    return out

