"""The mergeable parts of the export report, so that an append's `report` is a full export's.

`report.masked_fraction`, `report.video.<camera>.bytes_per_frame / psnr_db_mean /
missing_frame_fraction` and `report.duration_s` are ratios or rounded sums: from two reports alone
their merge is not the full export's figure. Their parts are kept here instead (counts and exact
sums), saved in `stats-state.msgpack` under `report` (`side_files.py`), and both a full export and an
append derive the report's figures from them with the same functions, so the two agree to the byte.
The rest of those entries is mergeable from the reports themselves (minima, maxima, sums, lists
ordered by the store: `merge_report_parts`), as is `report.float32_loss` (the worst episode per field,
the first in store order on a tie, and a count).

Exact sums: per-episode durations and PSNRs are floats; their sum as a `Fraction` is exact, so it is a
function of the multiset of values (as the statistics state is) and merges without rounding; saved as
text ("n/d"), since the numerator outgrows msgpack's 64-bit integers. `float(Fraction)` rounds
correctly, so a full export's `duration_s` is `round(math.fsum(durations), 6)`.

Size: per field two integers, per camera four integers and one fraction (tens of characters): bounded
by the store's fields and cameras, never by its episodes.
"""

from __future__ import annotations

import copy
from fractions import Fraction
from typing import Any, Iterable

from robowds.export.core.precision import PrecisionLoss, worst

MISSING_LISTED = 20  # episodes named per camera in the report's missing-frame list (bounded report)
_NO_VIDEO = {"bytes": 0, "frames": 0, "span_steps": 0, "psnr_sum": "0", "psnr_episodes": 0}


def exact_sum(values: Iterable[float]) -> Fraction:
    """The exact sum of these floats (order-independent, mergeable)."""
    return sum((Fraction(v) for v in values), Fraction(0))


