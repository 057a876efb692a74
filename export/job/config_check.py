"""Validation of a merged export config: the type and range of every key, before any work.

Every rule is a row of a table (the key, what it takes, and a valid example value), and every refusal
is `config_error`, so each bad value gets one error line (the key, the value, where it was set) and
one fix line (what the key takes, and a `--set` item or config-file line that works). A key added to
the config's DEFAULTS without a row here fails every export (a KeyError: a bug, found by any test);
docs/export-config.md lists the same keys.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, replace
from typing import Any, Callable

from robowds.export.core import shard_plan
from robowds.export.core.resample import METHODS
from robowds.export.errors import UserError, config_error
from robowds.export.job.stats_config import check_stats
from robowds.export.media.images import IMAGE_ENCODINGS
from robowds.export.media.video_windows import ENCODINGS as VIDEO_ENCODINGS
from robowds.reader.npz import LAYOUTS

# keys that may be set but are not in DEFAULTS, with their default: an export that leaves one at its default
# resolves to the config it had before the key existed (same manifest bytes, same job id)
OPTIONAL_KEYS: dict[str, Any] = {"shard.layout": "members",  # members | npz: reader/npz.py, docs/export-config.md
                                 "stats": {}, "stats.relative": {}}  # extra statistics: job/stats_config.py
PADS = ("zero", "edge")
SELECTIONS = ("nearest", "causal")
FLOAT_DTYPES = ("float32", "float64")  # float_dtype and streams.<field>.dtype (a time series's output dtype)
STREAM_KEYS = {"rate_hz", "duration_s", "offset_s", "pad", "max_gap_s", "interpolation", "dtype",
               "selection", "encoding", "resize", "crop"}  # the last four: video (and image) fields only

Origin = Callable[[str], str]  # dotted key -> where it was set ("--set fps=-10", a file path, "" = default)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive(value: Any) -> bool:
    return _is_number(value) and value > 0


def _int_at_least(low: int) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= low


def _is_size(value: Any) -> bool:
    """[width, height], two positive integers (YAML lists; tuples from a manifest's resolved config)."""
    return (isinstance(value, (list, tuple)) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value))


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _one_of(choices: tuple[str, ...] | list[str]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, str) and value in choices


def _choices(choices: tuple[str, ...] | list[str]) -> str:
    return f"one of {', '.join(choices)}"


@dataclass(frozen=True)
class Rule:
    """What one key takes: `ok(value)`, the words for it ("must be ..."), and a valid example (YAML)."""

    ok: Callable[[Any], bool]
    expected: str
    example: str
    note: str = ""  # what the value means, for the fix line
    nullable: bool = False  # null is valid too (it means "the default": rate_hz null = fps)

    def check(self, key: str, value: Any, origin: Origin) -> None:
        if not (self.ok(value) or (self.nullable and value is None)):
            raise config_error(key, value, self.expected, self.example, origin(key), self.note)


