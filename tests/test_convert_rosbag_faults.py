"""`robowds convert rosbag` on bags as IMU drivers and other nodes leave them, written here with rosbags'
own writers (ROS 1 and ROS 2 MCAP): an IMU that publishes no orientation (every quaternion (0, 0, 0, 0),
as phidgets' `/imu/data_raw`), a filter whose orientation is zero until it converges, and bags of
message types without a default mapping only. Each gives a store that validates, or one message that
names the cause (zero-norm quaternions, the topics and their types) and the fix (`--mapping`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.main import main
from robowds.export.core.resample import RawSeries, StreamError, clean_stream

T0_NS = 1_700_000_000_000_000_000  # header stamp of message 0; message k at +10 ms, received 1 us later
N = 20
ZERO = (0.0, 0.0, 0.0, 0.0)
LEVEL = (0.0, 0.0, 0.0, 1.0)
NO_ORIENTATION = ("/imu/data_raw: orientation is a zero-norm quaternion (0, 0, 0, 0) in every message (the driver "
                  "publishes no orientation): data_raw_orientation not converted")
ZERO_HINT = ("these quaternions hold no orientation: drop the field with exclude (or convert the source without it), "
             "or store real orientations")
Message = tuple[str, str, int, Any]  # topic, type, receive ns, message


def stamp_ns(k: int) -> int:
    """Header stamp of message k: a 1 s pause after message 9 (two episodes with --split-gap 0.5)."""
    return T0_NS + k * 10_000_000 + (1_000_000_000 if k >= 10 else 0)


def header(T: Any, k: int) -> Any:  # noqa: ANN401 (rosbags types)
    ns = stamp_ns(k)
    seq = {"seq": k} if "seq" in T["std_msgs/msg/Header"].__dataclass_fields__ else {}
    return T["std_msgs/msg/Header"](**seq, stamp=T["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9),
                                    frame_id="imu_link")


def imu(T: Any, k: int, quaternion: tuple[float, ...]) -> Any:  # noqa: ANN401
    """An Imu message: the given orientation, covariances all zero (not -1: the driver does not say it
    gives no orientation), angular velocity (0.1k, -0.2k, 0.3), acceleration (0, 0, 9.81)."""
    V, Q = T["geometry_msgs/msg/Vector3"], T["geometry_msgs/msg/Quaternion"]
    return T["sensor_msgs/msg/Imu"](
        header=header(T, k), orientation=Q(*quaternion), orientation_covariance=np.zeros(9),
        angular_velocity=V(x=0.1 * k, y=-0.2 * k, z=0.3), angular_velocity_covariance=np.zeros(9),
        linear_acceleration=V(x=0.0, y=0.0, z=9.81), linear_acceleration_covariance=np.zeros(9))


def filtered(k: int) -> tuple[float, ...]:
    """A filter's orientation: zero while it converges (messages 3 and 4), a yaw of 0.01k rad after."""
    return ZERO if k in (3, 4) else (0.0, 0.0, float(np.sin(0.005 * k)), float(np.cos(0.005 * k)))


def imu_messages(T: Any) -> list[Message]:  # noqa: ANN401
    """/imu/data_raw: no orientation at all; /imu/data: zero at messages 3 and 4; /chatter: strings."""
    out = []
    for k in range(N):
        out.append(("/imu/data_raw", "sensor_msgs/msg/Imu", stamp_ns(k) + 1000, imu(T, k, ZERO)))
        out.append(("/imu/data", "sensor_msgs/msg/Imu", stamp_ns(k) + 2000, imu(T, k, filtered(k))))
        out.append(("/chatter", "std_msgs/msg/String", stamp_ns(k) + 3000, T["std_msgs/msg/String"](data=f"tick {k}")))
    return out


