"""Export configuration: defaults, a YAML file, `--set a.b=c` overrides, validation, resolution.

The resolved config (every default filled in, one entry per exported stream) is what goes into the
manifest, so an export can be reproduced from its manifest alone.
"""

from __future__ import annotations

import copy
import difflib
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from robowds.export.core.windows import SNAP_TOLERANCE_S, StreamWindow, snap_to_step
from robowds.export.errors import UserError, config_error
from robowds.export.job.config_check import OPTIONAL_KEYS, STREAM_KEYS, check
from robowds.export.media.geometry import Crop
from robowds.export.media.images import IMAGE_ENCODINGS, ImageOptions
from robowds.export.media.video_windows import ENCODINGS as VIDEO_ENCODINGS
from robowds.export.media.video_windows import VideoOptions
from robowds.export.store.yamlio import YamlError, load_file, load_text

DEFAULTS: dict[str, Any] = {
    "fps": 10.0,               # the dataset grid: t_k = t0 + k / fps
    "stride": 1,               # an anchor every `stride` grid frames
    "min_valid_fraction": 0.0,  # emit a window only if this fraction of its time-series steps is real
    "window": {                # defaults for every stream, overridden per stream under `streams`
        "duration_s": 1.0,
        "offset_s": 0.0,
        "rate_hz": None,       # None = fps
        "pad": "zero",         # zero | edge
    },
    "streams": {},             # per field: window keys above, interpolation, max_gap_s; video/image keys
    "include": None,           # list of fields to export (None = all)
    "exclude": [],
    "seed": 0,
    "shuffle": True,           # shuffle windows across episodes at export (False keeps episode order)
    "splits": {"train": "rest"},  # name -> fraction | list of episode ids | "rest" (exactly one)
    # a split of at least min_shards windows gets at least min_shards shards (DataLoader workers x ranks
    # of a plain webdataset pipeline each need a shard); 1 = cut by max_samples / max_bytes only
    "shard": {"max_samples": 4096, "max_bytes": 256 * 1024 * 1024, "min_shards": 8},
    "timestamps": "repair",    # repair (sort, de-duplicate, count) | reject (episode error)
    "max_gap_factor": 2.5,     # default max_gap = factor x median sample period of the stream
    "float_dtype": "float32",  # dtype of interpolated (linear/slerp) fields
    "on_bad_episode": "fail",  # fail | skip (skipped episodes are listed in the report)
    "max_episode_s": 86400.0,  # longer episodes are refused: a unit or end_s mistake (export/core/plausible.py)
}

IMAGE_KEYS = {"encoding", "resize", "crop"}  # all an image field's `streams.<name>` entry may set


def load_config(path: Path | None, overrides: Sequence[str | tuple[str, str]] = ()) -> dict[str, Any]:
    """Merge defaults, the YAML file and `key.path=value` overrides; check keys and value types.

    An override is `KEY=VALUE` (a `--set` item), or (`KEY=VALUE`, the flag that stands for it, e.g.
    `--fps 5`): errors name where a value came from as the user wrote it."""
    config = copy.deepcopy(DEFAULTS)
    origins: dict[str, str] = {}  # dotted key -> the file or `--set` item that set it, for the error lines
    if path is not None:
        try:
            user = load_file(Path(path)) or {}
        except OSError as exc:
            raise UserError(f"cannot read config {path}: {exc.strerror or exc}",
                            hint="pass a readable YAML file to --config") from exc
        except YamlError as exc:
            raise UserError(f"cannot read config {path}: {exc.reason}",
                            hint="pass the export config as a YAML text file (see README)") from exc
        if not isinstance(user, dict):
            raise UserError(f"config {path} must be a YAML mapping", hint="e.g. `fps: 10` on its own line")
        if isinstance(user.get("splits"), dict):
            config["splits"] = {}  # a file's splits replace the default {train: rest}; --set merges
        _merge(config, user, str(path), origins)
    for override in overrides:
        item, label = override if isinstance(override, tuple) else (override, f"--set {override}")
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(f"override {item!r} is not KEY=VALUE", hint="e.g. --set streams.joints.rate_hz=50")
        node: dict[str, Any] = {}
        cursor = node
        parts = key.split(".")
        if not all(parts):
            raise UserError(f"override {item!r}: key {key!r} has an empty part",
                            hint="dotted keys like streams.joints.rate_hz")
        for part in parts[:-1]:
            cursor = cursor.setdefault(part, {})
        try:
            cursor[parts[-1]] = load_text(raw, label)
        except YamlError as exc:
            raise UserError(f"{label}: the value is {exc.reason}",
                            hint="quote it or fix the YAML, e.g. --set 'streams.cam.resize=[224, 224]'"
                            ) from exc
        _merge(config, node, label, origins)
    _as_ints(config)
    check(config, lambda key: _origin(origins, key))
    if config["shard"].get("layout") == OPTIONAL_KEYS["shard.layout"]:
        config["shard"].pop("layout")  # the default: the same config (and job id) as leaving it out
    if "stats" in config and not config["stats"].get("relative"):
        config.pop("stats")  # no extra statistics: the config (and job id) it was before `stats` existed
    _as_floats(config)
    return config


