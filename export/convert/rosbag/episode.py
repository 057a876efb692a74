"""One episode of a ROS bag -> one store row: every mapped topic's messages in one pass over the bag
(in the episode's receive-time range), deserialised once, each field's values collected as rows and
turned into arrays at the end.

Times: per topic, the header stamp (`sec + nanosec / 1e9`, float64 seconds since the Unix epoch) or
the receive time (the bag's record time) as the plan says; a topic whose header stamps are all zero in
the episode (a publisher that never set them) falls back to receive times, noted. Messages are put in
time order (stable; noted when a topic was out of order), so the store holds clean streams.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

from robowds.export.convert.rosbag.mapping import StreamMap, field_getter, seconds
from robowds.export.convert.rosbag.media import FrameSpool
from robowds.export.convert.rosbag.quaternions import episode_quaternions, is_quaternion
from robowds.export.convert.rosbag.source import Bag, damaged, open_bag, topic_types
from robowds.export.errors import UserError


@dataclass(frozen=True)
class TopicPlan:
    """One topic to read: its type, its clock ("header" or "receive") and the fields it feeds."""

    topic: str
    msgtype: str
    time: str
    streams: tuple[StreamMap, ...]


@dataclass(frozen=True)
class BagTask:
    """One episode: a bag and, when the bag is split, its receive-time range [start_ns, stop_ns)."""

    bag: Bag
    episode_id: str
    topics: tuple[TopicPlan, ...]
    typestore: str
    start_ns: int | None = None
    stop_ns: int | None = None


EXACT_IN_FLOAT64 = {"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "float32", "float64"}
STAMP = ("header.stamp.sec", "header.stamp.nanosec")


class FieldRows:
    """The values of one time-series field read one message at a time (arrays, JointState, int64
    columns); scalar fields of other dtypes are read in one pass per topic by `TopicRows`."""

    def __init__(self, stream: StreamMap) -> None:
        self.stream, self.rows = stream, []
        if stream.joints is not None:
            self.extract = self._joints
        else:
            getters = [field_getter(c.path) for c in stream.columns]
            self.extract = lambda m: np.concatenate([np.ravel(g(m)) for g in getters])

    def _joints(self, msg: Any) -> np.ndarray:  # noqa: ANN401
        """JointState: values in the plan's joint order whatever order the message lists them in; an
        empty array (a driver that sends no effort) is a missing sample (NaN)."""
        values = np.asarray(getattr(msg, self.stream.columns[0].path), np.float64)  # [J]
        joints = self.stream.joints
        if len(values) == 0:
            return np.full(len(joints), np.nan)
        names = list(msg.name)
        if names == list(joints):
            return values
        if sorted(names) != sorted(joints) or len(values) != len(names):
            raise ValueError(f"joints {names} differ from the first message's {list(joints)}")
        where = {n: i for i, n in enumerate(names)}
        return values[[where[j] for j in joints]]

    def values(self) -> np.ndarray:
        """[T, N] in the field's dtype."""
        try:
            out = np.array(self.rows, dtype=self.stream.dtype)
        except ValueError as exc:
            widths = sorted({len(r) for r in self.rows})
            raise ValueError(f"field {self.stream.field}: messages hold {widths} values, not one width") from exc
        return out.reshape(len(self.rows), -1)


def _packable(stream: StreamMap) -> bool:
    """Scalars that float64 holds exactly (every dtype but 64-bit integers), by plain attribute paths."""
    return stream.joints is None and all(c.width == 0 and "[" not in c.path and c.dtype in EXACT_IN_FLOAT64
                                         for c in stream.columns)


