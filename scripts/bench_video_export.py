"""Video export against the decode limit, on the real G1 data: export ms per window for the jpg, mp4 and
mp4-intra encodings against the time to decode the source alone, measured in one run.

    .venv/bin/python scripts/bench_video_export.py          # ~3 minutes on 2 cores

The store: `robowds convert lerobot` of the vendored tests/data/real/unitree_g1_lerobot_v2.1_real (2
episodes, 736 frames of AV1 640x480 at 30 fps, 26-D state and action, task text). The export (in this
process, `--workers 1`, every repeat into a fresh folder): a 30 Hz grid, stride 1, every stream 2 steps
(1 frame of history and the anchor's), the camera centre-cropped to 480x480 and scaled to 224x224, as
`jpg`, as `mp4` and as `mp4-intra`; one window per source frame. The whole job is timed (plan, map, shards, manifest):
not the interpreter's start-up.

Decode-only: every frame of both videos decoded with PyAV as the export decodes them (one thread, no
colour conversion). The ratio is export windows/s over decode-only frames/s (target >= 70%: the export
then spends at most 3/7 of the decode time on everything else). Figures are the best of `--repeats`
runs, wall clock and CPU time of this process both (on a shared machine the CPU time is the steadier).

Breakdown, per window (= per frame): decode (the decode-only time), conversion (crop, scale, to RGB:
`robowds.export.media.planes.FrameConverter` on every decoded frame, RGBX for jpg as the export does;
mp4-intra: crop and scale only, the encoder takes the scaled yuv420p planes), encode (jpg: one JPEG
per frame; mp4: one yuv420p conversion per frame and one 2-frame clip per window; mp4-intra: one
intra packet per frame, one mux per window), and the rest of the export (time series, tar members,
staging and shard files, manifest) = export - the three. The same export without the camera is timed
too (what the export costs besides its video), and the conversion the export did before the plane
rule (RGB first, crop, scale the RGB crop), for comparison.

Quality: bytes per frame and PSNR of every stored frame (decoded as the reader decodes it) against
the stored RGB frame, per encoding, and of mp4-intra's frames against mp4's.

`--before REV` also times the same exports with the code of git revision REV (`git archive` of its
`export/` and `reader/` as the `robowds` package, a child process per repeat, interleaved with this
process's repeats, timed inside it the same way),
so a change is measured against its parent in one run (jpg and mp4: older revisions have no
mp4-intra).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import benchlib

ROOT = Path(__file__).resolve().parents[1]
G1 = ROOT / "tests" / "data" / "real" / "unitree_g1_lerobot_v2.1_real"
CAMERA = "observation_images_cam_high"
SIZE, FPS = (224, 224), 30
TARGET = 0.70
ENCODINGS = ("jpg", "mp4", "mp4-intra")
NO_CAMERA = "no camera"


def export_args(store: Path, out: Path, encoding: str) -> list[str]:
    """The measured export: 30 Hz grid, stride 1, 2 steps per stream, centre crop to 224x224; encoding
    NO_CAMERA: the same export with the camera left out (what the export costs besides its video)."""
    sets = {"window.rate_hz": str(FPS), "window.duration_s": repr(2 / FPS), "window.offset_s": repr(-1 / FPS),
            f"streams.{CAMERA}.resize": f"[{SIZE[0]}, {SIZE[1]}]", f"streams.{CAMERA}.crop": "center",
            f"streams.{CAMERA}.encoding": "jpg" if encoding == NO_CAMERA else encoding}
    if encoding == NO_CAMERA:
        sets["exclude"] = f"[{CAMERA}]"
    args = ["export", str(store), str(out), "--quiet", "--workers", "1", "--fps", str(FPS), "--stride", "1"]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    return args


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall s, CPU s of this process, result) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def export_times(store: Path, out: Path, encoding: str) -> tuple[float, float]:
    """(wall s, CPU s) of one in-process export into a fresh `out` (its summary line swallowed)."""
    from robowds.export.cli.main import main as robowds

    shutil.rmtree(out, ignore_errors=True)
    with contextlib.redirect_stdout(io.StringIO()):
        wall, cpu, status = timed(lambda: robowds(export_args(store, out, encoding)))
    if status != 0:
        raise SystemExit(f"the {encoding} export failed")
    return wall, cpu


def before_times(rev: str, store: Path, tmp: Path, repeats: int) -> dict[str, tuple[float, float]]:
    """Best (wall s, CPU s) per encoding of the exports with revision `rev`'s code, in a child process."""
    src = tmp / f"rev-{rev}"
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "export", "reader"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(src / "robowds")
    (src / "robowds" / "__init__.py").touch()
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, __file__, "--child", str(store), str(tmp / "before"), str(repeats)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return {enc: tuple(times) for enc, times in json.loads(done.stdout.splitlines()[-1]).items()}