def _as_ints(config: dict[str, Any]) -> None:
    """Whole floats as integers for integer settings, so `shard.max_bytes=256e6` (a float in YAML, like
    every exponent number) is accepted, and is the same config as `max_bytes: 256000000`."""
    for node, key in ((config, "stride"), (config, "seed"), (config.get("shard"), "max_samples"),
                      (config.get("shard"), "max_bytes"), (config.get("shard"), "min_shards")):
        value = node.get(key) if isinstance(node, dict) else None
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            node[key] = int(value)


REAL_KEYS = ("fps", "min_valid_fraction", "max_gap_factor", "max_episode_s")  # top level
REAL_STREAM_KEYS = ("rate_hz", "duration_s", "offset_s", "max_gap_s")


def _as_floats(config: dict[str, Any]) -> None:
    """Real-valued settings as floats, so `--fps 5`, `--set fps=5` and `fps: 5.0` are one config (one
    job id: an export re-run with another spelling is up to date, not "a different config")."""
    for key in REAL_KEYS:
        config[key] = float(config[key])
    for stream in (config["window"], *config["streams"].values()):
        for key in REAL_STREAM_KEYS:
            if stream.get(key) is not None:
                stream[key] = float(stream[key])


def _merge(base: dict[str, Any], new: Mapping[str, Any], where: str, origins: dict[str, str],
           path: str = "") -> None:
    """Deep-merge `new` into `base`; keys must exist in the defaults except field and split names.
    Each value set is recorded in `origins` (its dotted key -> `where`), replacing what it overwrites."""
    for key, value in new.items():
        full = f"{path}{key}"
        open_mapping = path.startswith(("streams.", "stats.relative.")) or path == "splits."
        if key not in base and not open_mapping and full not in OPTIONAL_KEYS:
            optional = [k.rpartition(".")[2] for k in OPTIONAL_KEYS if k.rpartition(".")[0] == path[:-1]]
            known = sorted([*base, *optional])
            close = difflib.get_close_matches(str(key), known, n=1)
            raise UserError(f"unknown config key {full!r} in {where}",
                            hint=(f"did you mean {path}{close[0]}? " if close else "")
                            + f"known keys here: {', '.join(known)}")
        if path == "stats.relative." and isinstance(value, dict) and isinstance(base.get(key), str):
            base[key] = {"state": base[key]}  # the short form `actions: joints`, refined by --set ...dims=
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value, where, origins, full + ".")
        else:
            base[key] = value
            for stale in [k for k in origins if k.startswith(full + ".")]:
                del origins[stale]
            origins[full] = where


def _origin(origins: Mapping[str, str], key: str) -> str:
    """Where `key` was set: its own entry or the nearest enclosing one ("" for a default value)."""
    while key:
        if key in origins:
            return origins[key]
        key = key.rpartition(".")[0]
    return ""


VIDEO_KEYS = {"selection", "encoding", "resize", "crop"}  # what only a camera (or, but selection, an image) takes
WINDOW_KEYS = STREAM_KEYS - VIDEO_KEYS - {"dtype"}  # what windows a time series or a camera
SERIES_ONLY_KEYS = {"dtype"}  # what only a time series takes


