"""ROS 1 bags and ROS 2 bags / MCAP -> an episode store, through `rosbags` (AnyReader).

SRC is one bag (a ROS 1 `.bag`, a ROS 2 bag folder with metadata.yaml, a bare `.mcap` / `.db3`) or a
folder of bags (each its own episode, its id the bag's path under SRC without suffix). One episode per
bag, or several: `split_topic` (a message on that topic starts an episode) or `split_gap_s` (a gap
longer than that in the receive times of every converted topic cuts). Cuts are on receive times, read
from the ROS 1 index or without deserialising: the plan deserialises each topic's first message only.

Fields (see `mapping`): by default every topic of a supported type (Imu, JointState, Odometry,
NavSatFix, Image, CompressedImage) with its default fields; with a mapping file, exactly the topics it
lists. Topics of other types are listed in the report, never an error unless the mapping names them.
Times are float64 seconds since the Unix epoch (header stamp or receive time), kept absolute: the store
allows any origin, every stream of a bag shares that clock, and split episodes keep wall-clock time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from robowds.export.convert.episode_store import FieldSpec
from robowds.export.convert.rosbag.episode import BagTask, TopicPlan, convert_episode
from robowds.export.convert.rosbag.mapping import (
    DEFAULTS, IMAGE_TYPES, SUPPORTED, Column, StreamMap, TopicMapping, column_names, field_getter, gap_segments,
    marker_segments, parse_mapping, resolve_path, result_dtype, topic_prefixes, unique_field_names)
from robowds.export.convert.rosbag.quaternions import (
    any_rotation, is_quaternion, left_out_note, never_rotation, zero_in_message)
from robowds.export.convert.rosbag.source import (
    Bag, find_bags, first_message, listed_topics, open_bag, open_index, receive_times, topic_types)
from robowds.export.convert.run import Conversion, run_conversion
from robowds.export.errors import UserError

HEADER_TYPE = "std_msgs/msg/Header"


@dataclass
class Inventory:
    """What the plan learnt from the bags: types, and per topic the first bag's definitions and first
    message; per bag its receive-time segments."""

    types: dict[str, str] = field(default_factory=dict)  # topic -> type (union over bags)
    fielddefs: dict[str, Any] = field(default_factory=dict)  # topic -> the first bag's rosbags fielddefs
    first: dict[str, Any] = field(default_factory=dict)  # topic -> its first message
    segments: dict[str, list[tuple[int, int]] | None] = field(default_factory=dict)  # bag name -> [(first, last)]
    skipped: list[dict[str, Any]] = field(default_factory=list)


def load_mapping(path: Path) -> dict[str, TopicMapping]:
    """Read and check a mapping file (YAML)."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise UserError(f"cannot read the mapping file {path}: {exc.strerror or exc}",
                        hint="pass an existing YAML file to --mapping") from exc
    except yaml.YAMLError as exc:
        raise UserError(f"{path} is not YAML: {exc}", hint="check its indentation and quoting") from exc
    return parse_mapping(doc, str(path))


def _inventory(bags: list[Bag], wanted: Any, split_topic: str | None, split_gap_s: float | None,  # noqa: ANN401
               typestore: str, skip_bad: bool) -> Inventory:
    """Every bag's topic types and episode segments; the definitions and first message of each wanted
    topic from the first bag that has it. The first bag is opened with its type store (it defines most
    topics); the others are read as little as their inventory needs: a ROS 2 folder's metadata.yaml,
    else the bag's index (no type store, nothing deserialised), and with a type store only if they
    bring a new topic."""
    inv = Inventory()
    splitting = split_topic is not None or split_gap_s is not None
    for k, bag in enumerate(bags):
        try:
            listed = listed_topics(bag.path) if k > 0 and not splitting else None
            if listed is not None:
                types, segments = listed, None
            else:
                with open_bag(bag.path, typestore) if k == 0 else open_index(bag.path) as reader:
                    types = topic_types(reader, bag.path)
                    segments = _segments(reader, bag, [t for t in types if wanted(t, types[t])], split_topic,
                                         split_gap_s)
                    if k == 0:
                        _definitions(inv, reader, [t for t in types if wanted(t, types[t])], bag)
            _merge_types(inv, types, bag)
            new = [t for t in types if t not in inv.first and wanted(t, types[t])]
            if new and k > 0:
                with open_bag(bag.path, typestore) as reader:
                    _definitions(inv, reader, new, bag)
            inv.segments[bag.name] = segments
        except UserError as exc:
            if not skip_bad:
                raise
            inv.skipped.append({"episode": bag.name, "reason": str(exc)})
    return inv


