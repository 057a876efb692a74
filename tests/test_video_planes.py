"""Camera frames cropped in their decoded planes, scaled there, converted to RGB last
(export/media/planes.py), against independent computations: the plane rectangles by their definition,
the pixels by a numpy crop of the decoded planes and PyAV's own scaler, and the exact (RGB-first) path
where a plane crop is not the same picture. Windows reuse each frame's JPEG / yuv420p picture: the
bytes must be those of encoding every window afresh."""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import msgpack
import numpy as np
import pytest
from av import VideoFrame
from av.video.reformatter import VideoReformatter
from hypothesis import given, settings
from hypothesis import strategies as st

from robowds.export.cli.main import main
from robowds.export.media.clips import psnr
from robowds.export.media.images import jpeg_bytes
from robowds.export.media.planes import FrameConverter, plane_boxes
from robowds.reader.format import group_samples, iter_members
from robowds.reader.manifest import parse_manifest, shards_of

from realdata import g1_video
from videos import camera_store, gradient_frames

SUBSAMPLINGS = [(1, 1), (1, 0), (0, 0), None]  # 4:2:0, 4:2:2, 4:4:4, one plane


@st.composite
def _crops(draw: Any) -> tuple[int, int, tuple[int, int, int, int], tuple[int, int] | None]:
    width, height = draw(st.integers(1, 80)), draw(st.integers(1, 80))
    w, h = draw(st.integers(1, width)), draw(st.integers(1, height))
    x, y = draw(st.integers(0, width - w)), draw(st.integers(0, height - h))
    return width, height, (x, y, w, h), draw(st.sampled_from(SUBSAMPLINGS))


