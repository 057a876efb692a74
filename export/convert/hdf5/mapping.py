"""The generic HDF5 mode: a small YAML mapping says which datasets are which fields, for any layout.

```yaml
episodes: episodes/*        # the groups that are one episode each (a glob per path level); "/" = the file
time: timestamps            # a [T] dataset in each episode group ...
time_unit: s                # ... in s | ms | us | ns
# rate_hz: 30               # ... or a fixed rate (then --fps may override it)
files: "*.h5"               # SRC a folder: which files (default: *.h5 and *.hdf5)
fields:
  state: joints/position                 # field: dataset path inside the episode group
  action: {path: joints/command, names: [j0, j1]}
  cam_high: camera/front                 # uint8 [T, H, W, 3] or JPEG bytes -> video
  wrist: {path: camera/wrist_jpeg, kind: video}   # uint8 [T, L]: padded JPEG rows (else a time series)
  task: {attr: instruction}              # a string attribute of the episode group -> text
```

Parsed here without touching a file: every mistake (an unknown key, a field name the store refuses, a
rate and a time dataset both or neither) is a ValueError with the key named; `plan` adds the file.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Iterable

from robowds.export.convert.episode_store import field_name
from robowds.export.convert.hdf5.layout import natural_key

TIME_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}  # unit -> ticks per second
INTERPOLATIONS = ("linear", "slerp", "hold", "nearest")
TOP_KEYS = {"episodes", "time", "time_unit", "rate_hz", "files", "fields"}
FIELD_KEYS = {"path", "attr", "kind", "names", "interpolation", "quaternion_order", "units", "time"}
DEFAULT_FILES = ("*.h5", "*.hdf5")


@dataclass(frozen=True)
class MappedField:
    """One `fields:` entry: a dataset (`path`, relative to the episode group) or an attribute (`attr`)."""

    name: str
    path: str | None = None
    attr: str | None = None
    names: tuple[str, ...] | None = None
    declare: tuple[tuple[str, Any], ...] = ()  # interpolation, quaternion_order, units (store.yaml keys)
    time: str | None = None  # this field's own [T] time dataset (default: the mapping's)
    video: bool = False  # `kind: video`: a uint8 [T, L] dataset is padded JPEG rows, not a time series


@dataclass(frozen=True)
class HDF5Mapping:
    episodes: str  # group glob, "" = the file root
    fields: tuple[MappedField, ...]
    rate_hz: float | None = None
    time: str | None = None
    time_unit: str = "s"
    files: tuple[str, ...] = DEFAULT_FILES


def _path(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.strip("/"):
        raise ValueError(f"{key} must be a dataset path such as obs/joints, got {value!r}")
    return value.strip("/")


def _field(name: Any, spec: Any) -> MappedField:
    if not isinstance(name, str) or field_name(name) != name:
        suggestion = field_name(str(name))
        raise ValueError(f"field name {name!r} is not a store field name ([a-z][a-z0-9_]*, at most 32 "
                         f"characters, not ending in _mask): write {suggestion!r}")
    if isinstance(spec, str):
        return MappedField(name, path=_path(spec, f"fields.{name}"))
    if not isinstance(spec, dict):
        raise ValueError(f"fields.{name} must be a dataset path or a mapping with path or attr, got {spec!r}")
    unknown = sorted(set(spec) - FIELD_KEYS)
    if unknown:
        raise ValueError(f"fields.{name}: unknown key(s) {unknown}; known: {sorted(FIELD_KEYS)}")
    if ("path" in spec) == ("attr" in spec):
        raise ValueError(f"fields.{name} needs exactly one of path (a dataset) or attr (a group attribute)")
    names = spec.get("names")
    if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
        raise ValueError(f"fields.{name}.names must be a list of strings")
    interpolation = spec.get("interpolation")
    if interpolation is not None and interpolation not in INTERPOLATIONS:
        raise ValueError(f"fields.{name}.interpolation {interpolation!r}: choose one of {list(INTERPOLATIONS)}")
    if spec.get("kind", "video") != "video":
        raise ValueError(f"fields.{name}.kind {spec['kind']!r}: only video can be forced (time series and text "
                         "are told from the dataset and from attr)")
    if "attr" in spec and set(spec) - {"attr"}:
        raise ValueError(f"fields.{name}: an attr field (text) takes no other key")
    declare = tuple((k, spec[k]) for k in ("interpolation", "quaternion_order", "units") if k in spec)
    return MappedField(name, path=_path(spec["path"], f"fields.{name}.path") if "path" in spec else None,
                       attr=str(spec["attr"]) if "attr" in spec else None,
                       names=tuple(names) if names is not None else None, declare=declare,
                       time=_path(spec["time"], f"fields.{name}.time") if "time" in spec else None,
                       video=spec.get("kind") == "video")


def parse_mapping(data: Any) -> HDF5Mapping:
    """A loaded YAML mapping -> HDF5Mapping; ValueError naming the key for anything wrong."""
    if not isinstance(data, dict):
        raise ValueError("the mapping must be a YAML mapping with episodes and fields")
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}; known: {sorted(TOP_KEYS)}")
    episodes = data.get("episodes", "/")
    if not isinstance(episodes, str):
        raise ValueError(f"episodes must be a group glob such as data/demo_* (or / for the whole file), got {episodes!r}")
    fields = data.get("fields")
    if not isinstance(fields, dict) or not fields:
        raise ValueError("fields must map store field names to dataset paths (at least one)")
    parsed = tuple(_field(name, spec) for name, spec in fields.items())
    if all(f.attr is not None for f in parsed):
        raise ValueError("fields name no dataset (only attributes): nothing to make a time series or video of")
    rate = data.get("rate_hz")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0):
        raise ValueError(f"rate_hz must be a positive number, got {rate!r}")
    unit = data.get("time_unit", "s")
    if unit not in TIME_UNITS:
        raise ValueError(f"time_unit {unit!r}: choose one of {list(TIME_UNITS)}")
    if rate is not None and data.get("time") is not None:
        raise ValueError("give rate_hz or time, not both")
    files = data.get("files", list(DEFAULT_FILES))
    files = [files] if isinstance(files, str) else files
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise ValueError(f"files must be a glob or a list of globs, got {files!r}")
    return HDF5Mapping(episodes.strip("/"), parsed, float(rate) if rate is not None else None,
                       _path(data["time"], "time") if data.get("time") is not None else None, unit, tuple(files))


def match_groups(pattern: str, groups: Iterable[str]) -> list[str]:
    """The groups whose path matches `pattern` level by level (`*` never crosses `/`), in natural order;
    "" matches the root only."""
    if not pattern:
        return [""] if "" in set(groups) else []
    levels = pattern.split("/")
    found = [g for g in groups if g and len(g.split("/")) == len(levels)
             and all(fnmatch.fnmatchcase(part, lvl) for part, lvl in zip(g.split("/"), levels))]
    return sorted(found, key=natural_key)
