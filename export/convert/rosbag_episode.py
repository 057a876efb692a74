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
from typing import Any, Callable

import numpy as np

from robowds.export.convert.rosbag_mapping import StreamMap, seconds
from robowds.export.convert.rosbag_media import FrameSpool
from robowds.export.convert.rosbag_source import Bag, damaged, open_bag, topic_types
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


def field_getter(path: str) -> Callable[[Any], Any]:
    """`a.b[2].c` -> a function of a message (attrgetter where there is no index: C speed)."""
    if "[" not in path:
        return attrgetter(path)
    steps = []
    for part in path.split("."):
        name, _, index = part.partition("[")
        steps.append((name, int(index[:-1]) if index else None))

    def get(msg: Any) -> Any:  # noqa: ANN401
        for name, index in steps:
            msg = getattr(msg, name)
            if index is not None:
                msg = msg[index]
        return msg

    return get


class FieldRows:
    """The values of one time-series field, one row per message."""

    def __init__(self, stream: StreamMap) -> None:
        self.stream, self.rows, self.flat = stream, [], False
        cols = stream.columns
        if stream.joints is not None:
            self.extract = self._joints
        elif all(c.width == 0 and "[" not in c.path for c in cols):  # scalars: one flat list, N per message
            get = attrgetter(*[c.path for c in cols])
            self.extract = get if len(cols) > 1 else (lambda m: (get(m),))
            self.flat = True
        else:
            getters = [field_getter(c.path) for c in cols]
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
        if self.flat:  # a flat list of T x N scalars converts 3x faster than T tuples
            return np.array(self.rows, dtype=self.stream.dtype).reshape(-1, len(self.stream.columns))
        try:
            out = np.array(self.rows, dtype=self.stream.dtype)
        except ValueError as exc:
            widths = sorted({len(r) for r in self.rows})
            raise ValueError(f"field {self.stream.field}: messages hold {widths} values, not one width") from exc
        return out.reshape(len(self.rows), -1)


class TopicRows:
    """Everything collected from one topic: receive times, header stamps, field rows, frames."""

    def __init__(self, plan: TopicPlan, folder: Path, episode: str) -> None:
        self.plan, self.recv, self.header = plan, [], ([] if plan.time == "header" else None)
        self.fields = [FieldRows(s) for s in plan.streams if s.kind == "timeseries"]
        self.spools = [(s, FrameSpool(folder / f".spool-{_safe(episode)}-{s.field}", plan.topic)) for s in plan.streams
                       if s.kind == "video"]  # one file per episode and field: workers share the folder
        # per message: (append, extract) pairs, bound once (this loop runs once per message of the bag)
        self.sinks = [(f.rows.extend if f.flat else f.rows.append, f.extract) for f in self.fields] + [
            (s.add, _same) for _, s in self.spools]
        self.recv_append = self.recv.append
        self.header_append = self.header.append if self.header is not None else None

    def add(self, receive_ns: int, msg: Any) -> None:  # noqa: ANN401
        self.recv_append(receive_ns)
        if self.header_append is not None:
            stamp = msg.header.stamp
            self.header_append(stamp.sec * 1_000_000_000 + stamp.nanosec)
        for append, extract in self.sinks:
            append(extract(msg))

    def times(self) -> tuple[np.ndarray, list[str]]:
        """[T] int64 ns in message order, and notes."""
        recv = np.array(self.recv, np.int64)
        if self.header is None:
            return recv, []
        header = np.array(self.header, np.int64)
        if len(header) and not header.any():
            return recv, [f"{self.plan.topic}: every header stamp is zero; receive times used"]
        return header, []


def _same(msg: Any) -> Any:  # noqa: ANN401
    return msg


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def convert_episode(task: BagTask, folder: Path) -> dict[str, Any]:
    """The episode's store row (videos written under `folder/media/<field>/`)."""
    ep, bag = task.episode_id, task.bag.path
    with open_bag(bag, task.typestore, ep) as reader:
        types = topic_types(reader, bag)
        for tp in task.topics:
            if tp.topic in types and types[tp.topic] != tp.msgtype:
                raise UserError(f"episode {ep!r}: {bag}: topic {tp.topic} is {types[tp.topic]} here, {tp.msgtype} in "
                                "the first bag that has it", hint="convert these bags separately")
        collect = {tp.topic: TopicRows(tp, folder, ep) for tp in task.topics if tp.topic in types}
        try:
            _read(reader, collect, task)
        except BaseException:
            for rows in collect.values():
                for _, spool in rows.spools:
                    spool.discard()
            raise
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
        ns, topic_notes = rows.times()  # [T] in message order
        t = seconds(ns)  # [T] float64
        order = np.argsort(ns, kind="stable")
        if np.any(np.diff(ns) < 0):
            topic_notes.append(f"{tp.topic}: {int(np.sum(np.diff(ns) < 0))} messages out of time order, sorted")
        for f in rows.fields:
            try:
                values = f.values()  # [T, N]
            except ValueError as exc:
                raise UserError(f"episode {ep!r}: {bag}, topic {tp.topic}: {exc}",
                                hint="map fixed-width values only (e.g. position[0]), or pass --skip-bad") from exc
            row[f.stream.field] = {"t": t[order], "v": values[order]}
        for stream, spool in rows.spools:
            rel = Path("media") / stream.field / f"{_safe(ep)}.mkv"
            offset, fps, video_notes = spool.write_video(ns, folder / rel)
            row[stream.field] = {"path": rel.as_posix(), "fps": fps, "start_s": None, "end_s": None,
                                 "clock_offset_s": offset}
            topic_notes.extend(video_notes)
        notes.extend(f"episode {ep}: {n}" for n in topic_notes)
    if all(row.get(s.field) is None for tp in task.topics for s in tp.streams):
        raise UserError(f"episode {ep!r}: {bag} has no message on the mapped topics "
                        f"({', '.join(tp.topic for tp in task.topics)})",
                        hint="check the topic names (robowds convert rosbag lists them in its report), or pass --skip-bad")
    if notes:
        row["_notes"] = notes
    return row


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
