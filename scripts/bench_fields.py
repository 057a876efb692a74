"""Field selection: state/action-only reads from an export with a jpg camera against the same export
made without the camera.

    .venv/bin/python scripts/bench_fields.py            # ~1-2 minutes on 2 cores

What it does: one synthetic store (`write_synthetic_store`, --episodes) gets a 10 fps camera `cam`
(a 320x240 mpeg4 video per episode, 12 s, textured so the JPEGs are not trivially small), and is
exported twice from that one store with `robowds export` (default 1 s windows at 10 fps):
  - camera:    everything, `cam` stored as a window of 10 JPEG frames resized to 224x224 (`jpgs.msgpack`);
  - no camera: the same with `--set exclude=[cam]`.
Each row iterates `ShardDataset(out, "train", seed=0, ...)` (shuffled, local shards from the page cache,
one process, samples handed out as they are: zero-copy views) for whole passes until --min-s have
passed, best of --repeats; samples/s. The page cache is warmed by one untimed pass per row.

Rows: the camera export read whole, and with fields=[joints, actions]; the no-camera export read whole,
and with fields=[joints, actions]. Printed ratios: camera+fields / no-camera whole (the issue's target:
>= 0.8), and camera+fields / no-camera+fields (the same selected work on both exports).
"""

from __future__ import annotations

import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from robowds.export.cli.main import main as robowds
from robowds.export.cli.synth import write_synthetic_store
from robowds.reader.dataset import ShardDataset

import benchlib

FIELDS = ["joints", "actions"]


def write_camera(store: Path, episode_ids: tuple[str, ...], seconds: float = 12.0, fps: int = 10) -> None:
    """A 320x240 mpeg4 video per episode (`media/cam/<id>.mp4`) and `videos.parquet` naming them."""
    import av
    import pyarrow as pa
    import pyarrow.parquet as pq

    ys, xs = np.mgrid[0:240, 0:320]  # [H, W]
    rng = np.random.default_rng(0)
    for eid in episode_ids:
        path = store / "media" / "cam" / f"{eid}.mp4"
        path.parent.mkdir(parents=True, exist_ok=True)
        with av.open(str(path), "w", format="mp4") as container:
            stream = container.add_stream("mpeg4", rate=fps)
            stream.width, stream.height, stream.pix_fmt = 320, 240, "yuv420p"
            stream.time_base = stream.codec_context.time_base = Fraction(1, 1000)
            for k in range(int(seconds * fps)):
                noise = rng.integers(0, 40, (240, 320, 1))
                rgb = np.dstack([(xs + 4 * k) % 256, (ys * 2 + k) % 256, (xs ^ ys) % 256]) + noise
                frame = av.VideoFrame.from_ndarray(np.clip(rgb, 0, 255).astype(np.uint8), format="rgb24")
                frame.pts, frame.time_base = k * 1000 // fps, Fraction(1, 1000)
                for packet in stream.encode(frame):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
    video = pa.array([{"path": f"media/cam/{eid}.mp4", "fps": float(fps), "start_s": 0.0, "end_s": seconds}
                      for eid in episode_ids])
    pq.write_table(pa.table({"episode_id": list(episode_ids), "cam": video}), store / "videos.parquet")


def export(store: Path, out: Path, *sets: str) -> None:
    argv = ["export", str(store), str(out), "--quiet", "--workers", "2", "--set", "streams.cam.resize=[224, 224]"]
    argv += [x for kv in sets for x in ("--set", kv)]
    assert robowds(argv) == 0, argv


def rate(out: Path, min_s: float, repeats: int, **options: Any) -> float:
    """Best samples/s over `repeats` runs of whole passes lasting >= min_s each."""
    ds = ShardDataset(out, "train", seed=0, **options)
    for _ in ds:  # warm the page cache and the layouts' first decode
        pass
    best = 0.0
    for _ in range(repeats):
        best = max(best, benchlib.throughput(lambda: sum(1 for _ in ds), min_s))
    return best


def per_sample(out: Path) -> float:
    import json

    manifest = json.loads((out / "manifest.json").read_text())
    split = manifest["splits"]["train"]
    return split["bytes"] / split["samples"]


def main() -> None:
    parser = benchlib.parser(__doc__, repeats=3, quick={"episodes": 2, "min_s": 0.1, "repeats": 1})
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--min-s", type=float, default=1.0)
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_fields", args)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        summary = write_synthetic_store(root / "store", episodes=args.episodes, seed=0)
        write_camera(root / "store", summary.episode_ids)
        t0 = time.perf_counter()
        export(root / "store", root / "cam")
        export(root / "store", root / "nocam", "exclude=[cam]")
        print(f"exports: {time.perf_counter() - t0:.1f} s; bytes/sample: "
              f"camera {per_sample(root / 'cam') / 1e3:.1f} KB, "
              f"no camera {per_sample(root / 'nocam') / 1e3:.1f} KB")
        rows = {
            "camera, whole": rate(root / "cam", args.min_s, args.repeats),
            f"camera, fields={FIELDS}": rate(root / "cam", args.min_s, args.repeats, fields=FIELDS),
            "no camera, whole": rate(root / "nocam", args.min_s, args.repeats),
            f"no camera, fields={FIELDS}": rate(root / "nocam", args.min_s, args.repeats, fields=FIELDS),
        }
    print(f"{'read':<42} {'samples/s':>10}")
    for label, value in rows.items():
        print(f"{label:<42} {value:>10.0f}")
    selected = rows[f"camera, fields={FIELDS}"]
    print(f"camera+fields / no camera whole:  {selected / rows['no camera, whole']:.2f} (target >= 0.80)")
    print(f"camera+fields / no camera+fields: {selected / rows[f'no camera, fields={FIELDS}']:.2f}")
    print(f"camera+fields / camera whole:     {selected / rows['camera, whole']:.1f}x")
    report.add(f"camera, fields={FIELDS} (vs no camera, whole)", selected, "samples/s",
               baseline=rows["no camera, whole"], target=">= 0.80x")
    report.add(f"camera, fields={FIELDS} (vs camera, whole)", selected, "samples/s", baseline=rows["camera, whole"])
    report.finish()


if __name__ == "__main__":
    main()