def _merge_types(inv: Inventory, types: dict[str, str], bag: Bag) -> None:
    for topic, msgtype in types.items():
        if inv.types.setdefault(topic, msgtype) != msgtype:
            raise UserError(f"{bag.path}: topic {topic} is {msgtype}, but {inv.types[topic]} in an earlier bag",
                            hint="convert these bags separately")


def _definitions(inv: Inventory, reader: Any, topics: list[str], bag: Bag) -> None:  # noqa: ANN401
    """Each topic's first message and its type definitions (a topic recorded here without a message
    is looked up again in the next bag that has it)."""
    for topic in topics:
        first = first_message(reader, topic, bag.path)
        if first is not None:
            inv.first[topic] = first
            inv.fielddefs[topic] = reader.typestore.fielddefs


def _segments(reader: Any, bag: Bag, topics: list[str], split_topic: str | None,  # noqa: ANN401
              split_gap_s: float | None) -> list[tuple[int, int]] | None:
    if split_topic is None and split_gap_s is None:
        return None
    times = receive_times(reader, topics, bag.path)  # [M]
    if split_gap_s is not None:
        return gap_segments(times, int(round(split_gap_s * 1e9)))
    return marker_segments(times, receive_times(reader, [split_topic], bag.path))


def _streams(topic: str, msgtype: str, entry: TopicMapping | None, prefix: str, fielddefs: Any,  # noqa: ANN401
             first: Any, where: str) -> tuple[list[tuple[str, bool, StreamMap]], list[str]]:  # noqa: ANN401
    """The fields of one topic as (wanted name, name fixed by the user, stream), and notes."""
    notes: list[str] = []
    if msgtype in IMAGE_TYPES:
        if entry is not None and entry.fields is not None:
            raise UserError(f"{where}: topic {topic} is {msgtype}: it becomes one video field; give its `name`, "
                            "not `fields`", hint=f"topics: {{{topic}: {{name: camera}}}}")
        return [(prefix, entry is not None and entry.name is not None, StreamMap(prefix, topic, msgtype, "video"))], notes
    out = []
    if entry is not None and entry.fields is not None:
        for name, spec in entry.fields:
            out.append((name, True, _custom(topic, msgtype, name, spec, fielddefs, first, where)))
        return out, notes
    if msgtype not in DEFAULTS:
        raise UserError(f"{where}: topic {topic} is {msgtype}, which has no default mapping",
                        hint=f"list its fields: topics: {{{topic}: {{fields: {{my_field: {{paths: [...]}}}}}}}} "
                             f"(default mappings: {', '.join(SUPPORTED)})")
    for d in DEFAULTS[msgtype]:
        columns = [c for p in d.paths for c in resolve_path(fielddefs, msgtype, p)]
        names, joints = d.names, None
        if msgtype == "sensor_msgs/msg/Imu" and d.suffix == "orientation" and first.orientation_covariance[0] == -1:
            notes.append(f"{topic}: orientation not provided (orientation_covariance[0] = -1): not converted")
            continue
        if columns[0].sequence:  # JointState: as many values as the first message's joints
            width = len(field_getter(d.paths[0])(first))
            if width == 0:
                notes.append(f"{topic}: {d.suffix} is empty in the first message: not converted")
                continue
            columns = [Column(columns[0].path, columns[0].dtype, width, True)]
            joints = tuple(first.name) if len(first.name) == width else None
            names = joints or column_names(columns)
        out.append((f"{prefix}_{d.suffix}", False,
                    StreamMap("", topic, msgtype, "timeseries", tuple(columns), result_dtype(columns), names,
                              d.declare, joints)))
    return out, notes