def check_field_keys(config: Mapping[str, Any], field: str, kind: str) -> None:
    """Refuse `streams.<field>` keys that do nothing for the field's kind (they were ignored silently:
    `encoding: mp4` on a time series, `rate_hz` on a text field). Video fields take every key, image
    fields are checked by `image_options`."""
    own = config["streams"].get(field)
    if own and kind == "video" and "dtype" in own:
        raise UserError(f"config streams.{field} sets dtype, but {field!r} is a video field (frames are uint8)",
                        hint=f"dtype is the output dtype of a time series; remove it from streams.{field}")
    if not own or kind in ("video", "image"):
        return
    allowed = WINDOW_KEYS | SERIES_ONLY_KEYS if kind == "timeseries" else set()
    unused = sorted(set(own) - allowed)
    if unused:
        what = {"timeseries": "a time series", "text": "a text field (one per episode, not windowed)",
                "value": "a per-episode value (not windowed)"}.get(kind, f"a {kind} field")
        raise UserError(f"config streams.{field} sets {unused}, but {field!r} is {what}: they would be ignored",
                        hint=(f"a time series takes only {', '.join(sorted(allowed))}; encoding, resize, crop and "
                              f"selection are for video fields" if allowed else
                              f"remove streams.{field} from the config"))


def shard_layout(config: Mapping[str, Any]) -> str:
    """How a sample's members are laid out in the shards: `members` (one tar member per field, the
    default) or `npz` (every `.npy` member packed into one stored `arrays.npz`)."""
    return str(config["shard"].get("layout", OPTIONAL_KEYS["shard.layout"]))


def _geometry(entry: Mapping[str, Any], where: str) -> tuple[tuple[int, int] | None, Crop]:
    """(resize, crop) of a video or image entry; crop "center" needs a resize to take its aspect from."""
    size, crop = entry.get("resize"), entry.get("crop")
    resize = (int(size[0]), int(size[1])) if size else None
    if crop == "center" and resize is None:
        raise UserError(f'config {where}.crop is "center" but {where}.resize is not set',
                        hint='"center" crops to the aspect ratio of resize: add resize: [width, height], '
                             "or give the crop size in source pixels: crop: [width, height]")
    return resize, (crop if crop in (None, "center") else (int(crop[0]), int(crop[1])))


def video_options(config: Mapping[str, Any], field: str) -> VideoOptions:
    """A video field's frame selection, encoding, crop and resize (defaults: nearest, jpg, source size).

    `window` gives the defaults for every camera, `streams.<field>` overrides them."""
    own = config["streams"].get(field, {})
    merged = {**config["window"], **own}
    where = f"streams.{field}"
    encoding = str(merged.get("encoding", "jpg"))
    if encoding not in VIDEO_ENCODINGS:
        key = f"{where}.encoding" if "encoding" in own else "window.encoding"
        raise UserError(f"config {key} is {encoding!r}, but {field!r} is a video field",
                        hint=f"video encodings: {', '.join(VIDEO_ENCODINGS)}")
    resize, crop = _geometry(merged, where)
    return VideoOptions(selection=str(merged.get("selection", "nearest")), encoding=encoding, resize=resize,
                        pad=str(merged["pad"]), crop=crop)


def image_options(config: Mapping[str, Any], field: str) -> ImageOptions:
    """An image field's encoding, crop and resize, from `streams.<field>` only: images are not
    windowed, so the `window` defaults (meant for streams and cameras) do not apply to them."""
    own = config["streams"].get(field, {})
    where = f"streams.{field}"
    unknown = set(own) - IMAGE_KEYS
    if unknown:
        raise UserError(f"config {where} sets {sorted(unknown)}, but {field!r} is an image (one per episode)",
                        hint=f"an image field takes only {', '.join(sorted(IMAGE_KEYS))}")
    encoding = str(own.get("encoding", "original"))
    if encoding not in IMAGE_ENCODINGS:
        raise UserError(f"config {where}.encoding is {encoding!r}, but {field!r} is an image field",
                        hint=f"image encodings: {', '.join(IMAGE_ENCODINGS)}")
    resize, crop = _geometry(own, where)
    if encoding == "original" and (resize or crop):
        raise UserError(f"config {where} sets resize/crop with encoding original (the stored bytes, unchanged)",
                        hint=f"set {where}.encoding to png (lossless) or jpg")
    return ImageOptions(encoding=encoding, resize=resize, crop=crop)


