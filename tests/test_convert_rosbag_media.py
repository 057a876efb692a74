"""`robowds convert rosbag` on camera and joint topics: a ROS 1 bag and a ROS 2 MCAP bag written here
with rosbags, holding real G1 camera frames (downscaled to 64x48) as CompressedImage JPEG and as raw
Image rgb8 / bgr8 / mono8, plus JointState messages (one listing the joints in another order, one with
an empty velocity). Exported frames equal PyAV's decode of the source JPEGs and the raw arrays, bit for
bit; a folder of both bags gives the same store bytes (media included) with 1 and 2 workers."""

from __future__ import annotations

import json
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

from robowds.export.cli.main import main
from robowds.export.convert.rosbag.media import jpeg_size, raw_rgb

from exports import export_members, npy
from realdata import G1, real_path
from videos import to_rgb

FRAMES = 12
T0_NS = 1_700_000_000_123_456_789  # header stamp of frame 0; frame k at +100 ms, received 5 ms later
JOINTS = ("hip", "knee", "ankle")


@lru_cache(maxsize=1)
def frames() -> np.ndarray:
    """The first 12 real G1 camera frames, 64x48 RGB: [12, 48, 64, 3] uint8."""
    path = real_path(G1, "videos", "chunk-000", "observation.images.cam_high", "episode_000001.mp4")
    with av.open(str(path)) as container:
        decoded = []
        for frame in container.decode(video=0):
            decoded.append(frame)
            if len(decoded) == FRAMES:
                break
        return np.ascontiguousarray(to_rgb(decoded)[:, ::10, ::10])


@lru_cache(maxsize=1)
def jpegs() -> tuple[bytes, ...]:
    """The frames as JPEG files (PyAV's MJPEG encoder)."""
    context = av.CodecContext.create("mjpeg", "w")
    context.width, context.height, context.pix_fmt = 64, 48, "yuvj420p"
    context.time_base = Fraction(1, 10)
    out = []
    for image in frames():
        frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuvj420p")
        out.append(b"".join(bytes(p) for p in context.encode(frame)))
    return tuple(out)


def messages(store) -> list[tuple[str, str, int, object]]:  # noqa: ANN001 (a rosbags typestore)
    """(topic, type, receive ns, message) of the test bag, in receive order."""
    T = store.types
    out = []
    for k in range(FRAMES):
        stamp_ns = T0_NS + k * 100_000_000
        stamp = T["builtin_interfaces/msg/Time"](sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9)
        header = T["std_msgs/msg/Header"](**({"seq": k} if "seq" in T["std_msgs/msg/Header"].__dataclass_fields__ else {}),
                                          stamp=stamp, frame_id="/camera")
        image = frames()[k]
        gray = image.mean(axis=2).astype(np.uint8)  # [48, 64]
        raw = {"rgb8": image, "bgr8": image[..., ::-1], "mono8": gray}
        for topic, enc in (("/cam/image_raw", "rgb8"), ("/bgr_cam/image_raw", "bgr8"), ("/mono_cam/image_raw", "mono8")):
            data = np.ascontiguousarray(raw[enc]).reshape(-1)
            msg = T["sensor_msgs/msg/Image"](header=header, height=48, width=64, encoding=enc, is_bigendian=0,
                                             step=len(data) // 48, data=data)
            out.append((topic, "sensor_msgs/msg/Image", stamp_ns + 5_000_000, msg))
        jpeg = T["sensor_msgs/msg/CompressedImage"](header=header, format="jpeg",
                                                    data=np.frombuffer(jpegs()[k], np.uint8))
        out.append(("/cam/image_raw/compressed", "sensor_msgs/msg/CompressedImage", stamp_ns + 5_000_000, jpeg))
        names, position = list(JOINTS), np.array([0.1, 0.2, 0.3]) + k
        velocity = np.array([1.0, 2.0, 3.0]) * k
        if k == 4:  # another order: reordered by name
            names, position, velocity = names[::-1], position[::-1].copy(), velocity[::-1].copy()
        if k == 7:  # no velocity in this message: a missing sample
            velocity = np.zeros(0)
        joint = T["sensor_msgs/msg/JointState"](header=header, name=names, position=position, velocity=velocity,
                                                effort=np.zeros(0))
        out.append(("/joint_states", "sensor_msgs/msg/JointState", stamp_ns + 5_000_000, joint))
    return out


def ros1_bag(path: Path) -> Path:
    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS1_NOETIC)
    with Writer(path) as writer:
        conns = {}
        for topic, msgtype, receive, msg in messages(store):
            if topic not in conns:
                conns[topic] = writer.add_connection(topic, msgtype, typestore=store)
            writer.write(conns[topic], receive, store.serialize_ros1(msg, msgtype))
    return path