def _custom(topic: str, msgtype: str, name: str, spec: dict[str, Any], fielddefs: Any, first: Any,  # noqa: ANN401
            where: str) -> StreamMap:
    """A field the mapping file spells out: its paths resolved against the type's definition."""
    columns: list[Column] = []
    short: list[str] = []  # default names: relative to the path given (`pose.pose.orientation` -> x y z w)
    for path in spec["paths"]:
        try:
            resolved = resolve_path(fielddefs, msgtype, path)
        except ValueError as exc:
            raise UserError(f"{where}: topics.{topic}.fields.{name}: {exc}",
                            hint=f"paths are message fields of {msgtype}, e.g. header.stamp.sec") from exc
        for c in resolved:
            if c.sequence:  # as many columns as the first message holds
                c = Column(c.path, c.dtype, len(field_getter(c.path)(first)), True)
            columns.append(c)
            rel = c.path[len(path) + 1:] if c.path != path else c.path
            short.extend(column_names([Column(rel, c.dtype, c.width)]))
    names = tuple(spec["names"]) if "names" in spec else (
        tuple(short) if len(set(short)) == len(short) else column_names(columns))
    width = sum(max(c.width, 1) for c in columns)
    if len(names) != width:
        raise UserError(f"{where}: topics.{topic}.fields.{name}: {len(names)} names for {width} values "
                        f"({', '.join(column_names(columns))})", hint="give one name per value, or leave names out")
    if spec.get("interpolation") == "slerp" and width != 4:
        raise UserError(f"{where}: topics.{topic}.fields.{name}: slerp needs 4 values (a quaternion), got {width}",
                        hint="paths: [pose.pose.orientation] gives x, y, z, w")
    declare = tuple((k, spec[k]) for k in ("interpolation", "quaternion_order", "units", "max_gap_s") if k in spec)
    return StreamMap(name, topic, msgtype, "timeseries", tuple(columns), spec.get("dtype") or result_dtype(columns),
                     names, declare)


def _never_rotates(topic: str, row: tuple[str, bool, StreamMap], first: Any,  # noqa: ANN401
                   rotates: Callable[[str, StreamMap], bool], where: str, notes: list[str]) -> bool:
    """True for a default quaternion field that is zero in every message (left out, noted); a field
    the mapping names is an error then (`quaternions`)."""
    name, user, stream = row
    if not is_quaternion(stream) or not zero_in_message(stream, first) or rotates(topic, stream):
        return False
    if user:
        raise never_rotation(topic, name, where)
    notes.append(left_out_note(topic, replace(stream, field=name)))
    return True


def _time_mode(msgtype: str, fielddefs: Any, wanted: str) -> tuple[str, str]:  # noqa: ANN401
    """(the clock a worker uses, what the report says)."""
    if wanted == "receive":
        return "receive", "receive"
    header = dict(fielddefs[msgtype][1]).get("header")
    if header is not None and header[1] == HEADER_TYPE:
        return "header", "header"
    return "receive", "receive (the type has no header)"