def stream_dtype(config: Mapping[str, Any], field: str) -> str | None:
    """A time series's `streams.<field>.dtype` override (None: the default rule, `build.output_dtype`)."""
    own = config["streams"].get(field, {})
    return str(own["dtype"]) if own.get("dtype") is not None else None


def check_bool_interpolation(field: str, value_dtype: str | None, window: StreamWindow) -> None:
    """Bool values interpolated linearly would be fractions of true: refused as in the store's schema
    (`open_store`), since the export config can set the interpolation too."""
    if value_dtype in ("bool", "bool_") and window.interpolation in ("linear", "slerp"):
        raise UserError(f"config streams.{field}.interpolation is {window.interpolation}, but {field!r} holds bool "
                        "values: it would export fractions between false and true",
                        hint=f"use hold or nearest for {field!r}")


def stream_window(config: Mapping[str, Any], field: str, interpolation: str,
                  declared_max_gap: float | None) -> StreamWindow:
    """Resolve one field's window from `window` defaults and `streams.<field>`. An offset or duration
    within `SNAP_TOLERANCE_S` of a whole number of steps (1 / rate_hz) is taken as exactly that
    (`snap_notes` says which were)."""
    own = config["streams"].get(field, {})
    merged = {**config["window"], **own}
    duration_key = f"streams.{field}.duration_s" if "duration_s" in own else "window.duration_s"
    rate_key = "fps" if merged["rate_hz"] is None else (
        f"streams.{field}.rate_hz" if "rate_hz" in own else "window.rate_hz")
    rate = float(merged["rate_hz"] if merged["rate_hz"] is not None else config["fps"])
    duration = float(merged["duration_s"])
    if rate <= 0:  # load_config refuses both first; a config built otherwise (a manifest's) is checked here
        raise config_error(rate_key, rate, "a positive number", "10", note=f"Hz of field {field!r}")
    if duration <= 0:
        raise config_error(duration_key, duration, "a positive number", "1.0", note=f"seconds of field {field!r}")
    snapped = snap_to_step(duration, rate)  # 0.5333 s at 30 Hz: 16 steps (LeRobot's 16 deltas)
    duration = snapped if snapped > 0 else duration
    steps_f = duration * rate
    steps = int(round(steps_f))
    if steps < 1 or abs(steps_f - steps) > 1e-6:
        fixed = round(max(steps, 1) / rate, 9)
        raise UserError(f"config {duration_key} is {duration:g} s, which at {rate_key} {rate:g} Hz is {steps_f:g} "
                        f"steps of field {field!r}: not a whole number of steps",
                        hint=f"give {duration_key} a multiple of 1/{rate:g} s (within {SNAP_TOLERANCE_S:g} s of one is taken "
                             f"as that multiple), e.g. --set {duration_key}={fixed!r}")
    max_gap = merged.get("max_gap_s", declared_max_gap)
    return StreamWindow(rate_hz=rate, duration_s=duration, offset_s=snap_to_step(float(merged["offset_s"]), rate),
                        pad=str(merged["pad"]), steps=steps,
                        max_gap_s=None if max_gap is None else float(max_gap),
                        interpolation=str(merged.get("interpolation") or interpolation))


def snap_notes(config: Mapping[str, Any], resolved: Mapping[str, Any]) -> list[str]:
    """One line per offset_s / duration_s that `stream_window` snapped to a whole number of steps, so
    the export says what it used (the resolved config in the manifest holds the snapped value only).
    Changes under 1 ns are not named: the resampler already takes such times as equal."""
    notes = []
    for name, window in {**resolved["streams"], **resolved.get("videos", {})}.items():
        own = config["streams"].get(name, {})
        for key in ("offset_s", "duration_s"):
            given = float(own.get(key, config["window"][key]))
            used = float(window[key])
            if abs(given - used) > 1e-9:
                where = f"streams.{name}.{key}" if key in own else f"window.{key} (for {name})"
                notes.append(f"{where} {given:g} s taken as {round(used * window['rate_hz'])} x 1/{window['rate_hz']:g} "
                             f"s = {used!r} s (within {SNAP_TOLERANCE_S:g} s of a whole step)")
    return notes