def ros2_bag(path: Path) -> Path:
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_HUMBLE)
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        conns = {}
        for topic, msgtype, receive, msg in messages(store):
            if topic not in conns:
                conns[topic] = writer.add_connection(topic, msgtype, typestore=store)
            writer.write(conns[topic], receive, store.serialize_cdr(msg, msgtype))
    return path


@pytest.fixture(scope="module")
def bags(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bags") / "bags"
    root.mkdir()
    ros1_bag(root / "cams.bag")
    ros2_bag(root / "cams_mcap")
    return root


@pytest.fixture(scope="module")
def stores(bags: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The folder of both bags converted by 1 and by 2 workers."""
    root = tmp_path_factory.mktemp("stores")
    for workers in ("1", "2"):
        assert main(["convert", "rosbag", str(bags), str(root / f"w{workers}"), "--quiet", "--workers", workers]) == 0
    return [root / "w1", root / "w2"]


VIDEOS = {"cam_image_raw_compressed": "jpeg", "cam_image_raw": "rgb8", "bgr_cam": "bgr8", "mono_cam": "mono8"}


def test_the_store_lists_videos_and_joints_and_is_the_same_for_1_and_2_workers(stores: list[Path]) -> None:
    one, two = stores
    report = json.loads((one / "convert_report.json").read_text())
    assert report["episodes"] == 2 and report["ros"] == ["ROS 1", "ROS 2"]
    assert {f: v["kind"] for f, v in report["fields"].items()} == {
        **{f: "video" for f in VIDEOS}, "joint_states_position": "timeseries", "joint_states_velocity": "timeseries"}
    assert report["plan_notes"] == ["/joint_states: effort is empty in the first message: not converted"]
    files = sorted(p.relative_to(one).as_posix() for p in one.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(two).as_posix() for p in two.rglob("*") if p.is_file())
    assert len([f for f in files if f.startswith("media/")]) == 8  # 4 cameras x 2 bags
    for name in files:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    rows = {r["episode_id"]: r for r in pq.read_table(one / "episodes.parquet").to_pylist()}
    assert sorted(rows) == ["cams", "cams_mcap"]
    for row in rows.values():
        video = row["cam_image_raw_compressed"]
        assert video["path"] == f"media/cam_image_raw_compressed/{row['episode_id']}.mkv"
        assert video["clock_offset_s"] == T0_NS // 10**9 + (T0_NS % 10**9) / 1e9 and abs(video["fps"] - 10) < 1e-6
        joints = row["joint_states_position"]
        np.testing.assert_array_equal(joints["v"], np.array([0.1, 0.2, 0.3]) + np.arange(FRAMES)[:, None])
        velocity = np.array(row["joint_states_velocity"]["v"], dtype=float)
        assert np.isnan(velocity[7]).all()
        np.testing.assert_array_equal(np.delete(velocity, 7, axis=0),
                                      np.delete(np.array([1.0, 2.0, 3.0]) * np.arange(FRAMES)[:, None], 7, axis=0))
    assert "joint_states_position: {\"names\": [\"hip\", \"knee\", \"ankle\"]}" in (one / "store.yaml").read_text()


def test_exported_frames_equal_the_source_frames_bit_for_bit(stores: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    raw = [a for f in VIDEOS for a in ("--set", f"streams.{f}.encoding=raw")]
    assert main(["export", str(stores[0]), str(out), "--quiet", "--workers", "1", "--fps", "10", "--keep-order",
                 "--set", "window.duration_s=0.1", "--set", "window.rate_hz=10", "--set", "shard.min_shards=1",
                 *raw]) == 0
    samples = export_members(out)
    decoder = av.CodecContext.create("mjpeg", "r")
    decoded = to_rgb([f for data in jpegs() for f in decoder.decode(av.Packet(data))])  # the source JPEGs' decode
    gray = frames().mean(axis=3).astype(np.uint8)
    want = {"jpeg": decoded, "rgb8": frames(), "bgr8": frames(), "mono8": np.repeat(gray[..., None], 3, axis=3)}
    for episode in ("cams", "cams_mcap"):
        keys = sorted(k for k in samples if k.startswith(episode + "_0"))
        assert len(keys) == FRAMES
        for k, key in enumerate(keys):
            for field, encoding in VIDEOS.items():
                frame = npy(samples[key][f"{field}.npy"])[0]  # [48, 64, 3]
                assert npy(samples[key][f"{field}_mask.npy"]).all()
                np.testing.assert_array_equal(frame, want[encoding][k], err_msg=f"{episode} {field} {k}")
            np.testing.assert_array_equal(npy(samples[key]["joint_states_position.npy"])[0],
                                          (np.array([0.1, 0.2, 0.3]) + k).astype(np.float32))


def test_an_encoding_it_cannot_convert_names_topic_and_episode(bags: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS1_NOETIC)
    T = store.types
    with Writer(tmp_path / "depth.bag") as writer:
        conn = writer.add_connection("/cam/image_raw", "sensor_msgs/msg/Image", typestore=store)
        header = T["std_msgs/msg/Header"](seq=0, stamp=T["builtin_interfaces/msg/Time"](sec=1, nanosec=0), frame_id="d")
        msg = T["sensor_msgs/msg/Image"](header=header, height=2, width=2, encoding="16UC1", is_bigendian=0, step=4,
                                         data=np.zeros(8, np.uint8))
        writer.write(conn, 10**9, store.serialize_ros1(msg, "sensor_msgs/msg/Image"))
    assert main(["convert", "rosbag", str(tmp_path / "depth.bag"), str(tmp_path / "store"), "--quiet",
                 "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "episode 'depth'" in err and "topic /cam/image_raw" in err and "'16UC1' is not one of" in err, err
    assert "fix: " in err and "Traceback" not in err and not (tmp_path / "store").exists()
    assert not list(tmp_path.glob(".store.converting-*"))  # the spool went with the work folder
    folder = tmp_path / "bags"  # next to a good bag: --skip-bad publishes the good one, and no spool of the bad one
    folder.mkdir()
    (tmp_path / "depth.bag").rename(folder / "depth.bag")
    (folder / "cams.bag").write_bytes((bags / "cams.bag").read_bytes())
    assert main(["convert", "rosbag", str(folder), str(tmp_path / "store"), "--quiet", "--workers", "1",
                 "--skip-bad"]) == 0
    assert "skipped 1" in capsys.readouterr().out
    assert [r["episode_id"] for r in pq.read_table(tmp_path / "store" / "episodes.parquet").to_pylist()] == ["cams"]
    files = sorted(p.relative_to(tmp_path / "store").as_posix() for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert files == ["convert_report.json", "episodes.parquet", *sorted(f"media/{f}/cams.mkv" for f in VIDEOS),
                     "store.yaml"], files


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4000), st.integers(1, 4000), st.binary(max_size=40))
def test_jpeg_size_reads_the_frame_header_past_any_other_segment(width: int, height: int, comment: bytes) -> None:
    com = b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment  # a COM segment before the frame header
    sof = b"\xff\xc0\x00\x11\x08" + height.to_bytes(2, "big") + width.to_bytes(2, "big") + bytes(12)
    assert jpeg_size(b"\xff\xd8" + com + sof + b"\xff\xd9") == (width, height)


def test_jpeg_size_of_a_real_jpeg_and_raw_layouts_with_row_padding() -> None:
    assert jpeg_size(jpegs()[0]) == (64, 48)
    with pytest.raises(ValueError, match="not a JPEG"):
        jpeg_size(b"\x89PNG\r\n\x1a\n")
    image = frames()[0][:5, :7]  # [5, 7, 3]
    padded = np.zeros((5, 7 * 3 + 3), np.uint8)  # step 24 > 21: rows padded, as some drivers send them
    padded[:, :21] = image[..., ::-1].reshape(5, 21)
    np.testing.assert_array_equal(raw_rgb("bgr8", 5, 7, 24, padded.reshape(-1)), image)
    with pytest.raises(ValueError, match="needs 120 bytes"):
        raw_rgb("rgb8", 5, 7, 24, padded.reshape(-1)[:100])


def test_a_type_without_header_and_unset_stamps_use_receive_times(tmp_path: Path) -> None:
    """geometry_msgs/Twist has no header: receive times, said in the report; an Imu publisher that never
    set its stamps (all zero): receive times for that episode, noted."""
    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS1_NOETIC)
    T = store.types
    receive = [T0_NS + k * 50_000_000 for k in range(6)]
    with Writer(tmp_path / "cmd.bag") as writer:
        twist = writer.add_connection("/cmd_vel", "geometry_msgs/msg/Twist", typestore=store)
        imu = writer.add_connection("/imu", "sensor_msgs/msg/Imu", typestore=store)
        vec = T["geometry_msgs/msg/Vector3"]
        for k, ns in enumerate(receive):
            msg = T["geometry_msgs/msg/Twist"](linear=vec(x=0.1 * k, y=0.0, z=0.0), angular=vec(x=0.0, y=0.0, z=-k))
            writer.write(twist, ns, store.serialize_ros1(msg, "geometry_msgs/msg/Twist"))
            header = T["std_msgs/msg/Header"](seq=k, stamp=T["builtin_interfaces/msg/Time"](sec=0, nanosec=0), frame_id="")
            m = T["sensor_msgs/msg/Imu"](header=header, orientation=T["geometry_msgs/msg/Quaternion"](x=0, y=0, z=0, w=1),
                                         orientation_covariance=np.zeros(9), angular_velocity=vec(x=k, y=0, z=0),
                                         angular_velocity_covariance=np.zeros(9), linear_acceleration=vec(x=0, y=0, z=9.8),
                                         linear_acceleration_covariance=np.zeros(9))
            writer.write(imu, ns + 1_000_000, store.serialize_ros1(m, "sensor_msgs/msg/Imu"))
    mapping = tmp_path / "m.yaml"
    mapping.write_text("topics:\n  /cmd_vel:\n    fields:\n      cmd: {paths: [linear.x, angular.z], names: [v, w]}\n"
                       "  /imu: {name: imu}\n")
    out = tmp_path / "store"
    assert main(["convert", "rosbag", str(tmp_path / "cmd.bag"), str(out), "--quiet", "--workers", "1",
                 "--mapping", str(mapping)]) == 0
    report = json.loads((out / "convert_report.json").read_text())
    assert report["topics"]["/cmd_vel"]["time"] == "receive (the type has no header)"
    assert report["notes"] == ["episode cmd: /imu: every header stamp is zero; receive times used"]
    row = pq.read_table(out / "episodes.parquet").to_pylist()[0]
    seconds = [ns // 10**9 + (ns % 10**9) / 1e9 for ns in receive]
    assert row["cmd"]["t"] == seconds and row["cmd"]["v"] == [[0.1 * k, -k] for k in range(6)]
    assert row["imu_angular_velocity"]["t"] == [(ns + 10**6) // 10**9 + ((ns + 10**6) % 10**9) / 1e9 for ns in receive]
