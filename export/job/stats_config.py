"""The export config's `stats` section: extra statistics entries (today: relative actions).

```yaml
stats:
  relative:
    actions: joints                                   # every dimension, both fields as wide
    # or: actions: {state: joints, dims: [0, 1, 2], state_dims: [0, 1, 2]}
```

Checked in two steps like the rest of the config: the shape of the values when the config is
loaded (`check_stats`, before the store is opened), then against the store's schema and the
resolved windows (`resolve_relative`): the fields exist, are exported float time series, the
dimensions are in range, and the state window holds the anchor time. The section is optional: a
config without it (or with it empty) resolves to the config it was before the section existed,
so its manifest and job id are unchanged.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any, Callable

from robowds.export.core.relative import RelativeSpec, anchor_step
from robowds.export.errors import UserError, config_error
from robowds.reader.transforms.relative import RELATIVE_SUFFIX  # the entry's name, as the reader looks it up

if TYPE_CHECKING:
    from robowds.export.job.build import BuildSpec
    from robowds.export.store.schema import StoreSchema

STATS_KEYS = ("relative",)
RELATIVE_KEYS = ("state", "dims", "state_dims")
EXAMPLE = "{state: joints, dims: [0, 1, 2]}"


def check_stats(stats: Any, origin: Callable[[str], str]) -> None:
    """The shape of `stats` (types, known keys, dimension lists); the schema is checked later."""
    if not isinstance(stats, dict):
        raise config_error("stats", stats, "a mapping of statistics options", "{relative: {actions: joints}}",
                           origin("stats"))
    _known(stats, STATS_KEYS, "stats", origin)
    relative = stats.get("relative", {})
    if not isinstance(relative, dict):
        raise config_error("stats.relative", relative, "a mapping of action field -> state field",
                           "{actions: joints}", origin("stats.relative"))
    for action, entry in relative.items():
        key = f"stats.relative.{action}"
        if isinstance(entry, str):
            continue
        if not isinstance(entry, dict):
            raise config_error(key, entry, "the state field's name, or a mapping {state, dims, state_dims}",
                               EXAMPLE, origin(key))
        _known(entry, RELATIVE_KEYS, key, origin)
        if not isinstance(entry.get("state"), str):
            raise config_error(f"{key}.state", entry.get("state"), "the name of the state field", "joints",
                               origin(f"{key}.state"))
        for name in ("dims", "state_dims"):
            _check_dims(f"{key}.{name}", entry.get(name), origin)
        dims, state_dims = entry.get("dims"), entry.get("state_dims")
        if dims is not None and state_dims is not None and len(dims) != len(state_dims):
            raise config_error(f"{key}.state_dims", state_dims, f"a list as long as dims ({len(dims)} entries)",
                               f"{list(range(len(dims)))}", origin(f"{key}.state_dims"),
                               note="the state dimension each action dimension is taken against")


def _known(entry: dict, known: tuple[str, ...], where: str, origin: Callable[[str], str]) -> None:
    unknown = sorted(map(str, set(entry) - set(known)))
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        source = origin(f"{where}.{unknown[0]}")
        raise UserError(f"unknown config key {where + '.' + unknown[0]!r}" + (f" in {source}" if source else ""),
                        hint=(f"did you mean {where}.{close[0]}? " if close else "")
                        + f"known keys here: {', '.join(known)}")


def _check_dims(key: str, dims: Any, origin: Callable[[str], str]) -> None:
    """null (every dimension) or a list of distinct integers >= 0."""
    if dims is None:
        return
    ints = isinstance(dims, list) and dims and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                   for d in dims)
    if not ints:
        raise config_error(key, dims, "a non-empty list of dimension indices (integers >= 0), or null for every "
                           "dimension", "[0, 1, 2]", origin(key))
    repeated = sorted({d for d in dims if dims.count(d) > 1})
    if repeated:
        raise config_error(key, dims, "a list of distinct dimension indices", "[0, 1, 2]", origin(key),
                           note=f"{repeated} appear more than once")


def resolve_relative(config: dict[str, Any], schema: "StoreSchema", build: "BuildSpec") -> tuple[RelativeSpec, ...]:
    """Each `stats.relative` entry against the store and the resolved windows; O(entries)."""
    from robowds.export.job.build import output_dtype

    specs = []
    for action, entry in sorted(config.get("stats", {}).get("relative", {}).items()):
        key = f"stats.relative.{action}"
        short = isinstance(entry, str)  # `actions: joints`
        entry = {"state": entry} if short else entry
        state = entry["state"]
        for name, where in ((action, key), (state, key if short else f"{key}.state")):
            problem = _field_problem(schema, build, name, output_dtype)
            if problem:
                series = sorted(n for n in build.windows)
                raise UserError(f"config {where}: field {name!r} {problem}",
                                hint=f"name an exported float time series; this export's: {', '.join(series)}")
        width, state_width = build.widths[action], build.widths[state]
        dims = list(entry["dims"]) if entry.get("dims") is not None else None
        state_dims = list(entry["state_dims"]) if entry.get("state_dims") is not None else None
        if dims is None and state_dims is None and width != state_width:
            raise UserError(f"config {key}: {action!r} has {width} dimensions but {state!r} has {state_width}, "
                            "so the dimensions cannot be paired one to one",
                            hint=f"name the dimensions that correspond, e.g. {key}: {{state: {state}, dims: "
                                 f"{list(range(min(width, state_width)))}}}")
        dims = dims if dims is not None else list(range(width))
        state_dims = state_dims if state_dims is not None else list(dims)
        if len(dims) != len(state_dims):
            raise config_error(f"{key}.state_dims", state_dims, f"a list as long as dims ({len(dims)} entries)",
                               f"{dims}", note="the state dimension each action dimension is taken against")
        for name, field, listed, n in (("dims", action, dims, width), ("state_dims", state, state_dims, state_width)):
            if max(listed) >= n:
                raise config_error(f"{key}.{name}", listed, f"indices below {n} ({field!r} has {n} dimensions)",
                                   f"{[d for d in listed if d < n] or [0]}")
        anchor = anchor_step(build.windows[state])
        if anchor is None:
            w = build.windows[state]
            raise UserError(f"config {key}: the window of {state!r} (offset_s {w.offset_s:g} s, {w.steps} steps at "
                            f"{w.rate_hz:g} Hz) has no step at the anchor time, which the relative action is "
                            "taken against",
                            hint=f"give streams.{state}.offset_s a whole number of steps in "
                                 f"(-duration_s, 0], e.g. --set streams.{state}.offset_s=0")
        specs.append(RelativeSpec(action=action, state=state, dims=tuple(dims), state_dims=tuple(state_dims),
                                  anchor=anchor, key=action + RELATIVE_SUFFIX))
    return tuple(specs)


def _field_problem(schema: "StoreSchema", build: "BuildSpec", name: str, output_dtype: Callable) -> str:
    """Why `name` cannot take part in a relative action ("" when it can)."""
    if name not in schema.fields:
        return "is not in the store"
    kind = schema.fields[name].kind
    if kind != "timeseries":
        return f"is a {kind} field, not a time series"
    if name not in build.windows:
        return "is not exported (see include / exclude)"
    if output_dtype(build, name).kind != "f":
        return f"is written as {output_dtype(build, name).name}: relative actions need float values"
    return ""


def resolved_stats(specs: tuple[RelativeSpec, ...]) -> dict[str, Any]:
    """The section as the manifest's resolved config records it: every entry in its long form, so
    `actions: joints` and the same dimensions written out are one config (one job id)."""
    return {"relative": {s.action: {"state": s.state, "dims": list(s.dims), "state_dims": list(s.state_dims)}
                         for s in specs}}
