"""`robowds convert rosbag` on the vendored real Clearpath Husky drive (a ROS 1 bag and its ROS 2 MCAP
copy): the stores hold exactly what rosbags reads from the bags, exported windows equal the source at
the grid times, header and receive clocks differ by the IMU's delay, the documented mapping converts,
bags cut by a pause split, and bad inputs are one clear message each (1 vs 2 workers, with videos:
test_convert_rosbag_media.py)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

from robowds.export.cli.main import main
from robowds.export.convert.rosbag.mapping import gap_segments, marker_segments, topic_prefixes, unique_field_names
from robowds.export.store.validate import validate_store

from exports import export_members, npy
from realdata import real_path
from reference import slerp

HUSKY = "rosbag1_real_clearpath_imu_odom_gps"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "convert-rosbag.md"
F32 = float(np.finfo(np.float32).eps)
STRIDE = 3  # every third of the 3954 grid points: all of them cost 10 s of npy decoding


def husky(*parts: str) -> Path:
    """A path inside the vendored Husky data (the folder itself when no parts)."""
    return real_path(HUSKY, *parts)


def bag1() -> Path:
    return husky("original", "test1.bag")


def mcap() -> Path:
    return husky("derived_ros2_mcap", "test1")


def seconds(sec: int, nanosec: int) -> float:
    return sec + nanosec / 1e9


@lru_cache(maxsize=1)
def source() -> dict[str, dict[str, np.ndarray]]:
    """Every message of the MCAP read with rosbags directly: per topic its header and receive times
    (float64 s) and the values of each default field, in bag order."""
    from rosbags.highlevel import AnyReader

    rows: dict[str, dict[str, list]] = {}
    with AnyReader([mcap()]) as reader:
        for conn, receive, raw in reader.messages():
            m = reader.deserialize(raw, conn.msgtype)
            r = rows.setdefault(conn.topic, {})
            r.setdefault("header", []).append(seconds(m.header.stamp.sec, m.header.stamp.nanosec))
            r.setdefault("receive", []).append(seconds(receive // 10**9, receive % 10**9))
            if conn.topic == "/imu/data":
                q, w, a = m.orientation, m.angular_velocity, m.linear_acceleration
                r.setdefault("imu_orientation", []).append([q.x, q.y, q.z, q.w])
                r.setdefault("imu_angular_velocity", []).append([w.x, w.y, w.z])
                r.setdefault("imu_linear_acceleration", []).append([a.x, a.y, a.z])
            elif conn.topic == "/husky_velocity_controller/odom":
                p, q, tw = m.pose.pose.position, m.pose.pose.orientation, m.twist.twist
                r.setdefault("odom_position", []).append([p.x, p.y, p.z])
                r.setdefault("odom_orientation", []).append([q.x, q.y, q.z, q.w])
                r.setdefault("odom_linear_velocity", []).append([tw.linear.x, tw.linear.y, tw.linear.z])
                r.setdefault("odom_angular_velocity", []).append([tw.angular.x, tw.angular.y, tw.angular.z])
            else:
                r.setdefault("fix_position", []).append([m.latitude, m.longitude, m.altitude])
                r.setdefault("fix_status", []).append([m.status.status, m.status.service])
                r.setdefault("cov", []).append(list(m.position_covariance))
    return {topic: {k: np.array(v) for k, v in r.items()} for topic, r in rows.items()}


TOPIC_OF = {"imu": "/imu/data", "odom": "/husky_velocity_controller/odom", "fix": "/fix"}


def expected(field: str) -> tuple[np.ndarray, np.ndarray]:
    """(header times [T], values [T, N]) of a default field, from the source."""
    topic = source()[TOPIC_OF[field.split("_")[0]]]
    return topic["header"], topic[field]


def store_columns(store: Path) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """episode -> field -> (t [T], v [T, N]) as the store holds them."""
    table = pq.read_table(store / "episodes.parquet")
    out = {}
    for row in table.to_pylist():
        out[row["episode_id"]] = {k: (np.array(v["t"]), np.array(v["v"])) for k, v in row.items()
                                  if isinstance(v, dict) and "t" in v}
    return out


def convert(src: Path, store: Path, *options: str) -> Path:
    assert main(["convert", "rosbag", str(src), str(store), "--quiet", "--workers", "1", *options]) == 0
    return store


@pytest.fixture(scope="module")
def ros1_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert(bag1(), tmp_path_factory.mktemp("ros1") / "store")


@pytest.fixture(scope="module")
def mcap_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert(mcap(), tmp_path_factory.mktemp("mcap") / "store")


def test_vendored_data_is_the_upstream_bytes_and_nothing_else() -> None:
    listed = dict(line.split("  ", 1)[::-1] for line in husky("SHA256SUMS").read_text().splitlines())
    assert len(listed) == 4 and "LICENSE.robot_localization" in listed
    for name, digest in listed.items():
        assert hashlib.sha256(husky(name).read_bytes()).hexdigest() == digest, name
    present = {p.relative_to(husky()).as_posix() for p in husky().rglob("*") if p.is_file()}
    assert present == set(listed) | {"SHA256SUMS", "PROVENANCE.md"}


def test_the_ros1_store_holds_exactly_what_rosbags_reads(ros1_store: Path) -> None:
    report = json.loads((ros1_store / "convert_report.json").read_text())
    assert (report["episodes"], report["ros"], report["time"], report["unsupported_topics"]) == (1, ["ROS 1"], "header", {})
    assert report["topics"]["/imu/data"] == {"type": "sensor_msgs/msg/Imu", "time": "header", "fields": [
        "imu_orientation", "imu_angular_velocity", "imu_linear_acceleration"]}
    columns = store_columns(ros1_store)["test1"]
    assert sorted(columns) == sorted(["imu_orientation", "imu_angular_velocity", "imu_linear_acceleration",
                                      "odom_position", "odom_orientation", "odom_linear_velocity",
                                      "odom_angular_velocity", "fix_position", "fix_status"])
    for field, (t, v) in columns.items():
        want_t, want_v = expected(field)
        np.testing.assert_array_equal(t, want_t, err_msg=field)  # float64 seconds, bit for bit
        np.testing.assert_array_equal(v, want_v, err_msg=field)  # float64 values; int8/uint16 status in int32
    assert pq.read_schema(ros1_store / "episodes.parquet").field("fix_status").type.field("v").type.value_type.value_type == "int32"
    schema = validate_store(ros1_store).schema
    assert schema.fields["imu_orientation"].names == ("x", "y", "z", "w")
    assert schema.fields["fix_position"].names == ("latitude", "longitude", "altitude")


def test_the_mcap_copy_gives_the_same_store_values(ros1_store: Path, mcap_store: Path) -> None:
    report = json.loads((mcap_store / "convert_report.json").read_text())
    assert report["ros"] == ["ROS 2"] and report["episodes"] == 1
    ros1, ros2 = store_columns(ros1_store)["test1"], store_columns(mcap_store)["test1"]
    assert sorted(ros1) == sorted(ros2)
    for field in ros1:
        np.testing.assert_array_equal(ros1[field][0], ros2[field][0], err_msg=field)
        np.testing.assert_array_equal(ros1[field][1], ros2[field][1], err_msg=field)
    assert (ros1_store / "store.yaml").read_text() == (mcap_store / "store.yaml").read_text()


def test_exported_windows_equal_the_source_at_the_grid_times(ros1_store: Path, tmp_path: Path) -> None:
    """10 Hz windows of one step: hold and nearest exact, linear within a float32 step of np.interp,
    slerp within 1e-6 of a reference slerp; masked exactly outside each stream's samples."""
    out = tmp_path / "out"
    assert main(["export", str(ros1_store), str(out), "--quiet", "--workers", "1", "--fps", "10", "--keep-order",
                 "--stride", str(STRIDE), "--set", "window.duration_s=0.1", "--set", "window.rate_hz=10",
                 "--set", "shard.min_shards=1", "--set", "streams.odom_position.interpolation=nearest",
                 "--set", "streams.fix_position.dtype=float64",
                 "--set", "include=[imu_angular_velocity, imu_orientation, odom_position, fix_position, fix_status]"]) == 0
    samples = export_members(out)
    start = min(expected(f)[0][0] for f in ("imu_orientation", "odom_position", "fix_position"))
    end = max(expected(f)[0][-1] for f in ("imu_orientation", "odom_position", "fix_position"))
    assert int((end - start) * 10) + 1 == 3954  # grid points over the 395.3 s drive
    anchors = np.arange(0, 3954, STRIDE)
    assert sorted(samples) == [f"test1_{k:06d}" for k in anchors]
    grid = anchors / 10.0  # relative to the episode start, as the export computes it
    got = {f: np.stack([npy(samples[f"test1_{k:06d}"][f"{f}.npy"])[0] for k in anchors])
           for f in ("imu_angular_velocity", "imu_orientation", "odom_position", "fix_position", "fix_status")}
    masks = {f: np.array([npy(samples[f"test1_{k:06d}"][f"{f}_mask.npy"])[0] for k in anchors]) for f in got}
    for field in got:
        t, v = expected(field)
        rel = t - start
        inside = (grid >= rel[0] - 1e-6) & (grid <= rel[-1] + 1e-6)
        np.testing.assert_array_equal(masks[field], inside, err_msg=field)
        q, out_v = grid[inside], got[field][inside]
        if field == "fix_status":  # hold: the last sample at or before q, int32 exact
            want = v[np.searchsorted(rel, q + 1e-9, side="right") - 1]
            assert out_v.dtype == np.int32
            np.testing.assert_array_equal(out_v, want)
        elif field == "odom_position":  # nearest, ties to the earlier
            i = np.clip(np.searchsorted(rel, q), 1, len(rel) - 1)
            pick = np.where(rel[i] - q < q - rel[i - 1], i, i - 1)
            np.testing.assert_array_equal(out_v, v[pick].astype(np.float32))
        elif field == "imu_orientation":  # slerp after normalising and fixing the hemisphere along the stream
            unit = v / np.linalg.norm(v, axis=1, keepdims=True)
            flips = np.concatenate([[1.0], np.sign(np.einsum("ij,ij->i", unit[1:], unit[:-1]))])
            unit = unit * np.cumprod(np.where(flips == 0, 1.0, flips))[:, None]
            i = np.clip(np.searchsorted(rel, q, side="right"), 1, len(rel) - 1)
            for row, k, qq in zip(out_v, i, q):
                ref = slerp(unit[k - 1], unit[k], (qq - rel[k - 1]) / (rel[k] - rel[k - 1]))
                np.testing.assert_allclose(row, ref, atol=1e-6)
        else:  # linear: np.interp of the source samples at the grid times
            want = np.stack([np.interp(q, rel, v[:, c]) for c in range(v.shape[1])], axis=1)
            if field == "fix_position":
                assert out_v.dtype == np.float64
                np.testing.assert_allclose(out_v, want, rtol=1e-12)
            else:
                np.testing.assert_allclose(out_v, want.astype(np.float32), rtol=F32, atol=1e-12)
    assert main(["verify", str(out), "--store", str(ros1_store), "--quiet"]) == 0


