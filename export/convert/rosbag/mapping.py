"""ROS topics -> store fields: the pure part of the rosbag converter (no bag is opened here).

A topic becomes one or more fields. Each field is a list of message field paths (`pose.pose.position.x`,
`orientation`, `position[2]`) resolved against the message type's definition (rosbags' `fielddefs`,
the same for ROS 1 and ROS 2 bags): a path that names a sub-message expands to its numeric fields, a
fixed array to its elements, a sequence (JointState's `position`) to as many columns as the first
message holds. The resolution gives each column its dtype from the definition (`int8`, `uint16`,
`float64`...), so values are stored exactly as the bag holds them.

Defaults per message type (`DEFAULTS`) name their fields `<prefix>_<suffix>`; the prefix comes from
the topic name (`topic_prefixes`), or from the mapping's `name`. A mapping (YAML, `parse_mapping`)
picks topics, names and fields. Episode splitting (`gap_segments`, `marker_segments`) works on integer
nanoseconds, so a cut is exact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from robowds.export.convert.episode_store import field_name, unique_names
from robowds.export.errors import UserError

BASE, NAME, ARRAY, SEQUENCE = 1, 2, 3, 4  # rosbags' Nodetype values
NUMERIC = {"bool": "bool", "byte": "uint8", "char": "uint8", "octet": "uint8", "int8": "int8", "uint8": "uint8",
           "int16": "int16", "uint16": "uint16", "int32": "int32", "uint32": "uint32", "int64": "int64",
           "uint64": "uint64", "float32": "float32", "float64": "float64"}
IMAGE_TYPES = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")
RESERVED = {"episode_id", "split", "start_s", "end_s", "meta"}  # store columns that are not fields
INTERPOLATIONS = ("linear", "slerp", "hold", "nearest")
FIELD_KEYS = {"paths", "names", "dtype", "interpolation", "quaternion_order", "units", "max_gap_s"}
TOPIC_KEYS = {"name", "time", "fields"}
TIME_MODES = ("header", "receive")
PATH_RE = re.compile(r"^[A-Za-z_]\w*(\[\d+\])?(\.[A-Za-z_]\w*(\[\d+\])?)*$")
GENERIC_PARTS = {"data", "raw", "compressed", "image", "image_raw", "image_rect", "image_color", "image_mono",
                 "image_rect_color", "image_rect_raw"}  # topic name parts that say nothing about the sensor


@dataclass(frozen=True)
class DefaultField:
    suffix: str
    paths: tuple[str, ...]
    names: tuple[str, ...] | None = None  # None: from the paths (or the joint names)
    declare: tuple[tuple[str, Any], ...] = ()


XYZ = ("x", "y", "z")
QUAT = (("interpolation", "slerp"), ("quaternion_order", "xyzw"))


def _vec(path: str, names: tuple[str, ...] = XYZ) -> tuple[str, ...]:
    return tuple(f"{path}.{n}" for n in names)


DEFAULTS: dict[str, tuple[DefaultField, ...]] = {
    "sensor_msgs/msg/Imu": (
        DefaultField("orientation", _vec("orientation", ("x", "y", "z", "w")), ("x", "y", "z", "w"), QUAT),
        DefaultField("angular_velocity", _vec("angular_velocity"), XYZ, (("units", "rad/s"),)),
        DefaultField("linear_acceleration", _vec("linear_acceleration"), XYZ, (("units", "m/s^2"),))),
    "sensor_msgs/msg/JointState": (
        DefaultField("position", ("position",)), DefaultField("velocity", ("velocity",)),
        DefaultField("effort", ("effort",))),
    "nav_msgs/msg/Odometry": (
        DefaultField("position", _vec("pose.pose.position"), XYZ, (("units", "m"),)),
        DefaultField("orientation", _vec("pose.pose.orientation", ("x", "y", "z", "w")), ("x", "y", "z", "w"), QUAT),
        DefaultField("linear_velocity", _vec("twist.twist.linear"), XYZ, (("units", "m/s"),)),
        DefaultField("angular_velocity", _vec("twist.twist.angular"), XYZ, (("units", "rad/s"),))),
    "sensor_msgs/msg/NavSatFix": (
        DefaultField("position", ("latitude", "longitude", "altitude"), ("latitude", "longitude", "altitude")),
        DefaultField("status", ("status.status", "status.service"), ("status", "service"),
                     (("interpolation", "hold"),))),
}
SUPPORTED = tuple(DEFAULTS) + IMAGE_TYPES


@dataclass(frozen=True)
class Column:
    """One resolved path: a scalar (`width` 0) or an array of `width` values, with the dtype its
    definition gives."""

    path: str
    dtype: str
    width: int  # 0: a scalar; n: an array of n values (a sequence: the first message's length)
    sequence: bool = False  # variable length in the definition (JointState arrays)


@dataclass(frozen=True)
class StreamMap:
    """One store field read from one topic: everything a worker needs to extract it (picklable)."""

    field: str
    topic: str
    msgtype: str
    kind: str  # "timeseries" | "video"
    columns: tuple[Column, ...] = ()
    dtype: str = "float64"
    names: tuple[str, ...] | None = None
    declare: tuple[tuple[str, Any], ...] = ()
    joints: tuple[str, ...] | None = None  # JointState: the joint order; values are reordered by msg.name

    @property
    def width(self) -> int:
        return sum(max(c.width, 1) for c in self.columns)


@dataclass(frozen=True)
class TopicMapping:
    """What the mapping file says about one topic (None: defaults)."""

    name: str | None = None
    time: str | None = None
    fields: tuple[tuple[str, dict[str, Any]], ...] | None = None


def topic_prefixes(topics: Sequence[str]) -> dict[str, str]:
    """A short, distinct field-name prefix per topic: its last meaningful name part (`/imu/data` ->
    `imu`, `/husky_velocity_controller/odom` -> `odom`), more parts where two topics would share one,
    every part where even that clashes (`/cam/image_raw` vs `/cam/image_raw/compressed`)."""
    parts = {t: [field_name(p) for p in t.strip("/").split("/") if p] or ["topic"] for t in topics}
    meaningful = {t: [p for p in ps if p not in GENERIC_PARTS] or ps for t, ps in parts.items()}

    def suffix(t: str, depth: int) -> str:
        return "_".join(meaningful[t][-depth:])

    out = {}
    for t in topics:
        depth = 1
        while depth < len(meaningful[t]) and any(suffix(u, depth) == suffix(t, depth) for u in topics if u != t):
            depth += 1
        out[t] = suffix(t, depth)
    chosen = list(out.values())
    return {t: "_".join(parts[t]) if chosen.count(p) > 1 else p for t, p in out.items()}


def unique_field_names(wanted: Sequence[str], fixed: set[str]) -> list[str]:
    """Valid, distinct store field names for `wanted` (in order): reserved names and clashes (with each
    other and with the user's `fixed` names) get `_2`, `_3`... (`episode_store.unique_names`)."""
    return unique_names(wanted, set(fixed) | RESERVED)


def _parse_path(path: str) -> list[tuple[str, int | None]]:
    out = []
    for part in path.split("."):
        name, _, index = part.partition("[")
        out.append((name, int(index[:-1]) if index else None))
    return out


def field_getter(path: str) -> Callable[[Any], Any]:
    """`a.b[2].c` -> a function of a message (attrgetter where there is no index: C speed)."""
    if "[" not in path:
        return attrgetter(path)
    steps = _parse_path(path)

    def get(msg: Any) -> Any:  # noqa: ANN401
        for name, index in steps:
            msg = getattr(msg, name)
            if index is not None:
                msg = msg[index]
        return msg

    return get


def resolve_path(fielddefs: Mapping[str, Any], msgtype: str, path: str) -> list[Column]:
    """The columns a path names in `msgtype` (a sub-message: its numeric fields, depth first, in
    definition order). Raises ValueError with the reason when the path does not name numbers."""
    if not PATH_RE.match(path):
        raise ValueError(f"{path!r} is not a field path (names separated by '.', optional [index])")
    node: tuple[int, Any] = (NAME, msgtype)
    walked = []
    for name, index in _parse_path(path):
        if node[0] != NAME:
            raise ValueError(f"{'.'.join(walked) or msgtype} is not a message, so it has no field {name!r}")
        fields = dict(fielddefs[node[1]][1])
        if name not in fields:
            raise ValueError(f"{node[1]} has no field {name!r} (it has: {', '.join(fields)})")
        node = fields[name]
        walked.append(name)
        if index is not None:
            if node[0] not in (ARRAY, SEQUENCE):
                raise ValueError(f"{'.'.join(walked)} is not an array, so [{index}] names nothing")
            if node[0] == ARRAY and index >= node[1][1]:
                raise ValueError(f"{'.'.join(walked)} holds {node[1][1]} values; [{index}] is past its end")
            node = node[1][0]
            walked[-1] += f"[{index}]"
    return _columns(fielddefs, node, path)


def _columns(fielddefs: Mapping[str, Any], node: tuple[int, Any], path: str) -> list[Column]:
    kind, spec = node
    if kind == BASE:
        if spec[0] not in NUMERIC:
            raise ValueError(f"{path} is a {spec[0]}, not a number")
        return [Column(path, NUMERIC[spec[0]], 0)]
    if kind in (ARRAY, SEQUENCE):
        inner = spec[0]
        if inner[0] != BASE or inner[1][0] not in NUMERIC:
            raise ValueError(f"{path} is an array of messages or strings: name one element's field, e.g. "
                             f"{path}[0]....")
        return [Column(path, NUMERIC[inner[1][0]], spec[1] if kind == ARRAY else -1, kind == SEQUENCE)]
    out: list[Column] = []
    for name, child in fielddefs[spec][1]:
        if child[0] == BASE and child[1][0] not in NUMERIC:
            continue  # strings (a header's frame_id) are not time series
        if child[0] in (ARRAY, SEQUENCE) and (child[1][0][0] != BASE or child[1][0][1][0] not in NUMERIC):
            continue
        out.extend(_columns(fielddefs, child, f"{path}.{name}"))
    if not out:
        raise ValueError(f"{path} holds no numbers")
    return out


def column_names(columns: Sequence[Column]) -> tuple[str, ...]:
    """Default value names: the path of each column (`orientation.x`), `path[i]` for array elements."""
    names: list[str] = []
    for c in columns:
        names.extend([c.path] if c.width == 0 else [f"{c.path}[{i}]" for i in range(c.width)])
    return tuple(names)


def result_dtype(columns: Sequence[Column]) -> str:
    """One dtype for a field's columns: theirs when they agree, else numpy's promotion (int8 and
    uint16 -> int32, so both stay exact)."""
    return str(np.result_type(*[np.dtype(c.dtype) for c in columns]))


def parse_mapping(doc: Any, source: str) -> dict[str, TopicMapping]:
    """The mapping file's content -> {topic: TopicMapping}, in file order; every mistake is one
    UserError naming the file and the key."""
    fix = "see docs/convert-rosbag.md, section 'Mapping file'"
    if not isinstance(doc, dict) or set(doc) - {"topics"} or not isinstance(doc.get("topics"), dict) \
            or not doc["topics"]:
        raise UserError(f"{source}: a mapping file holds one key, `topics`, a non-empty map of topic -> entry",
                        hint=fix)
    out = {}
    for topic, entry in doc["topics"].items():
        where = f"{source}: topics.{topic}"
        entry = {} if entry is None else entry
        if not isinstance(topic, str) or not isinstance(entry, dict):
            raise UserError(f"{where}: each topic maps to a map of {sorted(TOPIC_KEYS)} (or nothing)", hint=fix)
        if set(entry) - TOPIC_KEYS:
            raise UserError(f"{where}: unknown key(s) {sorted(set(entry) - TOPIC_KEYS)}",
                            hint=f"a topic takes {sorted(TOPIC_KEYS)}")
        if "name" in entry and "fields" in entry:
            raise UserError(f"{where}: `name` (the prefix of the type's default fields) and `fields` (your own "
                            "fields) exclude each other", hint="name each field under `fields` instead")
        if entry.get("time", "header") not in TIME_MODES:
            raise UserError(f"{where}.time: {entry['time']!r} is not one of {list(TIME_MODES)}", hint=fix)
        name = entry.get("name")
        if name is not None and (not isinstance(name, str) or field_name(name) != name):
            raise UserError(f"{where}.name: {name!r} is not a field name ([a-z][a-z0-9_]{{0,31}})",
                            hint=f"e.g. {field_name(str(name))!r}")
        fields = None
        if "fields" in entry:
            fields = tuple((f, _parse_field(f, spec, f"{where}.fields.{f}")) for f, spec in _items(entry["fields"], where))
        out[topic] = TopicMapping(name, entry.get("time"), fields)
    return out


def _items(fields: Any, where: str) -> list[tuple[str, Any]]:
    if not isinstance(fields, dict) or not fields:
        raise UserError(f"{where}.fields: a non-empty map of field name -> {{paths: [...], ...}}",
                        hint="see docs/convert-rosbag.md, section 'Mapping file'")
    return list(fields.items())


def _parse_field(name: Any, spec: Any, where: str) -> dict[str, Any]:
    if not isinstance(name, str) or field_name(name) != name or name in RESERVED:
        raise UserError(f"{where}: {name!r} is not a field name ([a-z][a-z0-9_]{{0,31}}, not {sorted(RESERVED)}, "
                        "not ending in _mask)", hint=f"e.g. {field_name(str(name))!r}")
    if isinstance(spec, (str, list)):
        spec = {"paths": spec}
    if not isinstance(spec, dict) or set(spec) - FIELD_KEYS or "paths" not in spec:
        raise UserError(f"{where}: a field is {{paths: [...]}} with optional {sorted(FIELD_KEYS - {'paths'})}",
                        hint="check the spelling of its keys")
    paths = [spec["paths"]] if isinstance(spec["paths"], str) else spec["paths"]
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and PATH_RE.match(p) for p in paths):
        raise UserError(f"{where}.paths: {spec['paths']!r} is not a list of field paths like pose.pose.position.x",
                        hint="names separated by '.', an optional [index]")
    out = {**spec, "paths": tuple(paths)}
    if "names" in spec and (not isinstance(spec["names"], list) or not all(isinstance(n, str) for n in spec["names"])):
        raise UserError(f"{where}.names: a list of strings, one per value", hint="or leave it out (names from paths)")
    if spec.get("interpolation", "linear") not in INTERPOLATIONS:
        raise UserError(f"{where}.interpolation: {spec['interpolation']!r} is not one of {list(INTERPOLATIONS)}",
                        hint="linear for continuous signals, hold for flags and modes")
    if (spec.get("interpolation") == "slerp") != ("quaternion_order" in spec):
        raise UserError(f"{where}: slerp needs quaternion_order (xyzw for ROS quaternions), and only slerp takes it",
                        hint="interpolation: slerp, quaternion_order: xyzw")
    if "dtype" in spec:
        try:
            np.dtype(spec["dtype"])
        except TypeError as exc:
            raise UserError(f"{where}.dtype: {spec['dtype']!r} is not a numpy dtype", hint="e.g. float64, int32") from exc
    return out


