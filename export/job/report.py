"""Assembling the manifest: field schema, per-split shard lists, statistics and the export report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from robowds.export import __version__
from robowds.export.core.precision import PrecisionLoss, loss_fix, loss_text, worst
from robowds.export.core.shard_plan import PLAN_VERSION
from robowds.export.core.stats import FieldStats, StatsAccumulator
from robowds.export.errors import UserError
from robowds.export.job.build import output_dtype
from robowds.export.job.report_state import (MISSING_LISTED, duration_s, masked_fraction, report_parts,
                                             video_ratios)
from robowds.export.media.clips import MP4_CODEC
from robowds.export.media.geometry import configured_size
from robowds.export.media.video_windows import MEMBER_EXT
from robowds.export.store.validate import FPS_TOLERANCE
from robowds.reader.format import mask_field
from robowds.reader.manifest import FORMAT, FORMAT_VERSION, LAYOUT_VERSION

if TYPE_CHECKING:
    from robowds.export.job.spec import JobSpec
    from robowds.export.media.images import ImageOptions
    from robowds.export.store.location import StoreLocation
    from robowds.export.store.schema import StoreSchema


VIDEO_CODECS = {"mp4": MP4_CODEC, "mp4-intra": MP4_CODEC, "av1": "av1", "jpg": "jpeg"}  # raw has none
IMAGE_CODECS = {"png": "png", "jpg": "jpeg"}


def _crop_json(crop: Any) -> Any:
    return list(crop) if isinstance(crop, tuple) else crop


def _image_entry(name: str, options: "ImageOptions | None") -> dict[str, Any]:
    """Schema of an image field: the source's own format (`original`) or the re-encoded one."""
    if options is None or options.encoding == "original":
        return {"member": f"{name}.<png|jpg|webp|bmp>", "dtype": "uint8", "shape": None, "encoding": "original"}
    size = configured_size(options.crop, options.resize)
    return {"member": f"{name}.{options.encoding}", "dtype": "uint8", "encoding": options.encoding,
            "codec": IMAGE_CODECS[options.encoding], "layout": "HWC",
            "shape": [size[1], size[0], 3] if size else [None, None, 3], "crop": _crop_json(options.crop)}


def field_schema(schema: "StoreSchema", job: "JobSpec") -> dict[str, dict[str, Any]]:
    """What every sample member is: dtype, shape, window and provenance."""
    out: dict[str, dict[str, Any]] = {}
    for name in job.fields:
        spec = schema.fields[name]
        entry: dict[str, Any] = {"kind": spec.kind, "names": list(spec.names) if spec.names else None,
                                 "units": list(spec.units) if isinstance(spec.units, tuple) else spec.units}
        if name in job.build.windows:
            w = job.build.windows[name]
            dims = len(spec.names) if spec.names else job.build.widths.get(name)
            entry.update(member=f"{name}.npy", mask_member=f"{mask_field(name)}.npy",
                         dtype=output_dtype(job.build, name).name, shape=[w.steps, dims],
                         rate_hz=w.rate_hz, duration_s=w.duration_s, offset_s=w.offset_s, pad=w.pad,
                         interpolation=w.interpolation, max_gap_s=w.max_gap_s,
                         quaternion_order=spec.quaternion_order)
        elif spec.kind == "video":
            w, options = job.build.videos[name]
            size = configured_size(options.crop, options.resize)
            entry.update(member=f"{name}.{MEMBER_EXT[options.encoding]}",
                         mask_member=f"{mask_field(name)}.npy", dtype="uint8",
                         shape=[w.steps, *(size[::-1] if size else (None, None)), 3],
                         layout="THWC", rate_hz=w.rate_hz, duration_s=w.duration_s, offset_s=w.offset_s,
                         pad=w.pad, selection=options.selection, encoding=options.encoding,
                         codec=VIDEO_CODECS.get(options.encoding), crop=_crop_json(options.crop))
        elif spec.kind == "text":
            entry.update(member=f"{name}.txt", dtype="str", shape=[], encoding="utf-8")
        elif spec.kind == "image":
            entry.update(_image_entry(name, job.build.images.get(name)))
        elif spec.kind == "value":
            entry.update(member=f"{name}.npy", dtype=spec.value_dtype, shape=None)
        out[name] = {k: v for k, v in entry.items() if v is not None}
    ns_clock = any(schema.fields[n].time_unit == "ns" for n in job.load_fields if schema.fields[n].kind == "timeseries")
    out["meta"] = {"kind": "meta", "member": "meta.json", "dtype": "json",
                   "keys": ["anchor", "episode_id", "split", "t", *(["t_ns"] if ns_clock else [])]}
    return out