def plan_rosbag(src: Path, mapping: Path | None = None, time: str = "header", split_topic: str | None = None,
                split_gap_s: float | None = None, typestore: str = "latest", skip_bad: bool = False) -> Conversion:
    """The conversion of the bag(s) at `src`: fields, and one task per episode."""
    if time not in ("header", "receive"):
        raise UserError(f"time {time!r} is not header or receive", hint="--time header (default) or --time receive")
    if split_topic is not None and split_gap_s is not None:
        raise UserError("--split-topic and --split-gap exclude each other", hint="choose one way to cut episodes")
    if split_gap_s is not None and not split_gap_s > 0:
        raise UserError(f"--split-gap must be > 0 seconds, got {split_gap_s}", hint="e.g. --split-gap 5")
    src = Path(src).absolute()
    bags = find_bags(src)
    entries = load_mapping(mapping) if mapping is not None else None
    where = str(mapping) if mapping is not None else str(src)

    def wanted(topic: str, msgtype: str) -> bool:
        return topic in entries if entries is not None else msgtype in SUPPORTED

    inv = _inventory(bags, wanted, split_topic, split_gap_s, typestore, skip_bad)
    if entries is not None:
        missing = [t for t in entries if t not in inv.types]
        if missing:
            raise UserError(f"{mapping}: topic(s) {', '.join(missing)} are in no bag under {src}",
                            hint=f"the bags hold: {', '.join(sorted(inv.types)) or 'no topic'}")
    if split_topic is not None and split_topic not in inv.types:
        raise UserError(f"--split-topic {split_topic}: no bag under {src} has that topic",
                        hint=f"the bags hold: {', '.join(sorted(inv.types))}")
    topics = list(entries) if entries is not None else sorted(t for t in inv.first)
    live = [b for b in bags if b.name in inv.segments]  # not skipped at plan time

    def rotates(topic: str, stream: StreamMap) -> bool:
        return any_rotation(live, topic, stream, typestore, skip_bad)

    topic_plans, report_topics, notes = _topic_plans(topics, entries, inv, time, where, rotates)
    if not topic_plans and live:
        raise _nothing_to_convert(src, len(live), inv, notes)
    specs = [_spec(s) for tp in topic_plans for s in tp.streams]
    kinds = sorted({"ROS 1" if b.path.suffix == ".bag" else "ROS 2" for b in bags})
    report = {"bags": len(bags), "ros": kinds, "time": time, "topics": report_topics,
              "mapping": str(mapping) if mapping else None,
              "unsupported_topics": {t: m for t, m in sorted(inv.types.items()) if t not in report_topics},
              "split": {"topic": split_topic} if split_topic else {"gap_s": split_gap_s} if split_gap_s else None,
              "plan_notes": notes}
    return Conversion("rosbag", src, specs, _tasks(bags, inv, topic_plans, typestore), convert_episode,
                      lambda task: f"episode {task.episode_id} ({task.bag.path})", report=report, skipped=inv.skipped)


def _nothing_to_convert(src: Path, bags: int, inv: Inventory, notes: list[str]) -> UserError:
    """The error for bags none of whose topics gives a field: each topic with its type (and why it
    gives nothing), the fix a mapping file."""
    def why(topic: str, msgtype: str) -> str:
        if msgtype not in SUPPORTED:
            return "no default mapping"
        return "no message" if topic not in inv.first else "every field left out, see below"

    found = "; ".join(f"{t} ({m}: {why(t, m)})" for t, m in sorted(inv.types.items())) or "no topic"
    return UserError(f"{src}: no topic to convert; the {'bags hold' if bags > 1 else 'bag holds'}: {found}"
                     + "".join(f"; {n}" for n in notes),
                     hint="name the topics to convert and their fields (message paths) in a mapping file and pass it "
                          "with --mapping FILE (docs/convert-rosbag.md, section 'Mapping file'); types converted "
                          f"without one: {', '.join(t.replace('/msg/', '/') for t in SUPPORTED)}")


