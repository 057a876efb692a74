"""Conversion throughput against the cost of reading the source alone, in one run (machines are noisy:
read the ratios, not the absolute rates).

    python scripts/bench_convert.py                 # all three parts
    python scripts/bench_convert.py --only ros      # lerobot | ros | media

(a) LeRobot: the vendored real G1 episodes (LeRobot v2.1) replicated into a temporary dataset of
    `--lerobot-episodes` episodes (Parquet files copied, videos symlinked to one copy of each in the
    dataset: the converter references videos, it never reads them), converted with `convert_lerobot`,
    against reading every episode's Parquet file with pyarrow (`pq.ParquetFile(path).read()`, the limit). Frames/s.
(b) ROS: `--ros-copies` links to the vendored Husky ROS 1 bag (and to its ROS 2 MCAP copy) in one
    folder, converted with `convert_rosbag`, against opening each bag with rosbags' AnyReader and
    deserialising every message (the limit). Messages/s.
    (a) and (b) run with 1 and 2 workers; the read-only baseline with 2 workers runs on the same
    process pool (robowds' executor), so both pay the same process start.
(c) Media: `mux_jpegs` on real JPEG frames (G1 camera frames, 640x480, encoded once with PyAV's MJPEG
    encoder, not timed) against writing the same bytes to a file; `encode_frames` FFV1 at 640x480 on
    real G1 frames. Frames/s and MB/s, reported separately.

Each figure is the best of `--repeats` runs, the read-only and the conversion runs taken in turns so that
both meet the same load on a shared machine; with 1 worker the CPU-time ratio (this process does all
the work) is printed too, steadier than wall time when other jobs share the cores.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import numpy as np

import benchlib

ROOT = Path(__file__).resolve().parents[1]
G1 = ROOT / "tests" / "data" / "real" / "unitree_g1_lerobot_v2.1_real"
HUSKY = ROOT / "tests" / "data" / "real" / "rosbag1_real_clearpath_imu_odom_gps"
G1_EPISODES = {1: 393, 2: 343}  # the vendored episodes and their frame counts


def best(fn: Callable[[], Any], repeats: int) -> float:
    """The fastest of `repeats` runs of fn, in seconds."""
    return benchlib.timed(fn, repeats).best


def race(read: Callable[[], Any], convert: Callable[[Path], Any], store: Path,
         repeats: int) -> tuple[float, float, float, float]:
    """(read, convert) wall seconds, then (read, convert) CPU seconds of this process, each the best of
    `repeats` runs taken in turns (read, convert, read, ...), so both meet the same machine load. Each
    conversion writes a new store; the previous one is deleted outside the timing."""
    wall: dict[int, list[float]] = {0: [], 1: []}
    cpu: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(repeats):
        shutil.rmtree(store, ignore_errors=True)
        for k, fn in enumerate((read, lambda: convert(store))):
            began, began_cpu = time.perf_counter(), time.process_time()
            fn()
            wall[k].append(time.perf_counter() - began)
            cpu[k].append(time.process_time() - began_cpu)
    shutil.rmtree(store, ignore_errors=True)
    return min(wall[0]), min(wall[1]), min(cpu[0]), min(cpu[1])


def line(workers: int, unit: str, count: int, read: float, conv: float, read_cpu: float, conv_cpu: float) -> str:
    text = (f"    workers={workers}: read-only {count / read:>9,.0f} {unit}/s ({read:.2f} s)   convert "
            f"{count / conv:>9,.0f} {unit}/s ({conv:.2f} s)   ratio {read / conv:.2f}")
    if workers == 1:  # in-process: this process's CPU time is all of it
        text += f"   (CPU time ratio {read_cpu / conv_cpu:.2f})"
    return text


def on_pool(fn: Callable[[Any], Any], items: list[Any], workers: int) -> None:
    """fn over items on robowds' executor (in-process for 1 worker), results in order."""
    from robowds.export.executors.executor import make_executor

    executor = make_executor(workers)
    try:
        for _ in executor.map_ordered(fn, iter(items)):
            pass
    finally:
        executor.close()