def unsupported_messages(T: Any) -> list[Message]:  # noqa: ANN401
    """Strings and a two-point cloud: types without a default mapping."""
    field = T["sensor_msgs/msg/PointField"]
    xyz = [field(name=n, offset=4 * i, datatype=7, count=1) for i, n in enumerate("xyz")]  # 7: FLOAT32
    out = []
    for k in range(N):
        cloud = T["sensor_msgs/msg/PointCloud2"](header=header(T, k), height=1, width=2 + k % 2, fields=xyz,
                                                 is_bigendian=False, point_step=12, row_step=12 * (2 + k % 2),
                                                 data=np.zeros(12 * (2 + k % 2), np.uint8), is_dense=True)
        out.append(("/points", "sensor_msgs/msg/PointCloud2", stamp_ns(k) + 1000, cloud))
        out.append(("/chatter", "std_msgs/msg/String", stamp_ns(k) + 2000, T["std_msgs/msg/String"](data=f"tick {k}")))
    return out


def write_bag(path: Path, messages: Callable[[Any], list[Message]]) -> Path:
    """A ROS 1 bag (`.bag`) or a ROS 2 MCAP bag folder (any other name) of `messages(types)`."""
    from rosbags.typesys import Stores, get_typestore

    if path.suffix == ".bag":
        from rosbags.rosbag1 import Writer

        store = get_typestore(Stores.ROS1_NOETIC)
        writer, serialize = Writer(path), store.serialize_ros1
    else:
        from rosbags.rosbag2 import StoragePlugin, Writer

        store = get_typestore(Stores.ROS2_HUMBLE)
        writer, serialize = Writer(path, version=9, storage_plugin=StoragePlugin.MCAP), store.serialize_cdr
    with writer:
        conns = {}
        for topic, msgtype, receive, msg in messages(store.types):
            if topic not in conns:
                conns[topic] = writer.add_connection(topic, msgtype, typestore=store)
            writer.write(conns[topic], receive, serialize(msg, msgtype))
    return path


def columns(store: Path) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray] | None]]:
    """episode -> field -> (t [T], v [T, N]) as the store holds them (None: a null cell)."""
    out = {}
    for row in pq.read_table(store / "episodes.parquet").to_pylist():
        out[row.pop("episode_id")] = {k: None if v is None else (np.array(v["t"]), np.array(v["v"]))
                                      for k, v in row.items() if v is None or (isinstance(v, dict) and "t" in v)}
    return out