def _topic_plans(topics: list[str], entries: dict[str, TopicMapping] | None, inv: Inventory, time: str,
                 where: str, rotates: Callable[[str, StreamMap], bool]
                 ) -> tuple[tuple[TopicPlan, ...], dict[str, Any], list[str]]:
    """Each topic's fields, named (the user's names as given, the others from prefixes, made distinct),
    its clock; the report's `topics` entry; plan notes. `rotates(topic, stream)`: whether a quaternion
    field holds a non-zero quaternion anywhere (asked only when the first message's is zero)."""
    prefixes = topic_prefixes(topics)
    rows, notes, report_topics = [], [], {}
    for topic in topics:
        msgtype, entry = inv.types[topic], (entries or {}).get(topic)
        if inv.first.get(topic) is None:
            raise UserError(f"{where}: topic {topic} has no message in any bag", hint="leave it out of the mapping")
        prefix = entry.name if entry is not None and entry.name else prefixes[topic]
        streams, topic_notes = _streams(topic, msgtype, entry, prefix, inv.fielddefs[topic], inv.first[topic], where)
        streams = [s for s in streams if not _never_rotates(topic, s, inv.first[topic], rotates, where, topic_notes)]
        mode, said = _time_mode(msgtype, inv.fielddefs[topic], (entry.time if entry and entry.time else time))
        rows.extend((topic, mode, s) for s in streams)
        notes.extend(topic_notes)
        report_topics[topic] = {"type": msgtype, "time": said}
    fixed = [w for _, _, (w, user, _) in rows if user]
    if len(set(fixed)) != len(fixed):
        raise UserError(f"{where}: field name(s) {sorted({n for n in fixed if fixed.count(n) > 1})} used twice",
                        hint="give every field its own name")
    auto = iter(unique_field_names([w for _, _, (w, user, _) in rows if not user], set(fixed)))
    plans: dict[str, list[StreamMap]] = {}
    modes: dict[str, str] = {}
    for topic, mode, (wanted_name, user, stream) in rows:
        name = wanted_name if user else next(auto)
        plans.setdefault(topic, []).append(replace(stream, field=name))
        modes[topic] = mode
        report_topics[topic].setdefault("fields", []).append(name)
    return tuple(TopicPlan(t, inv.types[t], modes[t], tuple(plans[t])) for t in topics if t in plans), report_topics, notes


def _tasks(bags: list[Bag], inv: Inventory, topic_plans: tuple[TopicPlan, ...], typestore: str) -> list[BagTask]:
    """One task per bag, or per segment of a split bag (ids `<bag>_000`...); bags skipped at plan time
    have none."""
    tasks = []
    for bag in bags:
        if bag.name not in inv.segments:
            continue
        segments = inv.segments[bag.name]
        if segments is None:
            tasks.append(BagTask(bag, bag.name, topic_plans, typestore))
            continue
        width = max(3, len(str(len(segments) - 1)))
        tasks.extend(BagTask(bag, f"{bag.name}_{k:0{width}d}", topic_plans, typestore, first, last + 1)
                     for k, (first, last) in enumerate(segments))
    return tasks


def _spec(stream: StreamMap) -> FieldSpec:
    source = f"{stream.topic} ({stream.msgtype})"
    if stream.kind == "video":
        return FieldSpec(stream.field, "video", "uint8", source=source)
    return FieldSpec(stream.field, "timeseries", stream.dtype, stream.names,
                     source=f"{source}: {', '.join(c.path for c in stream.columns)}", declare=dict(stream.declare))


def convert_rosbag(src: Path, store: Path, overwrite: bool = False, progress: bool = False, workers: int = 1,
                   skip_bad: bool = False, mapping: Path | None = None, time: str = "header",
                   split_topic: str | None = None, split_gap_s: float | None = None,
                   typestore: str = "latest") -> dict[str, Any]:
    """Convert the bag(s) at `src` into a new episode store at `store`; returns the report (also
    written as `store/convert_report.json`)."""
    conv = plan_rosbag(src, mapping, time, split_topic, split_gap_s, typestore, skip_bad)
    return run_conversion(conv, Path(store), overwrite=overwrite, workers=workers, skip_bad=skip_bad,
                          progress=progress)