def child(store: Path, out: Path, repeats: int) -> None:
    """`--child`: best export times per encoding with whatever `robowds` this interpreter imports."""
    import robowds.export

    assert str(ROOT) not in robowds.export.__file__, robowds.export.__file__  # the archived revision's code
    best: dict[str, tuple[float, float]] = {}
    for _ in range(repeats):
        for enc in ("jpg", "mp4"):
            wall, cpu = export_times(store, out / enc, enc)
            old = best.get(enc, (float("inf"), float("inf")))
            best[enc] = (min(old[0], wall), min(old[1], cpu))
    print(json.dumps(best))


def decoded(path: Path) -> Any:
    """The frames of a video, decoded as the export decodes them (one thread, no conversion)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "NONE"
        stream.codec_context.thread_count = 1
        yield from container.decode(stream)


def decode_only(videos: list[Path]) -> int:
    """Decode every frame of every video, nothing else; the frame count."""
    return sum(1 for path in videos for _ in decoded(path))


def components(videos: list[Path], encoding: str) -> dict[str, tuple[float, float]]:
    """Conversion, the old conversion and encoding, timed call by call over every frame: name ->
    (wall s, CPU s) summed over the frames of all videos."""
    from av.video.reformatter import VideoReformatter

    from robowds.export.media.clips import IntraClips, encode_clip, to_yuv420p
    from robowds.export.media.geometry import crop_box
    from robowds.export.media.images import jpeg_bytes
    from robowds.export.media.planes import FrameConverter

    totals = {"convert": [0.0, 0.0], "convert (before: RGB first)": [0.0, 0.0], "encode": [0.0, 0.0]}

    def add(name: str, fn: Callable[[], Any]) -> Any:
        wall, cpu, result = timed(fn)
        totals[name][0] += wall
        totals[name][1] += cpu
        return result

    for path in videos:
        converter = old = None
        yuv, previous, intra = VideoReformatter(), None, IntraClips(SIZE[0], SIZE[1], FPS)
        for frame in decoded(path):
            if converter is None:
                box = crop_box(frame.width, frame.height, "center", SIZE)
                converter = FrameConverter(frame.width, frame.height, frame.format.name, box, SIZE,
                                           rgbx=encoding == "jpg")
                old = FrameConverter(frame.width, frame.height, frame.format.name, box, SIZE, exact=True)
            if encoding == "mp4-intra":  # the scaled yuv420p planes go to the encoder: no RGB
                rgb = add("convert", lambda: converter.scaled(frame))
            else:
                rgb = add("convert", lambda: converter(frame))  # [224, 224, 3], RGBX [224, 224, 4] for jpg
            add("convert (before: RGB first)", lambda: old(frame))
            if encoding == "jpg":
                add("encode", lambda: jpeg_bytes(rgb))
            elif encoding == "mp4-intra":
                part = add("encode", lambda: intra.packet(rgb))
                pair = [previous or part, part]
                add("encode", lambda: intra.clip(pair))
                previous = part
            else:
                part = add("encode", lambda: to_yuv420p(rgb, yuv))
                pair = [previous or part, part]  # the window of this frame and the one before
                add("encode", lambda: encode_clip(pair, FPS, encoding))
                previous = part
    return {name: (wall, cpu) for name, (wall, cpu) in totals.items()}


def quality(videos: list[Path]) -> dict[str, tuple[float, float]]:
    """Per encoding: (bytes per frame, PSNR dB of every stored frame against the stored RGB frame,
    squared errors pooled over all frames), each frame taken as the anchor frame of its window (the
    window of it and the frame before, as the export stores it); "mp4-intra vs mp4": the PSNR of the
    two encodings' decoded frames against each other."""
    import numpy as np
    from av.video.reformatter import VideoReformatter

    from robowds.export.media.clips import IntraClips, encode_clip, psnr_of_mse, to_yuv420p
    from robowds.export.media.geometry import crop_box
    from robowds.export.media.images import jpeg_bytes
    from robowds.export.media.planes import FrameConverter
    from robowds.reader.decode import decode_member

    sums = {name: [0, 0.0, 0] for name in (*ENCODINGS, "mp4-intra vs mp4")}  # bytes, squared error, values

    def add(name: str, size: float, stored: np.ndarray, reference: np.ndarray) -> None:
        sums[name][0] += size
        sums[name][1] += float(((stored.astype(np.float64) - reference) ** 2).sum())
        sums[name][2] += stored.size

    for path in videos:
        converter, yuv, intra, previous = None, VideoReformatter(), IntraClips(SIZE[0], SIZE[1], FPS), None
        for frame in decoded(path):
            if converter is None:
                box = crop_box(frame.width, frame.height, "center", SIZE)
                converter = FrameConverter(frame.width, frame.height, frame.format.name, box, SIZE)
            scaled = converter.scaled(frame)
            rgb = converter.to_rgb(scaled)  # [224, 224, 3]
            reference = rgb.astype(np.float64)
            jpg = jpeg_bytes(rgb)
            add("jpg", len(jpg), decode_member("jpg", jpg), reference)
            current = (to_yuv420p(rgb, yuv), intra.packet(scaled))
            pair = previous or current
            clip = encode_clip([pair[0], current[0]], FPS, "mp4")
            mp4 = decode_member("mp4", clip)[1]
            add("mp4", len(clip) / 2, mp4, reference)
            clip = intra.clip([pair[1], current[1]])
            mp4_intra = decode_member("mp4", clip)[1]
            add("mp4-intra", len(clip) / 2, mp4_intra, reference)
            add("mp4-intra vs mp4", 0, mp4_intra, mp4.astype(np.float64))
            previous = current
    frames = sum(1 for path in videos for _ in decoded(path))
    return {name: (size / frames, psnr_of_mse(sq / count)) for name, (size, sq, count) in sums.items()}