def validate(store: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = main(["validate", str(store), "--json"])
    return code, json.loads(capsys.readouterr().out)


def problems(report: dict[str, Any]) -> list[tuple[str, str | None, str | None, str]]:
    return [(p["severity"], p["episode"], p["field"], p["message"]) for p in report["problems"]]


@pytest.fixture(scope="module", params=["ros1.bag", "ros2"])
def imu_bag(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_bag(tmp_path_factory.mktemp("imu") / request.param, imu_messages)


STAMPS = np.array([stamp_ns(k) // 10**9 + stamp_ns(k) % 10**9 / 1e9 for k in range(N)])  # [N] s, as stored


def test_an_imu_without_orientation_keeps_its_rates_and_leaves_the_zero_quaternions_out(
        imu_bag: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    assert main(["convert", "rosbag", str(imu_bag), str(store), "--quiet", "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert err == f"robowds convert: note: {NO_ORIENTATION}\n"
    report = json.loads((store / "convert_report.json").read_text())
    assert report["plan_notes"] == [NO_ORIENTATION]
    assert report["topics"]["/imu/data_raw"]["fields"] == ["data_raw_angular_velocity", "data_raw_linear_acceleration"]
    assert report["notes"] == [f"episode {imu_bag.stem}: /imu/data: imu_orientation is a zero-norm quaternion in 2 of "
                               "20 messages (no orientation): validate and the export drop those as missing samples"]
    assert report["unsupported_topics"] == {"/chatter": "std_msgs/msg/String"}
    episode = columns(store)[imu_bag.stem]
    assert sorted(episode) == ["data_raw_angular_velocity", "data_raw_linear_acceleration", "imu_angular_velocity",
                               "imu_linear_acceleration", "imu_orientation"]
    k = np.arange(N)
    np.testing.assert_array_equal(episode["data_raw_angular_velocity"][0], STAMPS)
    np.testing.assert_array_equal(episode["data_raw_angular_velocity"][1],
                                  np.column_stack([0.1 * k, -0.2 * k, np.full(N, 0.3)]))
    np.testing.assert_array_equal(episode["imu_orientation"][1], np.array([filtered(i) for i in k]))  # zeros kept
    code, checked = validate(store, capsys)
    assert code == 0 and checked["exportable"]
    assert problems(checked) == [("warning", imu_bag.stem, "imu_orientation", "2 zero quaternions (dropped)")]


def test_an_episode_whose_quaternions_are_all_zero_leaves_the_field_empty_there(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Split at the pause: /imu/data's zeros (messages 3, 4) fall in episode _000; /late's orientation
    is zero until the filter converges at message 10, so its first episode has none."""
    def messages(T: Any) -> list[Message]:  # noqa: ANN401
        return [("/late", "sensor_msgs/msg/Imu", stamp_ns(k) + 1000, imu(T, k, ZERO if k < 10 else LEVEL))
                for k in range(N)]

    bag = write_bag(tmp_path / "late.bag", messages)
    store = tmp_path / "store"
    assert main(["convert", "rosbag", str(bag), str(store), "--quiet", "--workers", "1", "--split-gap", "0.5"]) == 0
    assert capsys.readouterr().err == ""  # the topic has orientations: nothing left out at plan time
    report = json.loads((store / "convert_report.json").read_text())
    assert report["plan_notes"] == [] and report["notes"] == [
        "episode late_000: /late: late_orientation is a zero-norm quaternion in all 10 messages (no orientation): "
        "left empty in this episode"]
    episodes = columns(store)
    assert episodes["late_000"]["late_orientation"] is None
    np.testing.assert_array_equal(episodes["late_001"]["late_orientation"][1], np.tile(LEVEL, (10, 1)))
    np.testing.assert_array_equal(episodes["late_000"]["late_angular_velocity"][0], STAMPS[:10])
    code, checked = validate(store, capsys)
    assert code == 0 and [p[:3] for p in problems(checked)] == [("warning", "late_000", "late_orientation")]
    assert "not recorded in this episode" in checked["problems"][0]["message"]
    mapping = tmp_path / "mapping.yaml"  # the orientation alone: episode _000 has no value at all
    mapping.write_text("topics: {/late: {fields: {q: {paths: [orientation], interpolation: slerp, "
                       "quaternion_order: xyzw}}}}")
    assert main(["convert", "rosbag", str(bag), str(tmp_path / "q"), "--quiet", "--workers", "1", "--split-gap", "0.5",
                 "--mapping", str(mapping)]) == 2
    assert capsys.readouterr().err == (
        f"robowds convert: error: episode 'late_000': {bag}: no field has a value in this episode (episode late_000: "
        "/late: q is a zero-norm quaternion in all 10 messages (no orientation): left empty in this episode)\n"
        "  fix: map other fields with --mapping, or pass --skip-bad to leave the episode out\n")


def test_validate_names_zero_norm_quaternions_not_the_timestamps(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A filter that converged at its last message: the converter keeps the stream (it has one
    orientation), validate says why one sample is too few."""
    def messages(T: Any) -> list[Message]:  # noqa: ANN401
        return [("/imu", "sensor_msgs/msg/Imu", stamp_ns(k), imu(T, k, LEVEL if k == N - 1 else ZERO)) for k in range(N)]

    store = tmp_path / "store"
    assert main(["convert", "rosbag", str(write_bag(tmp_path / "b.bag", messages)), str(store), "--quiet",
                 "--workers", "1"]) == 0
    capsys.readouterr()
    code, checked = validate(store, capsys)
    assert code == 1 and problems(checked) == [
        ("error", "b", "imu_orientation", "too short: 1 valid sample(s), need >= 2; the other 19 of 20 rows are "
                                          "zero-norm quaternions (no orientation)")]
    assert checked["problems"][0]["hint"] == ZERO_HINT
    times = np.arange(4.0)  # [4] s
    with pytest.raises(StreamError) as caught:  # a store written by hand: no valid sample at all
        clean_stream(RawSeries(np.append(times, np.nan), np.zeros((5, 4))), "slerp")
    assert str(caught.value) == ("stream has no valid samples: 4 of 5 rows are zero-norm quaternions (no orientation: "
                                 "an IMU driver that publishes none sends zeros) (1 with a non-finite time dropped too)")
    assert caught.value.hint == ZERO_HINT


def test_a_mapped_quaternion_that_is_always_zero_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bag = write_bag(tmp_path / "imu.bag", imu_messages)
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text("topics:\n  /imu/data_raw:\n    fields:\n      q: {paths: [orientation], interpolation: slerp, "
                       "quaternion_order: xyzw}\n")
    assert main(["convert", "rosbag", str(bag), str(tmp_path / "store"), "--quiet", "--mapping", str(mapping)]) == 2
    assert capsys.readouterr().err == (
        f"robowds convert: error: {mapping}: topics./imu/data_raw.fields.q: zero-norm quaternions (0, 0, 0, 0) in every "
        "message of the topic: the source publishes no orientation\n"
        "  fix: leave q out of the mapping (or map it without interpolation: slerp)\n")
    assert not (tmp_path / "store").exists()


UNSUPPORTED = "/chatter (std_msgs/msg/String: no default mapping); /points (sensor_msgs/msg/PointCloud2: no default mapping)"
MAPPING_FIX = ("  fix: name the topics to convert and their fields (message paths) in a mapping file and pass it with "
               "--mapping FILE (docs/convert-rosbag.md, section 'Mapping file'); types converted without one: "
               "sensor_msgs/Imu, sensor_msgs/JointState, nav_msgs/Odometry, sensor_msgs/NavSatFix, sensor_msgs/Image, "
               "sensor_msgs/CompressedImage\n")


@pytest.mark.parametrize("name", ["ros1.bag", "ros2"])
def test_a_bag_of_unsupported_types_lists_them_and_points_to_mapping(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                     name: str) -> None:
    bag = write_bag(tmp_path / name, unsupported_messages)
    store = tmp_path / "store"
    assert main(["convert", "rosbag", str(bag), str(store), "--quiet", "--workers", "1"]) == 2
    assert capsys.readouterr().err == (f"robowds convert: error: {bag}: no topic to convert; the bag holds: "
                                       f"{UNSUPPORTED}\n{MAPPING_FIX}")
    assert not store.exists()
    mapping = tmp_path / "mapping.yaml"  # the fix: the cloud's size by path
    mapping.write_text("topics:\n  /points:\n    fields:\n      cloud_size: {paths: [width, height]}\n")
    assert main(["convert", "rosbag", str(bag), str(store), "--quiet", "--workers", "1", "--mapping", str(mapping)]) == 0
    size = columns(store)[bag.stem]["cloud_size"]
    np.testing.assert_array_equal(size[1], np.column_stack([2 + np.arange(N) % 2, np.ones(N)]))
    assert pq.read_schema(store / "episodes.parquet").field("cloud_size").type.field("v").type.value_type.value_type \
        == "uint32"  # the definition's dtype
    assert json.loads((store / "convert_report.json").read_text())["unsupported_topics"] == {
        "/chatter": "std_msgs/msg/String"}


def test_a_bag_without_the_converted_topics_lists_what_it_holds(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A folder: one bag with an IMU, one with strings and clouds only (its episode has none of the
    converted topics): the message names the bag's topics with their types, never a report."""
    folder = tmp_path / "bags"
    folder.mkdir()
    write_bag(folder / "a_imu.bag", imu_messages)
    other = write_bag(folder / "b_other.bag", unsupported_messages)
    store = tmp_path / "store"
    assert main(["convert", "rosbag", str(folder), str(store), "--quiet", "--workers", "1"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[-2:] == [
        f"robowds convert: error: episode 'b_other': {other} has no message on the converted topics (/imu/data, "
        "/imu/data_raw); it holds: /chatter (std_msgs/msg/String); /points (sensor_msgs/msg/PointCloud2)",
        "  fix: name the topics to convert with --mapping FILE (docs/convert-rosbag.md, section 'Mapping file'), "
        "convert this bag on its own, or pass --skip-bad to leave it out"]
    assert not store.exists()
    assert main(["convert", "rosbag", str(folder), str(store), "--quiet", "--workers", "1", "--skip-bad"]) == 0
    assert list(columns(store)) == ["a_imu"]