def test_receive_time_is_the_header_stamp_plus_the_imu_delay(ros1_store: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert main(["convert", "rosbag", str(mcap()), str(store), "--quiet", "--time", "receive",
                 "--mapping", str(_mapping(tmp_path, "topics: {/imu/data: {name: imu}}"))]) == 0
    report = json.loads((store / "convert_report.json").read_text())
    assert report["topics"]["/imu/data"]["time"] == "receive" and sorted(report["unsupported_topics"]) == [
        "/fix", "/husky_velocity_controller/odom"]  # present, not in the mapping: listed, not converted
    receive = store_columns(store)["test1"]
    header = store_columns(ros1_store)["test1"]
    assert sorted(receive) == ["imu_angular_velocity", "imu_linear_acceleration", "imu_orientation"]
    delay = receive["imu_orientation"][0] - header["imu_orientation"][0]  # [T] s
    np.testing.assert_array_equal(receive["imu_orientation"][0], source()["/imu/data"]["receive"])
    assert 0.020 < delay.min() and delay.max() < 0.037 and abs(np.median(delay) - 0.025) < 0.001
    np.testing.assert_array_equal(receive["imu_orientation"][1], header["imu_orientation"][1])  # same messages


def _mapping(root: Path, text: str) -> Path:
    path = root / "mapping.yaml"
    path.write_text(text)
    return path


def docs_mapping() -> str:
    """The YAML block of docs/convert-rosbag.md's section 'Mapping file'."""
    section = DOCS.read_text().split("## Mapping file", 1)[1]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def test_the_documented_mapping_converts_to_the_fields_it_names(tmp_path: Path) -> None:
    store = convert(mcap(), tmp_path / "store", "--mapping", str(_mapping(tmp_path, docs_mapping())))
    columns = store_columns(store)["test1"]
    assert sorted(columns) == sorted(["imu_orientation", "imu_angular_velocity", "imu_linear_acceleration", "base_xy",
                                      "base_orientation", "base_twist", "gps", "gps_status", "gps_covariance"])
    odom, fix = source()["/husky_velocity_controller/odom"], source()["/fix"]
    np.testing.assert_array_equal(columns["base_xy"][1], odom["odom_position"][:, :2])
    np.testing.assert_array_equal(columns["base_orientation"][1], odom["odom_orientation"])
    np.testing.assert_array_equal(columns["base_twist"][1], np.column_stack([odom["odom_linear_velocity"][:, 0],
                                                                             odom["odom_angular_velocity"][:, 2]]))
    np.testing.assert_array_equal(columns["gps"][1], fix["fix_position"])
    np.testing.assert_array_equal(columns["gps"][0], fix["receive"])  # `time: receive` on this topic
    np.testing.assert_array_equal(columns["gps_status"][1], fix["fix_status"][:, :1])
    np.testing.assert_array_equal(columns["gps_covariance"][1], fix["cov"])
    np.testing.assert_array_equal(columns["base_xy"][0], odom["header"])
    schema = validate_store(store).schema
    assert schema.fields["base_twist"].names == ("v", "omega") and schema.fields["base_orientation"].names == (
        "x", "y", "z", "w")
    assert schema.fields["gps_status"].interpolation == "hold"
    table = pq.read_schema(store / "episodes.parquet")
    assert table.field("gps_status").type.field("v").type.value_type.value_type == "int8"  # the definition's dtype


def paused_bag(path: Path) -> Path:
    """A ROS 1 bag of the real messages of the drive's first 14 s, those received in [6 s, 9 s) left
    out (a recorder paused), raw bytes copied; plus std_msgs/Empty markers on /episode_start at 3 s
    and 10 s."""
    from rosbags.highlevel import AnyReader
    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS1_NOETIC)
    with AnyReader([bag1()]) as reader, Writer(path) as writer:
        conns = {c.id: writer.add_connection(c.topic, c.msgtype, msgdef=c.msgdef.data, md5sum=c.digest)
                 for c in reader.connections}
        marker = writer.add_connection("/episode_start", "std_msgs/msg/Empty", typestore=store)
        t0 = reader.start_time
        for conn, t, raw in reader.messages(start=t0, stop=t0 + 14 * 10**9):
            if not 6 * 10**9 <= t - t0 < 9 * 10**9:
                writer.write(conns[conn.id], t, raw)
        for k in (3, 10):
            writer.write(marker, t0 + k * 10**9, store.serialize_ros1(store.types["std_msgs/msg/Empty"](),
                                                                      "std_msgs/msg/Empty"))
    return path