X264_SETTINGS = [("ultrafast", "zerolatency", 23), ("ultrafast", "zerolatency", 18), ("superfast", "zerolatency", 20),
                 ("veryfast", "zerolatency", 23)]


def x264_clip(pair: list[Any], preset: str, tune: str, crf: int) -> bytes:
    """A 2-frame libx264 clip (one thread, bitexact flags) of yuv420p frames, for `--x264` only: the
    export does not offer libx264 (not byte-reproducible on real frames, docs/video-and-images.md)."""
    from fractions import Fraction

    from robowds.export.media.clips import mux_frames

    return mux_frames(pair, "libx264", Fraction(FPS), {"preset": preset, "tune": tune, "crf": str(crf),
                                                       "x264-params": "log=-1"})


def x264_rows(video: Path, count: int = 120) -> list[tuple[str, float, float, float, float]]:
    """`--x264`: per-window 2-frame clips of the first `count` frames of `video` by mp4, mp4-intra and
    libx264 settings: (name, CPU ms per window, bytes per frame, PSNR dB of the anchor frames against
    the stored RGB and against mp4's)."""
    import numpy as np
    from av.video.reformatter import VideoReformatter

    from robowds.export.media.clips import IntraClips, encode_clip, psnr_of_mse, to_yuv420p
    from robowds.export.media.geometry import crop_box
    from robowds.export.media.planes import FrameConverter
    from robowds.reader.decode import decode_member

    frames = [f for _, f in zip(range(count), decoded(video))]
    converter = FrameConverter(frames[0].width, frames[0].height, frames[0].format.name,
                               crop_box(frames[0].width, frames[0].height, "center", SIZE), SIZE)
    scaled = [converter.scaled(f) for f in frames]
    rgbs = [converter.to_rgb(s).astype(np.float64) for s in scaled]  # [224, 224, 3] each
    yuv = VideoReformatter()
    yuvs = [to_yuv420p(converter.to_rgb(s), yuv) for s in scaled]
    intra = IntraClips(SIZE[0], SIZE[1], FPS)
    packets = [intra.packet(s) for s in scaled]
    makers: list[tuple[str, Callable[[int], bytes]]] = [
        ("mp4 (MPEG-4 part 2, 0.6 bit/pixel)", lambda k: encode_clip([yuvs[max(k - 1, 0)], yuvs[k]], FPS, "mp4")),
        ("mp4-intra (shared packets: mux only)", lambda k: intra.clip([packets[max(k - 1, 0)], packets[k]]))]
    makers += [(f"libx264 {p} {t} crf {c}", lambda k, p=p, t=t, c=c: x264_clip([yuvs[max(k - 1, 0)], yuvs[k]], p, t, c))
               for p, t, c in X264_SETTINGS]
    rows, reference = [], None
    for name, make in makers:
        cpu = time.process_time()
        clips = [make(k) for k in range(count)]
        cpu = (time.process_time() - cpu) / count
        anchors = [decode_member("mp4", clip)[1].astype(np.float64) for clip in clips]  # [224, 224, 3] each
        reference = reference or anchors
        rows.append((name, cpu * 1e3, sum(map(len, clips)) / 2 / count,
                     psnr_of_mse(float(np.mean([((a - r) ** 2).mean() for a, r in zip(anchors, rgbs)]))),
                     psnr_of_mse(float(np.mean([((a - r) ** 2).mean() for a, r in zip(anchors, reference)])))))
    return rows