MAPPING_RULES = {  # the sections; a bad one (`shard=5`) is refused before its keys are read
    "window": Rule(lambda v: isinstance(v, dict), "a mapping of window keys", "{duration_s: 2.0, pad: edge}"),
    "streams": Rule(lambda v: isinstance(v, dict), "a mapping of field name -> window keys",
                    "{joints: {rate_hz: 50}}"),
    "splits": Rule(lambda v: isinstance(v, dict), "a mapping of split name -> fraction, episode ids or rest",
                   "{train: rest, val: 0.1}"),
    "shard": Rule(lambda v: isinstance(v, dict), "a mapping of shard keys", "{max_samples: 1000}"),
}
STREAM_MAPPING_RULE = Rule(lambda v: isinstance(v, dict), "a mapping of window keys", "{rate_hz: 50}")
TOP_RULES = {
    "fps": Rule(_positive, "a positive number", "10", "grid frames per second"),
    "stride": Rule(_int_at_least(1), "an integer >= 1", "2", "an anchor every N grid frames"),
    "seed": Rule(_int_at_least(0), "an integer >= 0", "0"),
    "min_valid_fraction": Rule(lambda v: _is_number(v) and 0.0 <= v <= 1.0,
                               "a number in [0, 1]", "0.5",
                               "the fraction of real steps a window needs"),
    "max_gap_factor": Rule(_positive, "a positive number", "2.5", "x the stream's median sample period"),
    "max_episode_s": Rule(_positive, "a positive number of seconds", "86400", "longer episodes are errors"),
    "shuffle": Rule(lambda v: isinstance(v, bool), "true or false", "false"),
    "include": Rule(_names, "a list of field names, or null for every field", "[joints, imu]", nullable=True),
    "exclude": Rule(_names, "a list of field names", "[imu]"),
    "timestamps": Rule(_one_of(("repair", "reject")), _choices(("repair", "reject")), "reject"),
    "float_dtype": Rule(_one_of(FLOAT_DTYPES), _choices(FLOAT_DTYPES), "float64"),
    "on_bad_episode": Rule(_one_of(("fail", "skip")), _choices(("fail", "skip")), "skip"),
}
STREAM_RULES = {  # under `window` and each `streams.<field>`
    "rate_hz": Rule(_positive, "a positive number", "50", "Hz; null: fps", nullable=True),
    "duration_s": Rule(_positive, "a positive number", "1.0", "seconds"),
    "offset_s": Rule(_is_number, "a number", "-0.5", "seconds from the anchor; negative: history"),
    "max_gap_s": Rule(_positive, "a positive number", "0.5", "seconds; null: the default", nullable=True),
    "pad": Rule(_one_of(PADS), "zero or edge", "edge"),
    "interpolation": Rule(_one_of(METHODS), _choices(METHODS), "hold", "null: the field's own",
                          nullable=True),
    "dtype": Rule(_one_of(FLOAT_DTYPES), _choices(FLOAT_DTYPES), "float64"),
    "selection": Rule(_one_of(SELECTIONS), "nearest or causal", "causal"),
    "encoding": Rule(_one_of([*VIDEO_ENCODINGS, *IMAGE_ENCODINGS]),
                     f"{_choices(VIDEO_ENCODINGS)} (video) or {', '.join(IMAGE_ENCODINGS)} (image)", "jpg"),
    "resize": Rule(_is_size, "[width, height] in pixels", "[224, 224]", "positive integers; null: source size",
                   nullable=True),
    "crop": Rule(lambda v: v == "center" or _is_size(v),
                 'null, "center" (with resize) or [width, height] in source pixels', "center", nullable=True),
}
SHARD_RULES = {
    "max_samples": Rule(_int_at_least(1), "an integer >= 1", "4096", "windows per shard"),
    "max_bytes": Rule(_int_at_least(4096), "an integer >= 4096", "256e6", "bytes per shard"),
    "min_shards": Rule(_int_at_least(1), "an integer >= 1", "8", "1: cut by the size limits only"),
    "layout": Rule(_one_of(LAYOUTS), _choices(LAYOUTS), "npz"),
}
SPLIT_RULE = Rule(lambda v: v == "rest" or (_is_number(v) and 0.0 <= v <= 1.0) or (
    isinstance(v, list) and all(isinstance(e, (str, int)) and not isinstance(e, bool) for e in v)),
    shard_plan.SPLIT_RULE, "0.1",
    "the remaining episodes go to the split set to rest")


def check(config: dict[str, Any], origin: Origin) -> None:
    """Type and range of every value, so a typo fails here and not deep inside the job. O(keys)."""
    for key, rule in MAPPING_RULES.items():  # first: the loops below read them
        rule.check(key, config[key], origin)
    for key, value in config.items():  # a key of DEFAULTS without a rule is a KeyError: every export fails
        if key == "stats":  # optional (OPTIONAL_KEYS): its own checks
            check_stats(value, origin)
            continue
        (MAPPING_RULES.get(key) or TOP_RULES[key]).check(key, value, origin)
    for name, stream in {"window": config["window"], **config["streams"]}.items():
        where = "window" if name == "window" else f"streams.{name}"
        if name != "window":
            STREAM_MAPPING_RULE.check(where, stream, origin)
        unknown = set(stream) - STREAM_KEYS
        if unknown:
            close = difflib.get_close_matches(str(min(map(str, unknown))), STREAM_KEYS, n=1)
            raise UserError(f"unknown key(s) {sorted(unknown, key=str)} in config {where}" + _from(origin(where)),
                            hint=(f"did you mean {where}.{close[0]}? " if close else "")
                            + f"known: {', '.join(sorted(STREAM_KEYS))}")
        for key, value in stream.items():
            STREAM_RULES[key].check(f"{where}.{key}", value, origin)
    for key, value in config["shard"].items():  # every key is there (DEFAULTS), but the optional layout
        SHARD_RULES[key].check(f"shard.{key}", value, origin)
    _check_splits(config["splits"], origin)


def _check_splits(splits: dict[str, Any], origin: Origin) -> None:
    """Each split's rule, then the rules together: fractions within the episodes, one `rest`."""
    rest = [name for name, rule in splits.items() if rule == "rest"]
    for name, rule in splits.items():
        # the example that works here: rest where no other split is (`{train: 2.0}`), else a fraction
        example = "0.1" if [n for n in rest if n != name] else "rest"
        replace(SPLIT_RULE, example=example).check(f"splits.{name}", rule, origin)
    fractions = [rule for rule in splits.values() if _is_number(rule)]
    if sum(fractions) > 1.0 + 1e-9:
        raise config_error("splits", splits, "fractions that add up to at most 1", "{train: rest, val: 0.1, test: 0.1}",
                           origin("splits"), note=f"these add up to {sum(fractions):g}")
    if len(rest) != 1:
        raise config_error("splits", splits, "a mapping that names exactly one split as 'rest' (it gets the "
                           "remaining episodes)", "{train: rest, val: 0.1}", origin("splits"))


def _from(origin: str) -> str:
    return f" (from {origin})" if origin else ""