def read_parquet(path: Path) -> int:
    """One episode's Parquet file, every column (`ParquetFile.read`: `pq.read_table` costs ~4x as much
    per small file, in its dataset layer)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).read().num_rows


def read_bag(path: Path) -> int:
    """Every message of one bag deserialised with rosbags (what any ROS converter has to do)."""
    from rosbags.highlevel import AnyReader

    count = 0
    with AnyReader([path]) as reader:
        for conn, _, raw in reader.messages():
            reader.deserialize(raw, conn.msgtype)
            count += 1
    return count


def lerobot_dataset(root: Path, episodes: int) -> tuple[Path, list[Path], int]:
    """A LeRobot v2.1 dataset of `episodes` episodes, each a copy of vendored episode 1 or 2."""
    info = json.loads((G1 / "meta" / "info.json").read_text())
    info["total_episodes"] = episodes
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps(info))
    shutil.copy(G1 / "meta" / "tasks.jsonl", root / "meta" / "tasks.jsonl")
    lines, files, frames = [], [], 0
    key = "observation.images.cam_high"
    shared = root / "source_videos"  # the two real videos, once, inside the dataset: the converter refuses
    shared.mkdir()  # a video linked to a file outside the dataset folder (the store would not validate)
    for src in (1, 2):
        shutil.copy(G1 / "videos" / "chunk-000" / key / f"episode_{src:06d}.mp4", shared)
    for i in range(episodes):
        src = 1 + i % 2
        data = root / info["data_path"].format(episode_chunk=i // 1000, episode_index=i)
        video = root / info["video_path"].format(episode_chunk=i // 1000, episode_index=i, video_key=key)
        data.parent.mkdir(parents=True, exist_ok=True)
        video.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(G1 / "data" / "chunk-000" / f"episode_{src:06d}.parquet", data)
        video.symlink_to(shared / f"episode_{src:06d}.mp4")
        lines.append(json.dumps({"episode_index": i, "tasks": ["Pick up the yellow bottle on the table."],
                                 "length": G1_EPISODES[src]}))
        files.append(data)
        frames += G1_EPISODES[src]
    (root / "meta" / "episodes.jsonl").write_text("\n".join(lines) + "\n")
    return root, files, frames


def bench_lerobot(tmp: Path, episodes: int, repeats: int, report: benchlib.Report) -> None:
    from robowds.export.convert.lerobot import convert_lerobot

    src, files, frames = lerobot_dataset(tmp / "lerobot", episodes)
    print(f"(a) LeRobot v2.1: {episodes} episodes ({frames:,} frames) replicated from the vendored G1 episodes")
    for workers in (1, 2):
        def convert(store: Path) -> None:
            convert_lerobot(src, store, workers=workers)

        times = race(lambda: on_pool(read_parquet, files, workers), convert, tmp / "lerobot_store", repeats)
        print(line(workers, "frames", frames, *times))
        report.add(f"LeRobot v2.1 convert, workers={workers} (vs read-only)", frames / times[1], "frames/s",
                   baseline=frames / times[0])


def bench_ros(tmp: Path, copies: int, repeats: int, report: benchlib.Report) -> None:
    from robowds.export.convert.rosbag import convert_rosbag

    for name, source in (("ROS 1 bag (bz2 chunks)", HUSKY / "original" / "test1.bag"),
                         ("ROS 2 MCAP (zstd chunks)", HUSKY / "derived_ros2_mcap" / "test1")):
        folder = tmp / f"bags_{source.suffix or 'mcap'}"
        folder.mkdir()
        bags = []
        for k in range(copies):
            link = folder / (f"run_{k:02d}{source.suffix}")
            link.symlink_to(source, target_is_directory=source.is_dir())
            bags.append(link)
        messages = read_bag(source) * copies
        print(f"(b) {name}: {copies} links to the Husky recording ({messages:,} messages)")
        for workers in (1, 2):
            def convert(store: Path) -> None:
                convert_rosbag(folder, store, workers=workers)

            times = race(lambda: on_pool(read_bag, bags, workers), convert, tmp / "ros_store", repeats)
            print(line(workers, "msg", messages, *times))
            report.add(f"{name.split(' (')[0]} convert, workers={workers} (vs read-only)", messages / times[1],
                       "msg/s", baseline=messages / times[0])


def g1_frames(count: int) -> np.ndarray:
    """The first `count` frames of G1 episode 1 as RGB, [count, 480, 640, 3] uint8."""
    import av

    path = G1 / "videos" / "chunk-000" / "observation.images.cam_high" / "episode_000001.mp4"
    out = []
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            out.append(frame.to_ndarray(format="rgb24"))
            if len(out) == count:
                break
    return np.stack(out)


def bench_media(tmp: Path, count: int, repeats: int, report: benchlib.Report) -> None:
    import av

    from robowds.export.media.encode import encode_frames, mux_jpegs

    frames = g1_frames(count)  # [F, 480, 640, 3]
    context = av.CodecContext.create("mjpeg", "w")
    context.width, context.height, context.pix_fmt, context.time_base = 640, 480, "yuvj420p", Fraction(1, 30)
    jpegs = [b"".join(bytes(p) for p in context.encode(av.VideoFrame.from_ndarray(f, format="rgb24")
                                                       .reformat(format="yuvj420p"))) for f in frames]
    times = np.arange(count) / 30.0
    mb = sum(len(j) for j in jpegs) / 1e6

    def write_bytes() -> None:
        with (tmp / "jpegs.bin").open("wb") as f:
            for j in jpegs:
                f.write(j)

    def mux() -> None:
        mux_jpegs(jpegs, times, tmp / "mux.mkv", 640, 480)

    raw, muxed = best(write_bytes, repeats), best(mux, repeats)
    print(f"(c) MJPEG muxing: {count} real G1 frames as JPEG, 640x480, {mb:.1f} MB")
    print(f"    write the bytes  {count / raw:>10,.0f} frames/s ({mb / raw:,.0f} MB/s)")
    print(f"    mux_jpegs        {count / muxed:>10,.0f} frames/s ({mb / muxed:,.0f} MB/s)   ratio {raw / muxed:.2f}")
    n = min(count, 60)
    ffv1 = best(lambda: encode_frames(frames[:n], times[:n], tmp / "ffv1.mkv"), repeats)
    size = (tmp / "ffv1.mkv").stat().st_size / 1e6
    print(f"    FFV1 encode_frames 640x480: {n / ffv1:,.1f} frames/s ({n} frames, {size:.1f} MB, "
          f"{frames[:n].nbytes / 1e6 / ffv1:.0f} MB/s of raw RGB)")
    report.add("MJPEG mux_jpegs (vs writing the bytes)", count / muxed, "frames/s", baseline=count / raw)
    report.add("FFV1 encode_frames 640x480", n / ffv1, "frames/s")


def main() -> None:
    parser = benchlib.parser(__doc__, repeats=5, quick={"lerobot_episodes": 2, "ros_copies": 1, "jpeg_frames": 10,
                                                        "repeats": 1})
    parser.add_argument("--only", choices=("lerobot", "ros", "media"), default=None)
    parser.add_argument("--lerobot-episodes", type=int, default=200)
    parser.add_argument("--ros-copies", type=int, default=4)
    parser.add_argument("--jpeg-frames", type=int, default=300)
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_convert", args)
    print(f"python {sys.version.split()[0]}, repeats {args.repeats} (best of)")
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "lerobot"):
            bench_lerobot(Path(tmp), args.lerobot_episodes, args.repeats, report)
        if args.only in (None, "ros"):
            bench_ros(Path(tmp), args.ros_copies, args.repeats, report)
        if args.only in (None, "media"):
            bench_media(Path(tmp), args.jpeg_frames, args.repeats, report)
    report.finish()


if __name__ == "__main__":
    main()