def jpeg_alternatives(video: Path, count: int = 120) -> list[tuple[str, float]]:
    """`--jpeg`: CPU ms per frame of ways to make a frame's JPEG from the scaled planes, on the first
    `count` frames of `video`: the export's (RGBX, Pillow), Pillow from YCbCr (no RGB; the chroma planes
    upsampled by repetition and interleaved in numpy, as Pillow takes only full-size pixels: timing
    only, the range conversion JFIF needs is left out) and FFmpeg's mjpeg encoder from yuvj420p (swscale
    scales straight to full range; quantiser 2)."""
    from fractions import Fraction

    import av
    import numpy as np
    from av.video.reformatter import VideoReformatter
    from PIL import Image

    from robowds.export.media.geometry import crop_box
    from robowds.export.media.images import JPEG_QUALITY, jpeg_bytes
    from robowds.export.media.planes import FrameConverter

    frames = [f for _, f in zip(range(count), decoded(video))]
    converter = FrameConverter(frames[0].width, frames[0].height, frames[0].format.name,
                               crop_box(frames[0].width, frames[0].height, "center", SIZE), SIZE, rgbx=True)
    scaled = [converter.scaled(f) for f in frames]
    ycc = np.empty((SIZE[1], SIZE[0], 3), np.uint8)  # [H, W, 3], reused

    def from_ycbcr(picture: Any) -> bytes:
        y, u, v = (np.frombuffer(p, np.uint8).reshape(p.height, p.line_size)[:, :p.width] for p in picture.planes)
        ycc[..., 0] = y
        for c, plane in ((1, u), (2, v)):  # [H/2, W/2] -> [H, W] by repetition
            ycc[..., c] = np.repeat(np.repeat(plane, 2, axis=0), 2, axis=1)
        buf = io.BytesIO()
        Image.fromarray(ycc, "YCbCr").save(buf, format="JPEG", quality=JPEG_QUALITY)
        return buf.getvalue()

    mjpeg: Any = av.CodecContext.create("mjpeg", "w")
    mjpeg.width, mjpeg.height, mjpeg.pix_fmt, mjpeg.time_base = SIZE[0], SIZE[1], "yuvj420p", Fraction(1, FPS)
    mjpeg.thread_count = 1
    mjpeg.options = {"flags": "+bitexact", "qmin": "2", "qmax": "2"}
    full = VideoReformatter()
    counter = iter(range(10 ** 9))

    def from_yuvj(frame: Any) -> bytes:
        picture = full.reformat(converter.crop(frame), width=SIZE[0], height=SIZE[1], format="yuvj420p", threads=1)
        picture.pts, picture.time_base = next(counter), mjpeg.time_base
        return b"".join(bytes(p) for p in mjpeg.encode(picture))

    ways: list[tuple[str, Callable[[int], Any]]] = [
        ("Pillow from RGBX (the export: + RGBX)", lambda k: jpeg_bytes(converter.to_rgb(scaled[k]))),
        ("Pillow from YCbCr (no RGB)", lambda k: from_ycbcr(scaled[k])),
        ("FFmpeg mjpeg from yuvj420p (+ scale)", lambda k: from_yuvj(frames[k]))]
    rows = []
    for name, make in ways:
        best = float("inf")
        for _ in range(3):
            cpu = time.process_time()
            for k in range(count):
                make(k)
            best = min(best, (time.process_time() - cpu) / count)
        rows.append((name, best * 1e3))
    return rows