def report_parts(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The parts of the report's ratios and sums, over the records that were exported (no error):
    `duration_s` (exact sum, text), `masked` (field -> [masked steps, steps]) and `video` (camera ->
    stored bytes and frames, steps inside the video's span, exact PSNR sum and how many episodes)."""
    duration: list[float] = []
    masked: dict[str, list[int]] = {}
    video: dict[str, dict[str, Any]] = {}
    for r in records:
        if r["error"]:
            continue
        rep = r["report"]
        duration.append(rep["duration_s"])
        for name, steps in rep["steps"].items():
            m = masked.setdefault(name, [0, 0])
            m[0] += rep["masked_steps"][name]
            m[1] += steps
        for name, v in rep.get("video", {}).items():
            acc = video.setdefault(name, {"bytes": 0, "frames": 0, "span_steps": 0, "psnr": []})
            acc["bytes"] += v["bytes"]
            acc["frames"] += v["frames"]
            acc["span_steps"] += v.get("span_steps", 0)
            if v["psnr_db"] is not None:
                acc["psnr"].append(v["psnr_db"])
    return {"duration_s": str(exact_sum(duration)), "masked": dict(sorted(masked.items())),
            "video": {name: {"bytes": acc["bytes"], "frames": acc["frames"], "span_steps": acc["span_steps"],
                             "psnr_sum": str(exact_sum(acc["psnr"])), "psnr_episodes": len(acc["psnr"])}
                      for name, acc in sorted(video.items())}}


def merge_parts(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The parts of two disjoint sets of episodes' reports: the parts of their union."""
    masked = {n: [a["masked"].get(n, [0, 0])[0] + b["masked"].get(n, [0, 0])[0],
                  a["masked"].get(n, [0, 0])[1] + b["masked"].get(n, [0, 0])[1]]
              for n in sorted(set(a["masked"]) | set(b["masked"]))}
    video = {}
    for name in sorted(set(a["video"]) | set(b["video"])):
        x, y = a["video"].get(name, _NO_VIDEO), b["video"].get(name, _NO_VIDEO)
        video[name] = {"bytes": x["bytes"] + y["bytes"], "frames": x["frames"] + y["frames"],
                       "span_steps": x["span_steps"] + y["span_steps"],
                       "psnr_sum": str(Fraction(x["psnr_sum"]) + Fraction(y["psnr_sum"])),
                       "psnr_episodes": x["psnr_episodes"] + y["psnr_episodes"]}
    return {"duration_s": str(Fraction(a["duration_s"]) + Fraction(b["duration_s"])), "masked": masked,
            "video": video}


def duration_s(parts: dict[str, Any]) -> float:
    """`report.duration_s`: the episodes' summed duration, correctly rounded, to the microsecond."""
    return round(float(Fraction(parts["duration_s"])), 6)


def masked_fraction(parts: dict[str, Any]) -> dict[str, float]:
    """`report.masked_fraction`: per field, the share of its window steps that are masked."""
    return {n: (round(m / s, 6) if s else 0.0) for n, (m, s) in sorted(parts["masked"].items())}


def video_ratios(part: dict[str, Any], missing_steps: int) -> dict[str, Any]:
    """The ratio entries of `report.video.<camera>` from the camera's part."""
    count = part["psnr_episodes"]
    return {"bytes_per_frame": round(part["bytes"] / max(1, part["frames"]), 1),
            "psnr_db_mean": round(float(Fraction(part["psnr_sum"]) / count), 3) if count else None,
            "missing_frame_fraction": round(missing_steps / part["span_steps"], 6) if part["span_steps"] else 0.0}


def merge_report_parts(a: dict[str, Any], b: dict[str, Any], parts: dict[str, Any],
                       order: dict[str, int]) -> dict[str, Any]:
    """`duration_s`, `masked_fraction`, `video` and (where some field loses precision) `float32_loss`
    of the reports `a` (old episodes) and `b` (new ones), given the merged `parts` of both;
    `order`: episode id -> its place in the store (lists and ties follow the store, as in a full export)."""
    out: dict[str, Any] = {"duration_s": duration_s(parts), "masked_fraction": masked_fraction(parts), "video": {}}
    empty = {"psnr_db_min": None, "psnr_frames": 0, "fps_mismatch": [], "frames_held_max": 0,
             "missing_frame_steps": 0, "missing_frame_episodes": []}
    for name in sorted(set(a.get("video", {})) | set(b.get("video", {}))):
        x, y = a.get("video", {}).get(name, empty), b.get("video", {}).get(name, empty)
        lows = [v for v in (x["psnr_db_min"], y["psnr_db_min"]) if v is not None]
        missing = x["missing_frame_steps"] + y["missing_frame_steps"]
        by_store = sorted([*x["fps_mismatch"], *y["fps_mismatch"]], key=lambda e: order[e["episode_id"]])
        listed = sorted([*x["missing_frame_episodes"], *y["missing_frame_episodes"]],
                        key=lambda e: order[e["episode_id"]])  # each side's first 20 hold the union's first 20
        out["video"][name] = {"psnr_db_min": min(lows, default=None),
                              "psnr_frames": x["psnr_frames"] + y["psnr_frames"], "fps_mismatch": by_store,
                              "frames_held_max": max(x["frames_held_max"], y["frames_held_max"]),
                              "missing_frame_steps": missing, "missing_frame_episodes": listed[:MISSING_LISTED],
                              **video_ratios(parts["video"].get(name, _NO_VIDEO), missing)}
    lossy = copy.deepcopy(a.get("float32_loss", {}))
    for name, entry in b.get("float32_loss", {}).items():
        if name not in lossy:
            lossy[name] = entry
            continue
        first, second = sorted((lossy[name], entry), key=lambda e: order[e["episode_id"]])
        ep, loss = worst(_loss(first), _loss(second))  # the first in store order on a tie
        lossy[name] = {"episode_id": ep, **loss.as_dict(), "episodes": first["episodes"] + second["episodes"]}
    if lossy:
        out["float32_loss"] = dict(sorted(lossy.items()))
    return out


def _loss(entry: dict[str, Any]) -> tuple[str, PrecisionLoss]:
    return entry["episode_id"], PrecisionLoss(entry["column"], entry["max_error"], entry["spread"])
