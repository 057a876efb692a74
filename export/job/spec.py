"""What one export job is: the store's schema and the config resolved against it (fields, windows,
video and image options, splits, key prefixes). Computed once in the parent; each map task gets the
part for its batch of episodes (`for_episodes`), so what is pickled per task does not grow with the
store.

`resolve` reads only the store's schema and its optional split table, so the map and reduce steps,
the manifest assembly and `verify`'s recompute all start from the same JobSpec.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from robowds.export.core.shard_plan import assign_splits, key_prefixes
from robowds.export.errors import UserError
from robowds.export.job.build import BuildSpec
from robowds.export.job.stats_config import resolve_relative, resolved_stats
from robowds.export.job.config import (check_bool_interpolation, check_field_keys, image_options, shard_layout,
                                       stream_dtype, stream_window, video_options)
from robowds.export.store.episodes import series_widths
from robowds.export.store.inference import invalid_utf8_row
from robowds.export.store.location import StoreLocation
from robowds.export.store.schema import StoreSchema, open_store


@dataclass(frozen=True)
class JobSpec:
    """Everything a map task needs; picklable and identical for every worker."""

    schema: StoreSchema
    build: BuildSpec
    fields: tuple[str, ...]
    work: str
    prefixes: dict[str, str]
    splits: dict[str, str]
    index: dict[str, int]
    source: str = ""  # the store's fingerprint (a hash of its tables' bytes): keys the tasks' row-group memo
    # episode index -> packed bits of its windows an earlier run of the job released (staging_release.py):
    # only on a resume after the reduce began, O(windows) bits then
    released: dict[int, bytes] = field(default_factory=dict)

    def for_episodes(self, episode_ids: list[str]) -> "JobSpec":
        """The spec a map task needs for these episodes: the per-episode maps (row locations, index,
        key prefix, split) cut to them. The whole spec holds ~100 bytes per episode, so pickling it
        with every task cost O(store) per task and O(store^2 / batch) in all (10 MB a task at 100k
        episodes); this is O(batch)."""
        schema = replace(self.schema, episode_ids=list(episode_ids), problems=[],
                         rows={t: {e: r[e] for e in episode_ids if e in r} for t, r in self.schema.rows.items()})
        return replace(self, schema=schema, index={e: self.index[e] for e in episode_ids},
                       prefixes={e: self.prefixes[e] for e in episode_ids},
                       splits={e: self.splits[e] for e in episode_ids},
                       released={self.index[e]: self.released[self.index[e]] for e in episode_ids
                                 if self.index[e] in self.released})

    @property
    def load_fields(self) -> list[str]:
        """Fields to read per episode: the exported ones plus the clock, which defines the extent."""
        clock = self.build.clock
        return [*self.fields, clock] if clock is not None and clock not in self.fields else list(self.fields)


def resolve(store: Path | StoreLocation, config: dict[str, Any]) -> tuple[JobSpec, dict[str, Any]]:
    """Open the store and resolve the config against it (the plan's pure part)."""
    schema = open_store(store)
    schema.raise_if_errors()
    include = config["include"]
    for key, named in (("include", include or []), ("exclude", config["exclude"]), ("streams", config["streams"])):
        unknown = sorted(set(named) - set(schema.fields))
        if unknown:
            raise UserError(f"config {key} names field(s) the store does not have: {unknown}",
                            hint=f"this store's fields: {', '.join(sorted(schema.fields))}")
    fields = [f for f in sorted(schema.fields) if (include is None or f in include) and f not in config["exclude"]]
    windows, videos, images, dtypes = {}, {}, {}, {}
    for name in fields:
        spec = schema.fields[name]
        check_field_keys(config, name, spec.kind)
        if spec.kind == "timeseries":
            windows[name] = stream_window(config, name, spec.interpolation or "linear", spec.max_gap_s)
            check_bool_interpolation(name, spec.value_dtype, windows[name])
            override = stream_dtype(config, name)
            if override is not None:
                dtypes[name] = override
        elif spec.kind == "video":
            videos[name] = (stream_window(config, name, "nearest", None), video_options(config, name))
        elif spec.kind == "image":
            images[name] = image_options(config, name)
    if not windows and not fields:
        raise UserError(f"config include/exclude select no field to export (include {include}, exclude "
                        f"{config['exclude']})", hint="select at least one field; every field: --set include=null --set 'exclude=[]'")
    resolved = dict(config)
    # an output dtype override is recorded only where set: exports without one keep their manifest bytes
    resolved["streams"] = {n: {**w.__dict__, **({"dtype": dtypes[n]} if n in dtypes else {})}
                           for n, w in windows.items()}
    resolved["videos"] = {n: {**w.__dict__, **o.__dict__} for n, (w, o) in videos.items()}
    resolved["images"] = {n: o.__dict__ for n, o in images.items()}
    build = BuildSpec(fps=float(config["fps"]), stride=int(config["stride"]),
                      min_valid_fraction=float(config["min_valid_fraction"]), float_dtype=config["float_dtype"],
                      strict_timestamps=config["timestamps"] == "reject", max_gap_factor=float(config["max_gap_factor"]),
                      windows=windows, value_dtypes={n: schema.fields[n].value_dtype or "float64" for n in windows},
                      dtypes=dtypes, widths=series_widths(schema, sorted(windows)),
                      static_fields=tuple(f for f in fields if f not in windows and f not in videos),
                      videos=videos, images=images,
                      clock=schema.clock, max_episode_s=float(config["max_episode_s"]), layout=shard_layout(config),
                      clock_interpolation=schema.fields[schema.clock].interpolation or "linear" if schema.clock else "linear")
    relative = resolve_relative(config, schema, build)
    if relative:  # recorded only where set: exports without it keep their manifest bytes and job id
        build = replace(build, relative=relative)
        resolved["stats"] = resolved_stats(relative)
    declared = _declared_splits(schema)
    splits = assign_splits(schema.episode_ids, config["splits"], int(config["seed"]), declared)
    job = JobSpec(schema=schema, build=build, fields=tuple(fields), work="", prefixes=key_prefixes(schema.episode_ids),
                  splits=splits, index={ep: i for i, ep in enumerate(schema.episode_ids)})
    return job, resolved


def _declared_splits(schema: StoreSchema) -> dict[str, str]:
    table = schema.reserved.get("split")
    if table is None:
        return {}
    data = schema.location.parquet(table).read(columns=["episode_id", "split"])
    try:
        cols = data.to_pydict()
    except UnicodeDecodeError as exc:  # open_store checked the ids, so it is the split column
        row = invalid_utf8_row(data.column("split"))
        raise UserError(f"table {table}: split of row {row} is not valid UTF-8 text",
                        hint="write the split column as UTF-8 strings") from exc
    return {str(e): str(s) for e, s in zip(cols["episode_id"], cols["split"]) if s is not None}