def main() -> None:
    parser = benchlib.parser(__doc__, repeats=3, quick={"repeats": 1})
    parser.add_argument("--before", metavar="REV", help="also time the exports with git revision REV's code")
    parser.add_argument("--x264", action="store_true", help="also time libx264 per-window clips (not offered)")
    parser.add_argument("--jpeg", action="store_true", help="also time other ways to make a frame's JPEG")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)  # STORE OUT REPEATS, for --before
    args = benchlib.parse(parser)
    if args.child:
        child(Path(args.child[0]), Path(args.child[1]), int(args.child[2]))
        return

    from robowds.export.cli.main import main as robowds

    report = benchlib.Report("bench_video_export", args)  # prints the load at the start
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        with contextlib.redirect_stdout(io.StringIO()):
            if robowds(["convert", "lerobot", str(G1), str(store), "--quiet"]) != 0:
                raise SystemExit(f"robowds convert lerobot {G1} failed")
        videos = sorted(G1.glob("videos/chunk-000/observation.images.cam_high/*.mp4"))
        frames = decode_only(videos)
        best: dict[str, tuple[float, float]] = {}
        before: dict[str, tuple[float, float]] = {}
        for _ in range(args.repeats):  # interleaved, so slow spells of a shared machine hit every row
            for name in ("decode", *ENCODINGS, NO_CAMERA):
                if name == "decode":
                    wall, cpu, _ = timed(lambda: decode_only(videos))
                else:
                    wall, cpu = export_times(store, Path(tmp) / name, name)
                old = best.get(name, (float("inf"), float("inf")))
                best[name] = (min(old[0], wall), min(old[1], cpu))
            for enc, (wall, cpu) in (before_times(args.before, store, Path(tmp), 1) if args.before else {}).items():
                old = before.get(enc, (float("inf"), float("inf")))
                before[enc] = (min(old[0], wall), min(old[1], cpu))
        parts: dict[str, dict[str, tuple[float, float]]] = {}
        for _ in range(args.repeats):  # best of the repeats per stage, like the exports
            for enc in ENCODINGS:
                for stage, (wall, cpu) in components(videos, enc).items():
                    old = parts.setdefault(enc, {}).get(stage, (float("inf"), float("inf")))
                    parts[enc][stage] = (min(old[0], wall), min(old[1], cpu))
        scores = quality(videos)
        x264 = x264_rows(videos[0]) if args.x264 else []
        jpegs = jpeg_alternatives(videos[0]) if args.jpeg else []
    ms = 1e3 / frames  # seconds over all frames (= windows) -> ms per frame (= per window)
    decode = best["decode"]
    print(f"G1 ({len(videos)} episodes, {frames} frames = windows): AV1 640x480 -> centre crop 480x480 -> 224x224, "
          f"2-frame windows, stride 1; best of {args.repeats}, ms per frame / window, wall | CPU")
    print(f"  decode only (PyAV, one thread, no conversion)   {decode[0] * ms:6.2f} | {decode[1] * ms:6.2f}")
    for enc in ENCODINGS:
        rows = [("export", best[enc])] + ([(f"export at {args.before}", before[enc])] if enc in before else [])
        for label, (wall, cpu) in rows:
            ratio = (decode[0] / wall, decode[1] / cpu)
            met = "met" if min(ratio) >= TARGET else ("met on CPU time" if ratio[1] >= TARGET else "missed")
            print(f"  {label} {enc} ms/window{'':<{32 - len(label) - len(enc)}}{wall * ms:6.2f} | {cpu * ms:6.2f}"
                  f"   -> {ratio[0]:.0%} | {ratio[1]:.0%} of the decode-only rate (target {TARGET:.0%}: {met})")
            report.add(f"{label} {enc} per window, wall (vs decode only)", wall * ms, "ms", baseline=decode[0] * ms,
                       ratio=ratio[0], target=f"ratio >= {TARGET:.2f}x")
            report.add(f"{label} {enc} per window, CPU (vs decode only)", cpu * ms, "ms", baseline=decode[1] * ms,
                       ratio=ratio[1], target=f"ratio >= {TARGET:.2f}x")
    wall, cpu = best[NO_CAMERA]
    print(f"  export without the camera ms/window{'':<13}{wall * ms:6.2f} | {cpu * ms:6.2f}   (time series, members, "
          "shards, manifest)")
    print("breakdown per window, wall | CPU (rest = export - decode - convert - encode):")
    for enc in ENCODINGS:
        rows = {"decode": decode, **parts[enc]}
        rest = tuple(best[enc][i] - decode[i] - rows["convert"][i] - rows["encode"][i] for i in (0, 1))
        rows["rest of the export"] = rest
        for name, (wall, cpu) in rows.items():
            print(f"  {enc:<9} {name:<30} {wall * ms:6.2f} | {cpu * ms:6.2f}")
    print("stored frames (each the anchor of its 2-frame window) against the stored RGB, all frames pooled:")
    for name, (size, db) in scores.items():
        print(f"  {name:<17} {db:6.2f} dB" + (f"   {size:8,.0f} bytes/frame" if size else ""))
        report.add(f"stored frames, {name}: PSNR", db, "dB")
    if x264:
        print(f"2-frame clips of the first 120 frames of {videos[0].name}, CPU ms per window (one thread), bytes "
              "per frame, PSNR of the anchor frames against the stored RGB and against mp4's:")
    for name, cpu, size, db, vs_mp4 in x264:
        print(f"  {name:<38} {cpu:6.2f} ms {size:8,.0f} B  {db:6.2f} dB  {vs_mp4:6.2f} dB vs mp4")
    if jpegs:
        print(f"a frame's JPEG from the scaled planes, first 120 frames of {videos[0].name}, best of 3, "
              "CPU ms per frame:")
    for name, cpu in jpegs:
        print(f"  {name:<40} {cpu:6.2f} ms")
    report.finish()  # prints the load at the end


if __name__ == "__main__":
    main()