class SplitStats:
    """Per split and field accumulators that each staged record's statistics are folded into as the
    record is loaded (and then dropped from it): memory is one folded state per split and field, not
    one state per episode. A map task folds its batch's records (`fold`) and hands back `states()`;
    the parent folds those (`fold_states`) as the tasks finish, so this work runs in the workers."""

    def __init__(self) -> None:
        self._acc: dict[str, dict[str, StatsAccumulator]] = {}

    def fold(self, record: dict[str, Any]) -> dict[str, Any]:
        """Fold and drop `record["stats"]`; returns the record."""
        states = record.pop("stats", None) or {}
        if not record["error"]:
            for name, state in states.items():
                if state is not None:
                    if "single_value" not in state:  # staged by a robowds before the histogram state
                        raise UserError(f"episode {record['episode_id']!r} was staged by an older robowds",
                                        hint="delete the output folder's .robowds-work and re-run")
                    acc = self._acc.setdefault(record["split"], {}).setdefault(name, StatsAccumulator())
                    acc.add_state(state)
        return record

    def states(self) -> dict[str, dict[str, dict]]:
        """split -> field -> the folded state (`FieldStats.to_state`): what a map task hands back for its
        batch of episodes, so the parent folds one state per batch instead of one per episode. Exact:
        a fold's result depends only on the multiset of values, never on how they were grouped
        (export/core/stats.py), so the bytes do not depend on the batch size or the worker count."""
        out: dict[str, dict[str, dict]] = {}
        for split, fields in self._acc.items():
            for name, acc in fields.items():
                merged = acc.result()
                if merged is not None:
                    out.setdefault(split, {})[name] = merged.to_state()
        return out

    def fold_states(self, states: dict[str, dict[str, dict]]) -> None:
        """Fold another SplitStats' `states()` (a map task's batch) into this one."""
        for split, fields in states.items():
            for name, state in fields.items():
                self._acc.setdefault(split, {}).setdefault(name, StatsAccumulator()).add_state(state)

    def result(self) -> dict[str, dict[str, FieldStats]]:
        """split -> field -> merged statistics (fields without valid steps left out)."""
        out: dict[str, dict[str, FieldStats]] = {}
        for split, fields in self._acc.items():
            for name, acc in fields.items():
                merged = acc.result()
                if merged is not None:
                    out.setdefault(split, {})[name] = merged
        return out