def gap_segments(times_ns: np.ndarray, gap_ns: int) -> list[tuple[int, int]]:
    """Receive times ([M] int64 ns, any order) cut where consecutive ones are more than `gap_ns`
    apart: [(first, last)] per episode, in time order."""
    t = np.sort(np.asarray(times_ns, np.int64))  # [M]
    if len(t) == 0:
        return []
    cuts = np.flatnonzero(np.diff(t) > gap_ns)  # last index of each segment but the final one
    starts = np.concatenate([[0], cuts + 1])
    ends = np.concatenate([cuts, [len(t) - 1]])
    return [(int(t[a]), int(t[b])) for a, b in zip(starts, ends)]


def marker_segments(times_ns: np.ndarray, markers_ns: np.ndarray) -> list[tuple[int, int]]:
    """Receive times cut at each marker (a message on the split topic starts an episode: a time equal
    to a marker belongs to the episode it starts): [(first, last)] of the non-empty episodes."""
    t = np.sort(np.asarray(times_ns, np.int64))
    if len(t) == 0:
        return []
    bounds = np.unique(np.asarray(markers_ns, np.int64))
    episode = np.searchsorted(bounds, t, side="right")  # [M] 0 = before the first marker
    cuts = np.flatnonzero(np.diff(episode) != 0)
    starts = np.concatenate([[0], cuts + 1])
    ends = np.concatenate([cuts, [len(t) - 1]])
    return [(int(t[a]), int(t[b])) for a, b in zip(starts, ends)]


def seconds(ns: np.ndarray) -> np.ndarray:
    """Integer ns -> float64 seconds as `sec + nanosec / 1e9` (whole seconds exact, one rounding of the
    sum: ~0.24 us at today's Unix times)."""
    ns = np.asarray(ns, np.int64)
    return (ns // 1_000_000_000).astype(np.float64) + (ns % 1_000_000_000) / 1e9
