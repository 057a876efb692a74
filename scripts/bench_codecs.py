"""Per-window clip codecs on real robot video: bytes per frame, PSNR, encode and decode time.

    .venv/bin/python scripts/bench_codecs.py        # ~1 minute on 2 cores

Takes the real LeRobot G1 `cam_high` video vendored in tests/data/real (episode 1, AV1 640x480 @ 30 fps;
see tests/data/real/README.md; `--video` takes another file), decodes it once, and cuts 20-frame windows at 10 Hz (every 3rd source frame), at 640x480 and resized to 224x224
(swscale bilinear, as the export resizes). Each window is encoded with the export's own encoders
(`robowds.export.media.clips.encode_mp4` = mpeg4, `encode_av1` = SVT-AV1, `encode_jpegs` = one JPEG per frame) and
decoded with the reader's own decoder (`robowds.reader.decode.decode_member`), one thread each. Printed per
size and codec: bytes per frame, PSNR of decoded vs source frames, and the median encode and decode
time per window (median of `--windows` windows).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import numpy as np

from robowds.export.media.clips import encode_av1, encode_jpegs, encode_mp4, psnr
from robowds.reader.decode import decode_member

import benchlib

# vendored in the repository (tests/realdata.py names the same file), so the script runs from a clean clone
VIDEO = (ROOT / "tests" / "data" / "real" / "unitree_g1_lerobot_v2.1_real" / "videos" / "chunk-000"
         / "observation.images.cam_high" / "episode_000001.mp4")
STEPS, EVERY = 20, 3  # 20 frames at 10 Hz from a 30 fps source
CODECS = {"mpeg4": (encode_mp4, "mp4"), "av1": (encode_av1, "mp4"), "jpg": (lambda f, r: encode_jpegs(f), "jpgs.msgpack")}


def source_frames(video: Path, size: tuple[int, int] | None) -> np.ndarray:
    """Every frame of the real video as rgb24 [F, H, W, 3], optionally resized to (width, height)."""
    import av
    from av.video.reformatter import VideoReformatter

    reformatter = VideoReformatter()
    width, height = size or (None, None)
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        return np.stack([reformatter.reformat(f, format="rgb24", width=width, height=height, threads=1).to_ndarray()
                         for f in container.decode(stream)])


def main() -> None:
    # --repeats: unused (each figure is a median over --windows windows); kept for one option set
    parser = benchlib.parser(__doc__, repeats=1, quick={"windows": 2})
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--video", type=Path, default=VIDEO, help="the source video (default: the vendored G1 episode 1)")
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_codecs", args)
    if not args.video.exists():
        raise SystemExit(f"the video is not here: {args.video} (the vendored one is committed under tests/data/real)")
    print(f"{args.video.name}: 20-frame windows at 10 Hz, median of {args.windows} windows, one thread")
    print(f"{'size':<9} {'codec':<6} {'bytes/frame':>11} {'PSNR dB':>8} {'encode ms':>10} {'decode ms':>10}")
    for size in ((224, 224), None):
        frames = source_frames(args.video, size)  # [F, H, W, 3]
        span = STEPS * EVERY
        starts = np.linspace(0, len(frames) - span, args.windows).astype(int)
        for name, (encode, ext) in CODECS.items():
            sizes, quality, enc_ms, dec_ms = [], [], [], []
            for start in starts.tolist():
                window = np.ascontiguousarray(frames[start:start + span:EVERY])  # [20, H, W, 3]
                began = time.perf_counter()
                blob = encode(window, 10.0)
                enc_ms.append((time.perf_counter() - began) * 1e3)
                began = time.perf_counter()
                decoded = decode_member(ext, blob)
                dec_ms.append((time.perf_counter() - began) * 1e3)
                sizes.append(len(blob) / STEPS)
                quality.append(psnr(decoded, window))
            label = f"{frames.shape[2]}x{frames.shape[1]}"
            print(f"{label:<9} {name:<6} {statistics.mean(sizes):>11,.0f} {statistics.mean(quality):>8.1f} "
                  f"{statistics.median(enc_ms):>10.1f} {statistics.median(dec_ms):>10.1f}")
            report.add(f"{label} {name}: bytes per frame", statistics.mean(sizes), "B")
            report.add(f"{label} {name}: PSNR", statistics.mean(quality), "dB")
            report.add(f"{label} {name}: encode per window (median)", statistics.median(enc_ms), "ms")
            report.add(f"{label} {name}: decode per window (median)", statistics.median(dec_ms), "ms")
    report.finish()


if __name__ == "__main__":
    main()
