"""The episode facts (`episode_facts.EpisodeFacts`) from an export's staged records, and the
per-episode warning texts the report page lists.

Everything comes from what the map step recorded per episode (`build.build_episode`'s report: the
per-field `rate_hz` and `gaps`, `repairs`, `missing_streams`, `masked_steps`/`steps`, `float32_loss`,
the cameras' measured and declared fps; `stage.py`'s error and, for a rejected episode whose extent
was known, its `duration_s`): no shard or store is read again. Pure; O(episodes x fields).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

from robowds.export.job.episode_facts import EpisodeFacts, concat_facts
from robowds.export.store.validate import FPS_TOLERANCE

# Repairs.as_dict key -> what was done to that many samples (singular, plural)
_REPAIRS = {"nonfinite_time": ("sample with a non-finite timestamp dropped",
                               "samples with a non-finite timestamp dropped"),
            "nan_rows": ("sample with NaN or infinite values dropped", "samples with NaN or infinite values dropped"),
            "unsorted": ("timestamp out of order (the samples were sorted)",
                         "timestamps out of order (the samples were sorted)"),
            "duplicate_time": ("duplicate timestamp dropped (the last sample of the run kept)",
                               "duplicate timestamps dropped (the last sample of each run kept)"),
            "zero_quaternion": ("zero-norm quaternion dropped", "zero-norm quaternions dropped")}


def facts_of(records: Iterable[dict[str, Any]], fields: list[str]) -> EpisodeFacts:
    """One row per staged record (exported or rejected), sorted by episode id; `fields`: the columns
    (`episode_facts.fact_fields`)."""
    rows = [_row(r, fields) for r in records]
    width = len(fields)
    facts = EpisodeFacts(
        episode_id=[r["episode_id"] for r in rows], split=[r["split"] for r in rows],
        exported=np.asarray([r["exported"] for r in rows], bool).reshape(-1),  # [E]
        windows=np.asarray([r["windows"] for r in rows], np.int64).reshape(-1),  # [E]
        duration_s=np.asarray([r["duration_s"] for r in rows], np.float64).reshape(-1),  # [E]
        reason=[r["reason"] for r in rows], warnings=[r["warnings"] for r in rows], fields=list(fields),
        **{name: np.asarray([r[name] for r in rows], dtype).reshape(len(rows), width)  # [E, F]
           for name, dtype in (("rate_hz", np.float64), ("gaps", np.int64), ("missing", bool),
                               ("masked_steps", np.int64), ("steps", np.int64))})
    return concat_facts([facts], list(fields))  # sorted by episode id


def _row(record: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """One episode's values: numbers per field as lists in `fields` order."""
    error = record["error"]
    row: dict[str, Any] = {"episode_id": record["episode_id"], "split": record["split"], "exported": not error}
    if error:
        row.update(windows=0, duration_s=_or_nan(record.get("duration_s")), warnings=[],
                   reason=f"{error['field']}: {error['message']}" if error.get("field") else error["message"],
                   rate_hz=[math.nan] * len(fields), gaps=[0] * len(fields), missing=[False] * len(fields),
                   masked_steps=[0] * len(fields), steps=[0] * len(fields))
        return row
    rep = record["report"]
    video = rep.get("video", {})
    missing = set(rep.get("missing_streams", []))
    rates = rep.get("rate_hz", {})
    row.update(windows=int(rep["emitted"]), duration_s=float(rep["duration_s"]), reason=None,
               warnings=episode_warnings(rep, fields),
               rate_hz=[_or_nan(rates.get(f, video.get(f, {}).get("measured_fps"))) for f in fields],
               gaps=[int(rep.get("gaps", {}).get(f, 0)) for f in fields], missing=[f in missing for f in fields],
               masked_steps=[int(rep["masked_steps"].get(f, 0)) for f in fields],
               steps=[int(rep["steps"].get(f, 0)) for f in fields])
    return row


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _counted(n: int, words: tuple[str, str]) -> str:
    return f"{n} {words[0] if n == 1 else words[1]}"


def episode_warnings(report: dict[str, Any], fields: list[str]) -> list[str]:
    """Short texts, per field in `fields` order: repairs of its timestamps or values, a stream the
    episode did not record, a camera whose declared fps is not the measured one (beyond the tolerance
    validate and the export report use), float32 losing what its values vary by."""
    out = []
    for name in fields:
        repairs = report.get("repairs", {}).get(name, {})
        done = [_counted(int(repairs[key]), words) for key, words in _REPAIRS.items() if repairs.get(key)]
        if done:
            out.append(f"{name}: {'; '.join(done)}")
        if name in report.get("missing_streams", []):
            out.append(f"{name}: not recorded in this episode (its windows carry zeros with an all-false mask)")
        video = report.get("video", {}).get(name, {})
        declared, measured = video.get("declared_fps"), video.get("measured_fps")
        if declared and measured and abs(measured - declared) > FPS_TOLERANCE * declared:
            out.append(f"{name}: the video is declared at {declared:g} fps but its frames come at {measured:.4g} fps")
        loss = report.get("float32_loss", {}).get(name)
        if loss:
            out.append(f"{name}: float32 changes its values by up to {loss['max_error']:.3g}, "
                       f"{100 * loss['max_error'] / loss['spread']:.3g}% of the spread {loss['spread']:.3g} of "
                       f"value column {loss['column']} (float_dtype: float64 keeps them)")
    return out
