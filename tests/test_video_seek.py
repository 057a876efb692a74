"""An episode that is a segment of a long video (LeRobot v3 keeps many episodes in one mp4) is decoded
from the last keyframe before it, not from the file's start, and its frames are exactly those of a
decode of the whole file: H.264 with B-frames and a keyframe interval that does not line up with the
segments, MPEG-4 Part 2, VP9 in WebM, and the real VP9 WebM clip of tests/data/real."""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from robowds.export.media.frames import probe_video
from robowds.export.media.video_windows import VideoOptions, VideoWindows

from videos import gradient_frames

REAL_WEBM = Path(__file__).parent / "data" / "real" / "webm_vp9_real_clip_physicsworks" / "videos" / "physicsworks.webm"
RATE = 30


def encode(path: Path, codec: str, options: dict[str, str], count: int = 240) -> None:
    """`count` frames at 30 fps whose content changes every frame (blue = 10 x frame, plus motion)."""
    frames = gradient_frames(count, 96, 64)  # [F, H, W, 3]
    frames[..., 0] = (frames[..., 0].astype(np.int64) + 7 * np.arange(count)[:, None, None]) % 256
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=RATE, options=options)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        for k, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = k, Fraction(1, RATE)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def segment_frames_equal_whole_file_frames(path: Path, length: int) -> list[int]:
    """Every segment of `length` frames, read by its own VideoWindows as an episode, against one
    VideoWindows reading the whole file in order: the same frames, pixel for pixel, at every step.
    Returns the frames each segment's decoder produced."""
    info = probe_video(path)
    rate = float(1.0 / np.median(np.diff(info.pts)))
    whole = VideoWindows(path, {}, VideoOptions(encoding="raw"))
    decoded = []
    for first in range(0, len(info.pts) - length + 1, length):
        start, end = float(info.pts[first]), float(info.pts[first + length]) if first + length < len(info.pts) else None
        segment = VideoWindows(path, {"start_s": start, "end_s": end}, VideoOptions(encoding="raw"))
        steps = np.arange(length)[:, None] / rate  # [W, 1] episode times, one frame per window
        index, valid = segment.select(steps, (0.0, (length - 1) / rate))
        whole_index, whole_valid = whole.select(steps + start, (0.0, float(info.pts[-1])))
        assert valid.all() and whole_valid.all() and (index == whole_index).all()
        for w in range(length):
            np.testing.assert_array_equal(segment.window(index[w], valid[w]), whole.window(whole_index[w], whole_valid[w]),
                                          err_msg=f"{path.name}: frame {first + w}")
        assert segment.missed_seeks == 0  # the seek landed on the keyframe asked for
        decoded.append(segment.decoded_frames)
    return decoded


@pytest.mark.parametrize("codec,suffix,options,gop", [
    ("libx264", "mp4", {"g": "37", "bf": "3", "keyint_min": "37", "sc_threshold": "0"}, 37),
    ("mpeg4", "mp4", {"g": "25", "bf": "2"}, 25),
    ("libvpx-vp9", "webm", {"g": "30", "deadline": "realtime", "cpu-used": "8"}, 30),
])
def test_a_late_segment_decodes_from_its_keyframe_and_equals_the_whole_decode(tmp_path: Path, codec: str, suffix: str,
                                                                            options: dict[str, str], gop: int) -> None:
    path = tmp_path / f"long.{suffix}"
    encode(path, codec, options)
    decoded = segment_frames_equal_whole_file_frames(path, 40)
    assert len(decoded) == 6
    # each segment decodes itself plus at most one keyframe interval before it, never the file so far
    assert all(n <= 40 + gop for n in decoded), decoded
    assert decoded[-1] < 200 // 2, decoded  # from the file's start it would be 240


def test_real_vp9_webm_segments(tmp_path: Path) -> None:
    """The real clip: keyframes at frames 0, 167 and 311 of 551 (Matroska cues, 1 ms pts)."""
    info = probe_video(REAL_WEBM)
    keys = [info.index_of(float(t)) for t in info.keyframe_pts]
    assert keys == [0, 167, 311] and len(info.pts) == 551
    decoded = segment_frames_equal_whole_file_frames(REAL_WEBM, 90)
    # segment k starts at frame 90 k: it decodes from the keyframe at or before it
    starts = [90 * k for k in range(len(decoded))]
    assert decoded == [start + 90 - max(key for key in keys if key <= start) for start in starts], decoded


def test_the_probe_of_a_file_is_reused_until_it_changes(tmp_path: Path) -> None:
    """Episodes of one file share its probe (one demux of the file, not one per episode); a file
    rewritten in place is probed again."""
    path = tmp_path / "v.mp4"
    encode(path, "mpeg4", {"g": "10"}, count=30)
    first = probe_video(path)
    assert probe_video(path) is first and not first.pts.flags.writeable
    encode(path, "mpeg4", {"g": "10"}, count=20)
    again = probe_video(path)
    assert again is not first and len(again.pts) == 20


def test_a_seek_that_lands_elsewhere_falls_back_to_exact_frames(tmp_path: Path) -> None:
    """Key flags that lie (frames 50 and 100 listed as keyframes; the real ones are 0, 37, 74, ...):
    each seek lands on a keyframe the probe does not list, is refused, and the decode falls back to
    the file's start. The frames are still exactly the whole decode's."""
    path = tmp_path / "long.mp4"
    encode(path, "libx264", {"g": "37", "bf": "3", "keyint_min": "37", "sc_threshold": "0"})
    info = probe_video(path)
    ticks = np.rint(info.pts[[0, 50, 100]] / info.time_base).astype(np.int64)
    lying = dataclasses.replace(info, keyframe_pts=info.pts[[0, 50, 100]], keyframe_ticks=ticks)
    whole = VideoWindows(path, {}, VideoOptions(encoding="raw"))
    segment = VideoWindows(path, {"start_s": float(info.pts[120]), "end_s": float(info.pts[160])},
                           VideoOptions(encoding="raw"))
    segment.info = lying
    steps = np.arange(40)[:, None] / RATE  # [W, 1]
    index, valid = segment.select(steps, (0.0, 39 / RATE))
    whole_index, whole_valid = whole.select(steps + float(info.pts[120]), (0.0, float(info.pts[-1])))
    assert (index == whole_index).all() and valid.all() and whole_valid.all()
    for w in range(40):
        np.testing.assert_array_equal(segment.window(index[w], valid[w]), whole.window(whole_index[w], whole_valid[w]))
    assert segment.missed_seeks == 2 and segment.decoded_frames == 160  # both seeks refused: from frame 0