def build_manifest(*, schema: "StoreSchema", job: "JobSpec", resolved: dict[str, Any],
                   records: list[dict[str, Any]], shards: list[dict[str, Any]], source: str,
                   job_id: str, split_stats: SplitStats) -> dict[str, Any]:
    """`records` are the staged episode records with their statistics already folded into
    `split_stats` (SplitStats.fold)."""
    good = [r for r in records if not r["error"]]
    fields = field_schema(schema, job)
    folded = split_stats.result()
    for split in sorted(folded):
        for name, merged in folded[split].items():
            if name in job.build.windows:  # not a `<action>.relative` entry
                fields[name]["shape"][1] = merged.dims
    split_names = sorted({r["split"] for r in good} | {k for k, v in resolved["splits"].items()})
    splits: dict[str, Any] = {}
    stats: dict[str, Any] = {}
    for split in split_names:
        listed = [s for s in shards if s["path"].startswith(f"{split}/")]
        members = [r for r in good if r["split"] == split]
        splits[split] = {"episodes": [r["episode_id"] for r in members],
                         "samples": sum(s["samples"] for s in listed), "bytes": sum(s["bytes"] for s in listed),
                         "shards": listed, **({"layout": job.build.layout} if job.build.layout != "members" else {})}
        stats[split] = {name: folded[split][name].summary() for name in job.build.windows
                        if name in folded.get(split, {})}
        for rel in job.build.relative:  # `stats.relative`: own entries, the same keys + what they are relative to
            if rel.key in folded.get(split, {}):
                stats[split][rel.key] = {**folded[split][rel.key].summary(), "relative_to": rel.relative_to()}
    version = FORMAT_VERSION if job.build.layout == "members" else LAYOUT_VERSION  # older readers refuse npz
    # plan_version: how splits and keys were drawn (shard_plan.PLAN_VERSION; absent before 2), so a later
    # step that must place new episodes as this export placed its own can tell
    return {"format": FORMAT, "format_version": version, "tool_version": __version__, "plan_version": PLAN_VERSION,
            "job_id": job_id, **first_generation(job_id, splits),
            "source": {"fingerprint": source, "episodes": len(records)}, "config": resolved,
            "schema": fields, "splits": splits, "stats": stats,
            "report": export_report(schema.location, records, shards, split_names)}


def first_generation(job_id: str, splits: dict[str, Any]) -> dict[str, Any]:
    """`generation` and `generations` of a full export: generation 1, its job and its shards per split
    (`reader/manifest.py` says what readers and `verify --since` do with them)."""
    return {"generation": 1, "generations": [generation_entry(1, job_id, splits)]}


def generation_entry(generation: int, job_id: str, splits: dict[str, Any]) -> dict[str, Any]:
    """One entry of `generations`: the job that made the generation and, per split, how many shards the
    split has once it is written (shards are only added, so the shards of generations <= g are each
    split's first `shards[split]` of generation g's entry)."""
    return {"generation": generation, "job_id": job_id,
            "shards": {split: len(entry["shards"]) for split, entry in sorted(splits.items())}}


def other_export(where: str, doc: dict[str, Any], hint: str) -> UserError:
    """The error for an OUT that holds a finished export of another job. An export whose manifest has
    no `plan_version`, or an older one, was planned by a robowds that drew splits and keys another way
    (before plan 2: a permutation of all ids): said so, since the user changed neither store nor config."""
    plan = doc.get("plan_version")
    if not isinstance(plan, int) or plan < PLAN_VERSION:
        return UserError(f"{where} holds an export made by an older robowds (plan version {plan or 1}), which drew "
                         f"episodes' splits and sample keys differently from this one (plan version {PLAN_VERSION}: "
                         "each episode's split now depends on its id and the seed alone)", hint=hint)
    return UserError(f"{where} holds a finished export of a different store or config", hint=hint)


