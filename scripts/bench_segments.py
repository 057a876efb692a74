"""Episodes as segments of one long video (LeRobot v3 stores many episodes per mp4) against the same
episodes as one file each: export time per episode, in one run.

Baseline: one file per episode (each decode starts at its episode). Ours: every episode a segment
`[start_s, end_s)` of one concatenated file. Without seeking, the k-th segment's export decodes the
k-1 segments before it, so the time per episode grows with the file's length (quadratic in total);
with a seek to the keyframe before the segment it stays flat. The files are H.264 with a keyframe
every `--gop` frames (LeRobot encodes with g=2; ffmpeg's default is 250).

    python scripts/bench_segments.py [--episodes 40] [--frames 150] [--gop 30]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import benchlib

VIDEO = pa.struct([("path", pa.string()), ("fps", pa.float64()), ("start_s", pa.float64()), ("end_s", pa.float64())])
FPS = 30


def frames(count: int, first: int, width: int = 320, height: int = 240) -> np.ndarray:
    """[count, H, W, 3] uint8: a moving gradient, so the encoder has real work."""
    ys, xs = np.mgrid[0:height, 0:width]  # [H, W]
    t = np.arange(first, first + count)[:, None, None]  # [count, 1, 1]
    out = np.empty((count, height, width, 3), dtype=np.uint8)
    out[..., 0] = (xs + 3 * t) % 256
    out[..., 1] = (ys + 2 * t) % 256
    out[..., 2] = (xs + ys + t) % 256
    return out


def encode(path: Path, episodes: list[np.ndarray], gop: int) -> None:
    """One H.264 mp4 of these frame arrays, back to back (frame k at k / FPS s)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=FPS, options={"g": str(gop), "preset": "veryfast"})
        stream.width, stream.height, stream.pix_fmt = episodes[0].shape[2], episodes[0].shape[1], "yuv420p"
        k = 0
        for images in episodes:
            for image in images:
                frame = av.VideoFrame.from_ndarray(image, format="rgb24")
                frame.pts, frame.time_base = k, Fraction(1, FPS)
                k += 1
                for packet in stream.encode(frame):
                    container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def write_store(root: Path, count: int, length: int, gop: int, segments: bool) -> None:
    clips = [frames(length, e * length) for e in range(count)]
    rows = []
    if segments:
        encode(root / "media" / "all.mp4", clips, gop)
    for e, clip in enumerate(clips):
        t = np.arange(length) / FPS
        name = f"episode_{e:04d}"
        if segments:
            cam = {"path": "media/all.mp4", "fps": float(FPS), "start_s": e * length / FPS,
                   "end_s": (e + 1) * length / FPS}
        else:
            encode(root / "media" / f"{name}.mp4", [clip], gop)
            cam = {"path": f"media/{name}.mp4", "fps": float(FPS), "start_s": None, "end_s": None}
        rows.append({"episode_id": name, "state": np.column_stack([t, np.sin(t)]).tolist(), "cam": cam})
    schema = pa.schema([("episode_id", pa.string()), ("state", pa.list_(pa.list_(pa.float64()))), ("cam", VIDEO)])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), root / "episodes.parquet")


def export_s(store: Path, out: Path) -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "robowds.export", str(store), str(out), "--quiet", "--workers", "1",
                    "--set", "fps=10", "--set", "streams.cam.resize=[112, 84]", "--set", "streams.cam.rate_hz=10",
                    "--set", "streams.cam.duration_s=0.2"], check=True)
    return time.perf_counter() - began


def main() -> None:
    # --repeats: unused (one export of each store); kept for one option set
    parser = benchlib.parser(__doc__, repeats=1, quick={"episodes": 4, "frames": 30})
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--frames", type=int, default=150, help="frames per episode (30 fps)")
    parser.add_argument("--gop", type=int, default=30, help="keyframe interval of the encodes")
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_segments", args)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for kind in ("files", "segments"):
            write_store(root / kind, args.episodes, args.frames, args.gop, kind == "segments")
        times = {kind: export_s(root / kind, root / f"out-{kind}") for kind in ("files", "segments")}
    per = {k: 1000 * v / args.episodes for k, v in times.items()}
    print(f"{args.episodes} episodes x {args.frames} frames, H.264 g={args.gop}, 1 worker, jpg 112x84 at 10 Hz")
    print(f"  one file per episode (baseline): {times['files']:6.2f} s  ({per['files']:6.1f} ms/episode)")
    print(f"  segments of one file (ours)    : {times['segments']:6.2f} s  ({per['segments']:6.1f} ms/episode)")
    print(f"  segments / files: {times['segments'] / times['files']:.2f}x")
    report.add("export per episode, segments of one file (vs one file each)", per["segments"], "ms",
               baseline=per["files"])
    report.finish()


if __name__ == "__main__":
    main()