@given(_crops())
@settings(max_examples=400, deadline=None)
def test_plane_boxes_cut_every_plane_at_the_same_picture(case: tuple) -> None:
    width, height, box, subsampling = case
    x, y, w, h = box
    boxes = plane_boxes(box, subsampling)
    if subsampling is None:
        assert boxes == [box]
        return
    sw, sh = subsampling
    aligned = x % 2 ** sw == 0 and y % 2 ** sh == 0
    assert (boxes is not None) == aligned  # an odd 4:2:0 offset would need half a chroma sample
    if boxes is None:
        return
    assert len(boxes) == 3 and boxes[0] == box and boxes[1] == boxes[2]
    cx, cy, cw, ch = boxes[1]
    # FFmpeg's chroma plane size of a w x h frame, and the crop lies inside the source's chroma plane
    assert (cw, ch) == (int(np.ceil(w / 2 ** sw)), int(np.ceil(h / 2 ** sh)))
    assert cx + cw <= int(np.ceil(width / 2 ** sw)) and cy + ch <= int(np.ceil(height / 2 ** sh))
    # the chroma sample of every luma sample of the crop is the one that covers it in the source
    cols, rows = np.arange(w), np.arange(h)
    np.testing.assert_array_equal((x + cols) // 2 ** sw, cx + cols // 2 ** sw)
    np.testing.assert_array_equal((y + rows) // 2 ** sh, cy + rows // 2 ** sh)


# -- pixels -------------------------------------------------------------------------------------------
def _g1_frames(count: int = 6) -> list[VideoFrame]:
    """The first decoded frames of the real G1 video: AV1 640x480 yuv420p, limited range."""
    with av.open(str(g1_video("episode_000001"))) as container:
        return [f for _, f in zip(range(count), container.decode(video=0))]


def _plane(frame: VideoFrame, i: int) -> np.ndarray:
    plane = frame.planes[i]
    return np.frombuffer(plane, np.uint8).reshape(plane.height, plane.line_size)[:, :plane.width]  # [h, w]


def _sited(frame: VideoFrame, siting: str) -> VideoFrame:
    """`frame` with its chroma siting set (PyAV has no setter: FFmpeg's setparams filter)."""
    import av.filter

    graph = av.filter.Graph()
    graph.threads = 1
    chain = [graph.add_buffer(width=frame.width, height=frame.height, format=frame.format, time_base=Fraction(1, 10)),
             graph.add("setparams", f"chroma_location={siting}"), graph.add("buffersink")]
    for a, b in zip(chain, chain[1:]):
        a.link_to(b)
    graph.configure()
    graph.push(frame)
    return graph.pull()


def _planes_rule(frame: VideoFrame, box: tuple[int, int, int, int], size: tuple[int, int] | None,
                 chroma_shift: tuple[int, int] | None, siting: str | None = None) -> np.ndarray:
    """The documented rule, computed independently: `_planes_scaled`, then swscale to RGB."""
    out = _planes_scaled(frame, box, size, chroma_shift, siting)
    return VideoReformatter().reformat(out, format="rgb24", threads=1).to_ndarray()


def _planes_scaled(frame: VideoFrame, box: tuple[int, int, int, int], size: tuple[int, int] | None,
                   chroma_shift: tuple[int, int] | None, siting: str | None = None) -> VideoFrame:
    """The plane rule before RGB: numpy crop of each decoded plane into a fresh frame (colour tags and,
    where the decoder set one, chroma siting copied), swscale bilinear in the same pixel format to `size`."""
    x, y, w, h = box
    out = VideoFrame(w, h, frame.format.name)
    for i, plane in enumerate(out.planes):
        sw, sh = (0, 0) if i == 0 or chroma_shift is None else chroma_shift
        dst = np.frombuffer(plane, np.uint8).reshape(plane.height, plane.line_size)  # [h', line] writable
        dst[:, :plane.width] = _plane(frame, i)[(y >> sh):(y >> sh) + plane.height, (x >> sw):(x >> sw) + plane.width]
    out.colorspace, out.color_range = frame.colorspace, frame.color_range
    if siting is not None:
        out = _sited(out, siting)
    if size is not None:
        out = VideoReformatter().reformat(out, width=size[0], height=size[1], threads=1)
    return out


def _rgb_first(frame: VideoFrame, box: tuple[int, int, int, int], size: tuple[int, int] | None) -> np.ndarray:
    """The exact path: the whole frame to RGB, the crop in numpy, the RGB crop scaled."""
    x, y, w, h = box
    rgb = VideoReformatter().reformat(frame, format="rgb24", threads=1).to_ndarray()[y:y + h, x:x + w]
    if size is None:
        return rgb
    small = VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
    return VideoReformatter().reformat(small, width=size[0], height=size[1], threads=1).to_ndarray()


def test_g1_crop_then_scale_follows_the_plane_rule_and_stays_close_to_rgb_first() -> None:
    frames = _g1_frames()
    box = (80, 0, 480, 480)  # centre crop of 640x480 for a square output
    convert = FrameConverter(640, 480, "yuv420p", box, (224, 224))
    assert convert.planar
    got = np.stack([convert(f) for f in frames])  # [6, 224, 224, 3]
    np.testing.assert_array_equal(got, np.stack([_planes_rule(f, box, (224, 224), (1, 1)) for f in frames]))
    before = np.stack([_rgb_first(f, box, (224, 224)) for f in frames])
    assert 40 < psnr(got, before) < 100  # a different rounding of the same picture (docs: 43 dB on G1)


def test_rgbx_output_is_the_rgb_output_and_gives_the_same_jpeg() -> None:
    """jpg exports hold swscale's RGBX output (no copy) and hand it to Pillow as RGBX: the RGB values and
    the JPEG bytes must be those of the rgb24 path, for every width that takes it (multiples of 16)."""
    frames = _g1_frames(3)
    for box, size in [((80, 0, 480, 480), (224, 224)), ((0, 0, 640, 480), (48, 40)), ((0, 0, 640, 480), (80, 6))]:
        rgb = FrameConverter(640, 480, "yuv420p", box, size)
        rgbx = FrameConverter(640, 480, "yuv420p", box, size, rgbx=True)
        for frame in frames:
            expected, got = rgb(frame), rgbx(frame)  # [H, W, 3], [H, W, 4]
            assert got.shape == (size[1], size[0], 4)
            np.testing.assert_array_equal(got[..., :3], expected)
            assert jpeg_bytes(got) == jpeg_bytes(expected)
    # why only multiples of 16: FFmpeg's yuv420p -> rgb0 gets the last columns of 50 wrong (rgb24 is right)
    small = VideoReformatter().reformat(frames[0], width=50, height=40, threads=1)
    plane = VideoReformatter().reformat(small, format="rgb0", threads=1).planes[0]
    wrong = np.frombuffer(plane, np.uint8).reshape(40, plane.line_size // 4, 4)[:, :50, :3]  # [40, 50, 3]
    right = VideoReformatter().reformat(small, format="rgb24", threads=1).to_ndarray()
    assert np.array_equal(wrong[:, :48], right[:, :48]) and not np.array_equal(wrong[:, 48:], right[:, 48:])
    assert FrameConverter(640, 480, "yuv420p", None, (50, 40), rgbx=True)(frames[0]).shape == (40, 50, 3)
    # a strided RGBX view (rows padded) is copied for Pillow: the same bytes
    padded = np.zeros((40, 64, 4), np.uint8)
    padded[:, :50, :3] = right
    assert not padded[:, :50].flags.c_contiguous and jpeg_bytes(padded[:, :50]) == jpeg_bytes(right)
    unscaled = FrameConverter(640, 480, "yuv420p", (80, 0, 480, 480), None, rgbx=True)  # the exact path: RGB
    np.testing.assert_array_equal(unscaled(frames[0]), _rgb_first(frames[0], (80, 0, 480, 480), None))


def test_g1_crop_without_scaling_is_the_rgb_frame_cropped() -> None:
    """Nothing scaled, nothing changes: the whole frame to RGB, then the crop, as before the plane rule."""
    frames = _g1_frames(3)
    for box, resize in [((80, 0, 480, 480), None), ((2, 4, 101, 77), None), ((80, 0, 480, 480), (480, 480))]:
        convert = FrameConverter(640, 480, "yuv420p", box, resize)
        assert not convert.planar
        for frame in frames:
            np.testing.assert_array_equal(convert(frame), _rgb_first(frame, box, None))
    convert = FrameConverter(640, 480, "yuv420p", None, None)
    np.testing.assert_array_equal(convert(frames[0]), _rgb_first(frames[0], (0, 0, 640, 480), None))


def test_odd_420_offset_and_forced_exact_take_the_rgb_first_path() -> None:
    frames = _g1_frames(2)
    box = (81, 3, 300, 200)
    convert = FrameConverter(640, 480, "yuv420p", box, (64, 48))
    assert not convert.planar
    exact = FrameConverter(640, 480, "yuv420p", (80, 0, 480, 480), (64, 64), exact=True)
    assert not exact.planar
    for frame in frames:
        np.testing.assert_array_equal(convert(frame), _rgb_first(frame, box, (64, 48)))
        np.testing.assert_array_equal(exact(frame), _rgb_first(frame, (80, 0, 480, 480), (64, 64)))


def test_g1_resize_without_crop_scales_the_planes_first() -> None:
    frames = _g1_frames(3)
    convert = FrameConverter(640, 480, "yuv420p", None, (160, 120))
    for frame in frames:
        expected = _planes_rule(frame, (0, 0, 640, 480), (160, 120), (1, 1))
        np.testing.assert_array_equal(convert(frame), expected)
        one_pass = VideoReformatter().reformat(frame, format="rgb24", width=160, height=120, threads=1).to_ndarray()
        assert psnr(convert(frame), one_pass) > 38


def _ffv1(path: Path, frames: np.ndarray, pix_fmt: str) -> list[VideoFrame]:
    """Frames [F, H, W, 3] written losslessly (FFV1 in Matroska) in `pix_fmt`, and decoded back."""
    with av.open(str(path), "w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=10)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], pix_fmt
        for i, image in enumerate(frames):
            frame = VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with av.open(str(path)) as container:
        return list(container.decode(video=0))


@pytest.mark.parametrize("pix_fmt, shift, planar", [
    ("yuv420p", (1, 1), True), ("yuv422p", (1, 0), True), ("yuv444p", (0, 0), True), ("gray", None, True),
    ("yuv420p10le", None, False), ("bgr0", None, False)])
def test_each_pixel_format_takes_its_path(tmp_path: Path, pix_fmt: str, shift: tuple[int, int] | None,
                                          planar: bool) -> None:
    frames = _ffv1(tmp_path / f"{pix_fmt}.mkv", gradient_frames(2, 64, 48), pix_fmt)
    assert frames[0].format.name == pix_fmt
    box = (10, 4, 40, 30)  # even offsets: a plane crop for every 8-bit planar format
    convert = FrameConverter(64, 48, pix_fmt, box, (20, 16))
    assert convert.planar == planar
    for frame in frames:
        expected = _planes_rule(frame, box, (20, 16), shift) if planar else _rgb_first(frame, box, (20, 16))
        np.testing.assert_array_equal(convert(frame), expected)


def test_frame_of_another_size_than_probed_goes_the_exact_way() -> None:
    frame = _g1_frames(1)[0]
    convert = FrameConverter(320, 240, "yuv420p", (40, 0, 240, 240), (32, 32))  # set up for a smaller video
    np.testing.assert_array_equal(convert(frame), _rgb_first(frame, (40, 0, 240, 240), (32, 32)))


# -- windows: each frame encoded once, the same bytes -------------------------------------------------
def _yuv_store(tmp_path: Path, frames: int = 20) -> Path:
    """One episode of a yuv420p video (mpeg4) at 10 fps with moving content."""
    store = tmp_path / "s"
    path = store / "media" / "cam.mp4"
    path.parent.mkdir(parents=True)
    source = gradient_frames(frames, 96, 64)
    source[:, :, :, 0] = (source[:, :, :, 0] + 9 * np.arange(frames)[:, None, None]) % 256  # colour moves
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        stream.time_base = stream.codec_context.time_base = Fraction(1, 10)
        for i, image in enumerate(source):
            frame = VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return camera_store(store, {"ep0": "media/cam.mp4"})


def _export(store: Path, out: Path, encoding: str, *sets: str) -> None:
    """2 frames of history (the step before the anchor and the anchor's), stride 1: every frame is in 2
    windows, and the first window's first step is padding."""
    args = ["export", str(store), str(out), "--quiet", "--workers", "1", "--stride", "1",
            "--set", "streams.cam.duration_s=0.2", "--set", "streams.cam.offset_s=-0.1",
            "--set", "streams.cam.crop=center", "--set", "streams.cam.resize=[48, 48]",
            "--set", f"streams.cam.encoding={encoding}"]
    for item in sets:
        args += ["--set", item]
    assert main(args) == 0


def _members(out: Path, member: str) -> dict[str, bytes]:
    manifest = parse_manifest((out / "manifest.json").read_bytes())
    found = {}
    for shard in shards_of(manifest, "train"):
        for key, _, members in group_samples(iter_members((out / shard.path).read_bytes(), shard.path), shard.path):
            found[key] = bytes(members[member])
    return found


def _fresh_clip(frames: np.ndarray, codec: str, options: dict[str, str], bit_rate: int | None) -> bytes:
    """A window's clip as the export encoded it before frames were shared: RGB frames straight into a
    new encoder (which converts them to yuv420p itself)."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4", options={"fflags": "+bitexact"}) as container:
        stream: Any = container.add_stream(codec, rate=Fraction(10), options={"flags": "+bitexact", **options})
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.thread_count = 1
        if bit_rate is not None:
            stream.bit_rate = bit_rate
        for i, image in enumerate(frames):
            frame = VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def test_shared_frames_give_the_bytes_of_fresh_encodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import robowds.export.media.video_windows as video_windows
    from robowds.reader.format import decode_npy

    store = _yuv_store(tmp_path)
    _export(store, tmp_path / "raw", "raw")
    raw = {k: decode_npy(v) for k, v in _members(tmp_path / "raw", "cam.npy").items()}  # [2, 48, 48, 3] each
    assert len(raw) == 20 and not raw["ep0_000000"][0].any() and raw["ep0_000000"][1].any()  # step 0 padded
    with av.open(str(store / "media" / "cam.mp4")) as container:
        source = list(container.decode(video=0))  # decoded as the export decodes: mpeg4 is left-sited
    for k in (0, 7, 19):  # the stored frames follow the plane rule: centre 64x64 crop, then 48x48
        expected = _planes_rule(source[k], (16, 0, 64, 64), (48, 48), (1, 1), siting="left")  # mpeg4: left-sited
        np.testing.assert_array_equal(raw[f"ep0_{k:06d}"][1], expected)
        assert psnr(raw[f"ep0_{k:06d}"][1], _planes_rule(source[k], (16, 0, 64, 64), (48, 48), (1, 1))) < 100

    calls = []
    monkeypatch.setattr(video_windows, "jpeg_bytes", lambda rgb: calls.append(1) or jpeg_bytes(rgb))
    _export(store, tmp_path / "jpg", "jpg")
    assert len(calls) == 20 + 1  # each frame once, and the zero frame of the padded step once
    jpgs = _members(tmp_path / "jpg", "cam.jpgs.msgpack")
    assert jpgs.keys() == raw.keys()
    for key, frames in raw.items():  # every window: one JPEG per frame, encoded afresh
        assert jpgs[key] == msgpack.packb([jpeg_bytes(f) for f in frames], use_bin_type=True), key

    _export(store, tmp_path / "mp4", "mp4")
    clips = _members(tmp_path / "mp4", "cam.mp4")
    for key, frames in raw.items():
        assert clips[key] == _fresh_clip(frames, "mpeg4", {}, 100_000), key  # 0.6 bit/pixel is below the floor
    _export(store, tmp_path / "av1", "av1")
    clips = _members(tmp_path / "av1", "cam.mp4")
    for key in ("ep0_000000", "ep0_000001", "ep0_000013"):
        assert clips[key] == _fresh_clip(raw[key], "libsvtav1", {"preset": "10", "crf": "30", "svtav1-params": "lp=1"},
                                         None), key


def test_edge_padding_repeats_the_edge_frames_bytes(tmp_path: Path) -> None:
    from robowds.reader.format import decode_npy

    store = _yuv_store(tmp_path, frames=6)
    _export(store, tmp_path / "raw", "raw", "streams.cam.pad=edge")
    _export(store, tmp_path / "jpg", "jpg", "streams.cam.pad=edge")
    raw = {k: decode_npy(v) for k, v in _members(tmp_path / "raw", "cam.npy").items()}
    first = raw["ep0_000000"]  # step 0 before the video: the first frame again
    np.testing.assert_array_equal(first[0], first[1])
    jpgs = _members(tmp_path / "jpg", "cam.jpgs.msgpack")
    for key, frames in raw.items():
        assert jpgs[key] == msgpack.packb([jpeg_bytes(f) for f in frames], use_bin_type=True), key


def test_a_chunk_whose_windows_are_all_kept_is_not_copied() -> None:
    from robowds.export.job.build import _kept

    chunk = np.zeros((4, 2, 8, 8, 3), np.uint8)  # [W, n, H, W, 3]
    assert _kept(np.ones(4, bool))(chunk) is chunk
    some = _kept(np.array([True, False, True, True]))(chunk)
    assert some.shape == (3, 2, 8, 8, 3) and not np.shares_memory(some, chunk)


# -- mp4-intra: each frame's intra packet made once, muxed into every window that holds it -------------
def _alone(picture: VideoFrame) -> np.ndarray:
    """One yuv420p picture encoded on its own by a fresh all-intra MPEG-4 encoder (quantiser 3) and
    decoded as the reader decodes clips: [H, W, 3]."""
    from robowds.reader.decode import decode_member

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream: Any = container.add_stream("mpeg4", rate=Fraction(10), options={"g": "1", "qmin": "3", "qmax": "3"})
        stream.width, stream.height, stream.pix_fmt = picture.width, picture.height, "yuv420p"
        for packet in [*stream.encode(picture), *stream.encode()]:
            container.mux(packet)
    (frame,) = decode_member("mp4", buf.getvalue())
    return frame


def _zero_yuv(width: int, height: int) -> VideoFrame:
    """The zero (black) RGB frame of a padded step in yuv420p."""
    black = VideoFrame.from_ndarray(np.zeros((height, width, 3), np.uint8), format="rgb24")
    return VideoReformatter().reformat(black, format="yuv420p", threads=1)


def _packets(clip: bytes) -> list[tuple[float, bool, bytes]]:
    """(time s, keyframe, data) of every packet of an mp4 clip."""
    with av.open(io.BytesIO(clip)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "mpeg4"
        return [(float(p.pts * p.time_base), p.is_keyframe, bytes(p)) for p in container.demux(stream) if p.size]


def test_mp4_intra_windows_are_standalone_clips_of_frames_encoded_once(tmp_path: Path) -> None:
    from robowds.reader.decode import decode_member
    from robowds.reader.format import decode_npy

    store = _yuv_store(tmp_path)
    _export(store, tmp_path / "raw", "raw")
    raw = {k: decode_npy(v) for k, v in _members(tmp_path / "raw", "cam.npy").items()}  # [2, 48, 48, 3] each
    _export(store, tmp_path / "intra", "mp4-intra")
    clips = _members(tmp_path / "intra", "cam.mp4")
    with av.open(str(store / "media" / "cam.mp4")) as container:
        source = list(container.decode(video=0))  # mpeg4: left-sited chroma
    box = (16, 0, 64, 64)  # centre crop of 96x64
    assert clips.keys() == raw.keys() and len(clips) == 20
    for key, frames in raw.items():
        packets = _packets(clips[key])
        assert [(t, kf) for t, kf, _ in packets] == [(0.0, True), (0.1, True)], key  # frame i at i / 10 Hz
        decoded = decode_member("mp4", clips[key])  # [2, 48, 48, 3], as the reader decodes it
        k = int(key[-6:])
        # each frame decodes as if encoded alone: the plane rule's scaled yuv420p picture, no RGB between
        # (the padded step: the zero RGB frame in yuv420p)
        first = _zero_yuv(48, 48) if k == 0 else _planes_scaled(source[k - 1], box, (48, 48), (1, 1), "left")
        for stored, picture in zip(decoded, [first, _planes_scaled(source[k], box, (48, 48), (1, 1), "left")]):
            np.testing.assert_array_equal(stored, _alone(picture), err_msg=key)
        assert psnr(decoded[1], frames[1]) > 35, key  # against the stored RGB (raw)
    for k in range(1, 19):  # the frame shared by windows k and k + 1 is one packet, muxed into both
        assert _packets(clips[f"ep0_{k:06d}"])[1][2] == _packets(clips[f"ep0_{k + 1:06d}"])[0][2]
    manifest = parse_manifest((tmp_path / "intra" / "manifest.json").read_bytes())
    assert (manifest["schema"]["cam"]["encoding"], manifest["schema"]["cam"]["codec"]) == ("mp4-intra", "mpeg4")
    _export(store, tmp_path / "again", "mp4-intra")
    assert _members(tmp_path / "again", "cam.mp4") == clips  # byte-reproducible


def test_mp4_intra_without_the_plane_path_encodes_the_stored_rgb(tmp_path: Path) -> None:
    """No scaling (resize = the crop): no plane path, the stored RGB frames go to yuv420p and the encoder."""
    from robowds.reader.decode import decode_member
    from robowds.reader.format import decode_npy

    store = _yuv_store(tmp_path, frames=4)
    _export(store, tmp_path / "raw", "raw", "streams.cam.resize=[64, 64]")
    _export(store, tmp_path / "intra", "mp4-intra", "streams.cam.resize=[64, 64]")
    raw = {k: decode_npy(v) for k, v in _members(tmp_path / "raw", "cam.npy").items()}  # [2, 64, 64, 3] each
    clips = _members(tmp_path / "intra", "cam.mp4")
    for key, frames in raw.items():
        for stored, frame in zip(decode_member("mp4", clips[key]), frames):
            rgb = VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
            np.testing.assert_array_equal(stored, _alone(VideoReformatter().reformat(rgb, format="yuv420p")))


def test_mp4_intra_needs_an_even_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _yuv_store(tmp_path, frames=4)
    args = ["export", str(store), str(tmp_path / "out"), "--quiet", "--set", "streams.cam.encoding=mp4-intra",
            "--set", "streams.cam.resize=[47, 48]"]
    assert main(args) != 0
    assert "mp4-intra encoding needs an even frame size, got 47x48" in capsys.readouterr().err
