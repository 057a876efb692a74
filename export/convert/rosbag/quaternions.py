"""Zero-norm quaternions in ROS messages: orientations a driver never fills in.

Many IMU drivers publish `sensor_msgs/Imu` with `orientation` left at (0, 0, 0, 0) when they compute
none (phidgets' `/imu/data_raw`, raw MEMS drivers), and do not set `orientation_covariance[0] = -1`
as REP 145 asks; some odometry sources do the same with `pose.pose.orientation`. A zero quaternion
names no rotation: the resampler drops such rows as missing samples (`core.resample.zero_quaternions`,
the one test used here too), so a stream of nothing but zeros would reach validate as a stream with no
valid samples. The converter therefore:

- leaves a default quaternion field out of the store when every message of the topic, over every bag,
  holds a zero quaternion (a plan note, in the report and on stderr); a field the mapping file names
  itself is an error instead (the user asked for it);
- stores an episode's cell as null (the field is missing in that episode) when every message of that
  episode holds a zero quaternion, noted;
- keeps zero quaternions among real ones as the bag holds them (noted with their count): validate and
  the export drop them as missing samples and count them ("zero quaternions (dropped)").

The plan's scan deserialises the topic's messages only until the first non-zero quaternion: one
message for a topic that has orientations, the whole topic (once) for one that never does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from robowds.export.convert.rosbag.mapping import StreamMap, field_getter
from robowds.export.convert.rosbag.source import Bag, damaged, open_bag
from robowds.export.core.resample import zero_quaternions
from robowds.export.errors import UserError

ValueOf = Callable[[Any], np.ndarray]  # a message -> its [N] values (the field's columns, in order)


def is_quaternion(stream: StreamMap) -> bool:
    """A time-series field interpolated by slerp (its 4 values a quaternion)."""
    return stream.kind == "timeseries" and dict(stream.declare).get("interpolation") == "slerp"


def values_of(stream: StreamMap) -> ValueOf:
    """The function that reads the field's values from one message."""
    getters = [field_getter(c.path) for c in stream.columns]
    return lambda msg: np.concatenate([np.ravel(np.asarray(g(msg), np.float64)) for g in getters])  # [N]


def zero_in_message(stream: StreamMap, msg: Any) -> bool:  # noqa: ANN401
    """True when the field's quaternion in `msg` has zero norm."""
    return bool(zero_quaternions(values_of(stream)(msg)[None, :])[0])


def any_rotation(bags: Sequence[Bag], topic: str, stream: StreamMap, typestore: str, skip_bad: bool) -> bool:
    """Whether any message of `topic` in `bags` (in order) holds a non-zero quaternion in `stream`'s
    columns; reads until the first one. A bag that cannot be read stops the plan, or with `skip_bad`
    is passed over (its episode fails again, and is skipped, when it is converted)."""
    value = values_of(stream)
    for bag in bags:
        try:
            with open_bag(bag.path, typestore) as reader:
                if _rotation_in(reader, topic, value, bag.path):
                    return True
        except UserError:
            if not skip_bad:
                raise
    return False


def _rotation_in(reader: Any, topic: str, value: ValueOf, path: Path) -> bool:  # noqa: ANN401
    conns = [c for c in reader.connections if c.topic == topic]
    if not conns:
        return False
    try:
        for conn, _, raw in reader.messages(conns):
            if not zero_quaternions(value(reader.deserialize(raw, conn.msgtype))[None, :])[0]:
                return True
    except Exception as exc:  # noqa: BLE001 (a damaged chunk raises many kinds)
        raise damaged(path, exc, topic=topic) from exc
    return False


def left_out_note(topic: str, stream: StreamMap) -> str:
    """The plan note for a default field left out because the topic never holds a rotation."""
    paths = stream.columns[0].path.rpartition(".")[0] or stream.columns[0].path
    return (f"{topic}: {paths} is a zero-norm quaternion (0, 0, 0, 0) in every message (the driver publishes no "
            f"orientation): {stream.field} not converted")


def never_rotation(topic: str, name: str, where: str) -> UserError:
    """The error for a field the mapping names whose quaternion is zero in every message."""
    return UserError(f"{where}: topics.{topic}.fields.{name}: zero-norm quaternions (0, 0, 0, 0) in every message "
                     "of the topic: the source publishes no orientation",
                     hint=f"leave {name} out of the mapping (or map it without interpolation: slerp)")


def episode_quaternions(topic: str, field: str, values: np.ndarray) -> tuple[bool, list[str]]:
    """For one episode's quaternion field ([T, 4] values): (keep the cell, notes). All rows zero: the
    cell is null (missing in this episode); some rows zero: kept as the bag holds them, counted."""
    zero = zero_quaternions(values)  # [T]
    count = int(np.count_nonzero(zero))
    if count == len(values):
        return False, [f"{topic}: {field} is a zero-norm quaternion in all {count} messages (no orientation): "
                       "left empty in this episode"]
    if count:
        return True, [f"{topic}: {field} is a zero-norm quaternion in {count} of {len(values)} messages (no "
                      "orientation): validate and the export drop those as missing samples"]
    return True, []