def _video_report(records: list[dict[str, Any]], parts: dict[str, Any]) -> dict[str, Any]:
    """Per camera: stored bytes per frame; steps masked because frames are missing inside the video's
    own span (total, fraction, and the first `MISSING_LISTED` episodes with any); the PSNR (dB) of
    stored vs source frames (per episode over the real frames of one window in every chunk of
    `VIDEO_CHUNK_ANCHORS`; min and mean over episodes, and how many frames were measured); and the most
    decoded frames held in memory at once by one episode's decode (the export's memory bound). The
    ratios come from `parts` (`report_state.report_parts`), as an append's do."""
    out: dict[str, Any] = {}
    for r in records:
        for name, v in r["report"].get("video", {}).items():
            acc = out.setdefault(name, {"psnr": [], "fps_mismatch": [], "held": 0, "measured": 0,
                                        "missing_steps": 0, "missing_in": []})
            acc["missing_steps"] += v.get("missing_steps", 0)
            if v.get("missing_steps") and len(acc["missing_in"]) < MISSING_LISTED:
                acc["missing_in"].append({"episode_id": r["episode_id"], "missing_steps": v["missing_steps"],
                                          "fraction": round(v["missing_steps"] / v["span_steps"], 4)})
            acc["held"] = max(acc["held"], v.get("frames_held_max", 0))
            declared, measured = v.get("declared_fps"), v.get("measured_fps")
            if declared and measured and abs(measured - declared) > FPS_TOLERANCE * declared:
                acc["fps_mismatch"].append({"episode_id": r["episode_id"], "declared": declared,
                                            "measured": round(measured, 4)})
            if v["psnr_db"] is not None:
                acc["psnr"].append(v["psnr_db"])
            acc["measured"] += v.get("psnr_frames", 0)
    return {name: {"psnr_db_min": min(acc["psnr"], default=None), "psnr_frames": acc["measured"],
                   "fps_mismatch": acc["fps_mismatch"], "frames_held_max": acc["held"],
                   "missing_frame_steps": acc["missing_steps"], "missing_frame_episodes": acc["missing_in"],
                   **video_ratios(parts["video"][name], acc["missing_steps"])}
            for name, acc in sorted(out.items())}


def split_counts(good: list[dict[str, Any]], split_names: list[str]) -> dict[str, dict[str, int]]:
    """Per split (every requested one, even if it got nothing): exported episodes and emitted windows."""
    out = {name: {"episodes": 0, "windows": 0} for name in split_names}
    for r in good:
        counts = out.setdefault(r["split"], {"episodes": 0, "windows": 0})
        counts["episodes"] += 1
        counts["windows"] += r["report"]["emitted"]
    return dict(sorted(out.items()))