class TopicRows:
    """Everything collected from one topic: receive times, header stamps, field values, frames.

    Per message, one C-level `attrgetter` call reads the header stamp and every scalar column of the
    topic's packable fields into one flat list (the loop runs once per message of the bag: one call
    instead of one per field and a Python-level stamp); other fields and camera frames are fed one
    by one."""

    def __init__(self, plan: TopicPlan, folder: Path, episode: str) -> None:
        self.plan, self.recv, self.flat = plan, [], []
        streams = [s for s in plan.streams if s.kind == "timeseries"]
        self.packed = [s for s in streams if _packable(s)]
        self.fields = [FieldRows(s) for s in streams if not _packable(s)]
        self.spools = [(s, FrameSpool(folder / f".spool-{_safe(episode)}-{s.field}", plan.topic)) for s in plan.streams
                       if s.kind == "video"]  # one file per episode and field: workers share the folder
        paths = [*(STAMP if plan.time == "header" else ()), *(c.path for s in self.packed for c in s.columns)]
        self.width = len(paths)
        get = attrgetter(*paths) if paths else None
        self.get = (lambda m: (get(m),)) if len(paths) == 1 else get
        self.sinks = [(f.rows.append, f.extract) for f in self.fields] + [(s.add, _same) for _, s in self.spools]

    def add(self, receive_ns: int, msg: Any) -> None:  # noqa: ANN401
        self.recv.append(receive_ns)
        if self.get is not None:
            self.flat.extend(self.get(msg))
        for append, extract in self.sinks:
            append(extract(msg))

    def table(self) -> np.ndarray:
        """The packed values, [T, width] float64 (exact for every packed dtype)."""
        return np.array(self.flat, np.float64).reshape(len(self.recv), self.width)

    def columns(self, table: np.ndarray) -> dict[str, np.ndarray]:
        """field -> [T, N] values in the field's dtype, every time-series field of the topic."""
        out, at = {}, 2 if self.plan.time == "header" else 0
        for s in self.packed:
            out[s.field] = table[:, at:at + len(s.columns)].astype(s.dtype)
            at += len(s.columns)
        for f in self.fields:
            out[f.stream.field] = f.values()
        return out

    def times(self, table: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """[T] int64 ns in message order, and notes."""
        recv = np.array(self.recv, np.int64)
        if self.plan.time != "header":
            return recv, []
        header = table[:, 0].astype(np.int64) * 1_000_000_000 + table[:, 1].astype(np.int64)
        if len(header) and not header.any():
            return recv, [f"{self.plan.topic}: every header stamp is zero; receive times used"]
        return header, []


def _same(msg: Any) -> Any:  # noqa: ANN401
    return msg


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def convert_episode(task: BagTask, folder: Path) -> dict[str, Any]:
    """The episode's store row (videos written under `folder/media/<field>/`). An episode that fails
    leaves nothing behind in `folder` (with --skip-bad the store is published without it)."""
    ep, bag = task.episode_id, task.bag.path
    collect: dict[str, TopicRows] = {}
    written: list[Path] = []
    try:
        with open_bag(bag, task.typestore, ep) as reader:
            types = topic_types(reader, bag)
            for tp in task.topics:
                if tp.topic in types and types[tp.topic] != tp.msgtype:
                    raise UserError(f"episode {ep!r}: {bag}: topic {tp.topic} is {types[tp.topic]} here, {tp.msgtype} "
                                    "in the first bag that has it", hint="convert these bags separately")
            collect.update({tp.topic: TopicRows(tp, folder, ep) for tp in task.topics if tp.topic in types})
            _read(reader, collect, task)
        return _row(task, collect, folder, written, types)
    except BaseException:
        for rows in collect.values():
            for _, spool in rows.spools:
                spool.discard()
        for path in written:
            path.unlink(missing_ok=True)
        raise


def _row(task: BagTask, collect: dict[str, TopicRows], folder: Path, written: list[Path],
         types: dict[str, str]) -> dict[str, Any]:
    """The collected messages as a store row: per topic its clock, values in time order, videos; a
    quaternion field that is zero in every message of the episode is null there (`quaternions`).
    `types`: every topic of the bag (for the message when nothing was read)."""
    ep, bag = task.episode_id, task.bag.path
    row: dict[str, Any] = {"episode_id": ep}
    notes: list[str] = []
    for tp in task.topics:
        rows = collect.get(tp.topic)
        if rows is None or not rows.recv:
            if any(s.kind == "video" for s in tp.streams):
                raise UserError(f"episode {ep!r}: {bag}: image topic {tp.topic} has no message in this episode",
                                hint="leave the topic out with --mapping, or pass --skip-bad")
            row.update({s.field: None for s in tp.streams})
            notes.append(f"episode {ep}: topic {tp.topic} has no message; its fields are empty")
            continue
        table = rows.table()  # [T, K]
        quaternions = {s.field for s in tp.streams if is_quaternion(s)}
        ns, topic_notes = rows.times(table)  # [T] in message order
        t = seconds(ns)  # [T] float64
        order = np.argsort(ns, kind="stable")
        if np.any(np.diff(ns) < 0):
            topic_notes.append(f"{tp.topic}: {int(np.sum(np.diff(ns) < 0))} messages out of time order, sorted")
        try:
            columns = rows.columns(table)  # field -> [T, N]
        except ValueError as exc:
            raise UserError(f"episode {ep!r}: {bag}, topic {tp.topic}: {exc}",
                            hint="map fixed-width values only (e.g. position[0]), or pass --skip-bad") from exc
        for name, values in columns.items():
            keep, quaternion_notes = episode_quaternions(tp.topic, name, values) if name in quaternions else (True, [])
            row[name] = {"t": t[order], "v": values[order]} if keep else None
            topic_notes.extend(quaternion_notes)
        for stream, spool in rows.spools:
            rel = Path("media") / stream.field / f"{_safe(ep)}.mkv"
            written.append(folder / rel)
            offset, fps, video_notes = spool.write_video(ns, folder / rel)
            row[stream.field] = {"path": rel.as_posix(), "fps": fps, "start_s": None, "end_s": None,
                                 "clock_offset_s": offset}
            topic_notes.extend(video_notes)
        notes.extend(f"episode {ep}: {n}" for n in topic_notes)
    if all(row.get(s.field) is None for tp in task.topics for s in tp.streams):
        raise _empty_episode(task, collect, types, notes)
    if notes:
        row["_notes"] = notes
    return row


def _empty_episode(task: BagTask, collect: dict[str, TopicRows], types: dict[str, str], notes: list[str]) -> UserError:
    """The error for an episode with no value in any field: the topics it was to read, and what the bag
    holds (topic and type), or why the messages it has gave nothing."""
    ep, bag = task.episode_id, task.bag.path
    mapped = ", ".join(tp.topic for tp in task.topics)
    if any(rows.recv for rows in collect.values()):
        return UserError(f"episode {ep!r}: {bag}: no field has a value in this episode ({'; '.join(notes)})",
                         hint="map other fields with --mapping, or pass --skip-bad to leave the episode out")
    held = "; ".join(f"{t} ({m})" for t, m in sorted(types.items())) or "no topic"
    return UserError(f"episode {ep!r}: {bag} has no message on the converted topics ({mapped}); it holds: {held}",
                     hint="name the topics to convert with --mapping FILE (docs/convert-rosbag.md, section 'Mapping "
                          "file'), convert this bag on its own, or pass --skip-bad to leave it out")


def _read(reader: Any, collect: dict[str, TopicRows], task: BagTask) -> None:  # noqa: ANN401
    """One pass over the episode's messages; a read or deserialisation failure names bag, episode and
    topic, any other failure (a frame, a width) the topic and what is wrong."""
    conns = [c for c in reader.connections if c.topic in collect]
    if not conns:
        return
    messages = reader.messages(conns, start=task.start_ns, stop=task.stop_ns)
    deserialize, topic = reader.deserialize, None
    while True:
        try:
            conn, receive_ns, raw = next(messages)
            topic = conn.topic
            msg = deserialize(raw, conn.msgtype)
        except StopIteration:
            return
        except Exception as exc:  # noqa: BLE001 (a damaged chunk raises many kinds)
            raise damaged(task.bag.path, exc, task.episode_id, topic) from exc
        try:
            collect[topic].add(receive_ns, msg)
        except ValueError as exc:  # a frame that cannot be read, joints that change, ...
            raise UserError(f"episode {task.episode_id!r}: {task.bag.path}, topic {topic}: {exc}",
                            hint="leave the topic out with --mapping (it lists the topics to convert), "
                                 "or pass --skip-bad") from exc