@pytest.fixture(scope="module")
def paused(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return paused_bag(tmp_path_factory.mktemp("paused") / "paused.bag")


@pytest.fixture(scope="module")
def split_by_gap(paused: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert(paused, tmp_path_factory.mktemp("gap") / "store", "--split-gap", "1")


def test_a_pause_splits_the_bag_by_gap_and_markers_split_it_by_topic(paused: Path, split_by_gap: Path,
                                                                      tmp_path: Path) -> None:
    t0 = source()["/imu/data"]["receive"][0]
    by_gap = store_columns(split_by_gap)
    assert sorted(by_gap) == ["paused_000", "paused_001"]
    imu = source()["/imu/data"]
    for episode, (lo, hi) in zip(sorted(by_gap), [(0, 6), (9, 14)]):
        keep = (imu["receive"] - t0 >= lo - 1e-6) & (imu["receive"] - t0 < hi)
        np.testing.assert_array_equal(by_gap[episode]["imu_orientation"][0], imu["header"][keep])
        np.testing.assert_array_equal(by_gap[episode]["imu_angular_velocity"][1], imu["imu_angular_velocity"][keep])
    report = json.loads((split_by_gap / "convert_report.json").read_text())
    assert report["split"] == {"gap_s": 1.0} and report["unsupported_topics"] == {"/episode_start": "std_msgs/msg/Empty"}
    by_topic = store_columns(convert(paused, tmp_path / "topic", "--split-topic", "/episode_start"))
    assert sorted(by_topic) == ["paused_000", "paused_001", "paused_002"]
    firsts = [by_topic[e]["imu_orientation"][0][0] for e in sorted(by_topic)]
    receive_of = dict(zip(imu["header"], imu["receive"]))
    assert [round(receive_of[f] - t0) for f in firsts] == [0, 3, 10]  # each marker starts an episode
    assert sum(len(by_topic[e]["odom_position"][0]) for e in by_topic) == sum(
        len(by_gap[e]["odom_position"][0]) for e in by_gap)  # every message in exactly one episode


@pytest.mark.parametrize("case,message", [
    ("not_a_bag", "is not a ROS bag"),
    ("garbage_bag", "cannot read the bag (AnyReaderError: File magic is invalid.)"),
    ("truncated", "cannot read the bag"),
    ("missing_topic", "topic(s) /joint_states are in no bag"),
    ("bad_path", "sensor_msgs/msg/Imu has no field 'orientation_cov'"),
    ("no_defaults", "which has no default mapping"),
])
def test_bad_inputs_are_one_clear_message(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str,
                                          message: str) -> None:
    src, extra = tmp_path / "test1.bag", []
    if case == "not_a_bag":
        src = tmp_path / "notes.txt"
        src.write_text("not a bag")
    elif case == "garbage_bag":
        src.write_bytes(b"#NOTABAG\n" + bytes(range(256)) * 10)
    elif case == "truncated":
        src.write_bytes(bag1().read_bytes()[: 900_000])
    else:
        shutil.copyfile(bag1(), src)
        text = {"missing_topic": "topics: {/imu/data: {}, /joint_states: {}}",
                "bad_path": "topics: {/imu/data: {fields: {cov: {paths: [orientation_cov]}}}}",
                "no_defaults": "topics: {/episode_start: {}}"}[case]
        if case == "no_defaults":
            src = paused_bag(tmp_path / "p.bag")
        extra = ["--mapping", str(_mapping(tmp_path, text))]
    assert main(["convert", "rosbag", str(src), str(tmp_path / "store"), "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("robowds convert: error: ") and message in err and "Traceback" not in err, err
    assert "fix: " in err and (str(tmp_path / "mapping.yaml") if extra else str(src)) in err
    assert not (tmp_path / "store").exists()


def test_a_damaged_chunk_names_the_episode_and_skip_bad_converts_the_others(paused: Path, tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "bags"
    folder.mkdir()
    shutil.copyfile(paused, folder / "a_good.bag")
    data = bytearray(paused.read_bytes())
    data[60_000:60_400] = bytes(400)  # inside the first bz2 chunk: the index still opens
    (folder / "b_damaged.bag").write_bytes(bytes(data))
    assert main(["convert", "rosbag", str(folder), str(tmp_path / "store"), "--quiet", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "episode 'b_damaged'" in err and "b_damaged.bag" in err and "cannot read the bag" in err, err
    assert "--skip-bad" in err and "Traceback" not in err and not (tmp_path / "store").exists()
    assert main(["convert", "rosbag", str(folder), str(tmp_path / "store"), "--quiet", "--workers", "1",
                 "--skip-bad"]) == 0
    out = capsys.readouterr().out
    assert "converted 1 episodes" in out and "skipped 1" in out and "b_damaged" in out
    report = json.loads((tmp_path / "store" / "convert_report.json").read_text())
    assert [s["episode"] for s in report["skipped"]] == ["episode b_damaged (" + str(folder / "b_damaged.bag") + ")"]
    assert list(store_columns(tmp_path / "store")) == ["a_good"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["imu", "data", "raw", "cam", "left", "odom", "image_raw", "x-y", "9"]),
                         min_size=1, max_size=4), min_size=1, max_size=6, unique_by=tuple))
def test_topic_prefixes_are_distinct_field_names(parts: list[list[str]]) -> None:
    topics = ["/" + "/".join(p) for p in parts]
    prefixes = topic_prefixes(topics)
    names = unique_field_names([f"{prefixes[t]}_position" for t in topics], set())
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[a-z][a-z0-9_]{0,31}", n) and not n.endswith("_mask") for n in names)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=60), st.integers(1, 10**5),
       st.lists(st.integers(0, 10**6), max_size=5))
def test_segments_partition_the_times(times: list[int], gap: int, markers: list[int]) -> None:
    t = np.sort(np.array(times, np.int64))
    for segments in (gap_segments(np.array(times), gap), marker_segments(np.array(times), np.array(markers, np.int64))):
        owner = [sum(1 for a, b in segments if a <= x <= b) for x in t]
        assert owner == [1] * len(t)  # every time in exactly one segment
        assert all(b1 < a2 for (_, b1), (a2, _) in zip(segments, segments[1:]))  # ordered, disjoint
    cuts = gap_segments(np.array(times), gap)
    for a, b in cuts:  # inside a segment no step exceeds the gap; between segments every step does
        inside = t[(t >= a) & (t <= b)]
        assert np.all(np.diff(inside) <= gap)
    assert all(a2 - b1 > gap for (_, b1), (a2, _) in zip(cuts, cuts[1:]))
    split = marker_segments(np.array(times), np.array(markers, np.int64))
    for (_, b1), (a2, _) in zip(split, split[1:]):
        assert any(b1 < m <= a2 for m in markers)  # a marker between consecutive episodes starts the later