def _float32_report(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per field written as float32 that loses precision: the worst episode's loss and how many lose."""
    found: dict[str, tuple[str, PrecisionLoss]] = {}
    counts: dict[str, int] = {}
    for r in records:
        for name, loss in r["report"].get("float32_loss", {}).items():
            found[name] = worst(found.get(name), (r["episode_id"], PrecisionLoss(**loss)))
            counts[name] = counts.get(name, 0) + 1
    return {name: {"episode_id": ep, **loss.as_dict(), "episodes": counts[name]}
            for name, (ep, loss) in sorted(found.items())}


def export_report(store: "StoreLocation", records: list[dict[str, Any]], shards: list[dict[str, Any]],
                  split_names: list[str]) -> dict[str, Any]:
    """Repairs, rejected episodes, masking, per-split counts and storage amplification: nothing the
    export did is silent. `split_names`: the splits the config and the store ask for.

    `float32_loss` is there only when some field loses precision (exports without keep their bytes)."""
    good = [r for r in records if not r["error"]]
    repairs: dict[str, dict[str, int]] = {}
    parts = report_parts(good)  # the ratios' and sums' parts, saved for an append (report_state.py)
    for r in good:
        rep = r["report"]
        for name, counts in rep["repairs"].items():
            acc = repairs.setdefault(name, {})
            for k, v in counts.items():
                if v:
                    acc[k] = acc.get(k, 0) + v
    source_bytes = store.total_bytes()
    output_bytes = sum(s["bytes"] for s in shards)
    lossy = _float32_report(good)
    missing: dict[str, list[str]] = {}  # field -> episodes that did not record it
    for r in good:
        for name in r["report"].get("missing_streams", []):
            missing.setdefault(name, []).append(r["episode_id"])
    absent = {name: {"episodes": len(eps), "episode_ids": eps[:20]} for name, eps in sorted(missing.items())}
    return {
        **({"float32_loss": lossy} if lossy else {}),  # sorted when written (output/publish.py)
        **({"missing_streams": absent} if absent else {}),  # only when some episode lacks a stream
        "episodes": {"total": len(records), "exported": len(good),
                     "rejected": [{"episode_id": r["episode_id"], **r["error"]} for r in records if r["error"]]},
        "windows": {"candidates": sum(r["report"]["candidates"] for r in good),
                    "emitted": sum(r["report"]["emitted"] for r in good),
                    "dropped_min_valid": sum(r["report"]["dropped_min_valid"] for r in good)},
        "duration_s": duration_s(parts),
        "splits": split_counts(good, split_names),
        "repairs": repairs,
        "masked_fraction": masked_fraction(parts),
        "video": _video_report(good, parts),
        "storage": {"source_bytes": source_bytes, "output_bytes": output_bytes,
                    "amplification": round(output_bytes / source_bytes, 4) if source_bytes else None},
    }


def _empty_split(name: str, rule: Any, exported: int) -> str:
    """The warning for a split the config asked for that got no episode. A fraction is drawn per
    episode (shard_plan.assign_splits), so a small store can leave it empty, which is not an error:
    the fix is to place episodes explicitly or draw again with another seed."""
    head = f"split {name!r} got no episode (of {exported} exported): its shard list is empty; "
    if isinstance(rule, (int, float)) and not isinstance(rule, bool) and rule > 0:
        return (head + f"splits.{name}: {rule:g} is a fraction, which holds on average only (each episode's split "
                f"is drawn from a hash of its id and the seed, so a few episodes can give none); list the "
                f"split's episode ids instead (splits.{name}: [id, ...]) or set another seed (--set seed=1)")
    return head + f"check splits.{name} in the export config"


def report_warnings(report: dict[str, Any], split_rules: dict[str, Any] | None = None) -> list[str]:
    """One line per thing in the export report that changes what training sees without failing.

    `split_rules`: the config's `splits`. An empty split is warned about when the config asked for it,
    except the `rest` split of a store whose `split` column placed episodes in splits the config does
    not name (there an empty `rest`, e.g. the default `train`, is what the column says)."""
    out = []
    exported = report["episodes"]["exported"]
    rules = split_rules or {}
    by_column = any(counts["episodes"] and name not in rules for name, counts in report.get("splits", {}).items())
    for name, counts in report.get("splits", {}).items():
        if not counts["episodes"] and (name not in rules or (rules[name] == "rest" and by_column)):
            continue
        if not counts["episodes"]:
            out.append(_empty_split(name, rules.get(name), exported))
        elif not counts["windows"] and report["windows"]["emitted"]:  # none at all: the summary says so
            out.append(f"split {name!r} got {counts['episodes']} episode(s) but no window; check the window "
                       "config and min_valid_fraction")
    for name, entry in report.get("missing_streams", {}).items():
        shown = ", ".join(repr(e) for e in entry["episode_ids"][:3]) + (", ..." if entry["episodes"] > 3 else "")
        out.append(f"field {name!r} was not recorded in {entry['episodes']} episode(s) ({shown}): their windows "
                   f"carry it as zeros with an all-false mask (report.missing_streams.{name} in the manifest)")
    for name, entry in report.get("float32_loss", {}).items():
        loss = PrecisionLoss(entry["column"], entry["max_error"], entry["spread"])
        lost = loss_text(loss, entry["episode_id"], entry["episodes"])
        out.append(f"field {name!r} is stored as float32: {lost}: {loss_fix(name)} "
                   f"(report.float32_loss.{name} in the manifest)")
    for name, video in report.get("video", {}).items():
        if video.get("missing_frame_steps"):
            episodes = video["missing_frame_episodes"]
            out.append(f"camera {name!r}: {video['missing_frame_steps']} window steps "
                       f"({100 * video['missing_frame_fraction']:.1f}%) inside the video's span have no frame "
                       f"(frames missing from the file; masked), e.g. episode {episodes[0]['episode_id']!r}: "
                       f"see report.video.{name} in the manifest")
    return out
