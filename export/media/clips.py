"""Encoders for one window of camera frames: mp4 clips (MPEG-4 part 2 or AV1) and JPEG lists.

Every encoder is configured for byte-reproducible output (same frames -> same bytes, any worker
count): single-threaded, fixed settings, FFmpeg's bitexact flags so no version string or time lands
in the container. libx264 is not used: it was seen to be non-deterministic on real decoded frames
(reference/interop.md). Each clip starts with a keyframe, so the reader decodes a window on its own.
"""

from __future__ import annotations

import io
import os
from fractions import Fraction
from typing import Any, Sequence

import numpy as np

from robowds.export.media.images import JPEG_QUALITY, jpeg_bytes

MP4_CODEC = "mpeg4"  # FFmpeg's MPEG-4 part 2: bit-exact with the flags below
MP4_BITS_PER_PIXEL = 0.6
MP4_INTRA_QSCALE = 3  # mp4-intra: constant quantiser; G1 224x224: 39.2 dB vs the stored RGB, 1.46x mp4's bytes
AV1_ENCODER = "libsvtav1"  # bundled with PyAV 18; decoded by libdav1d
AV1_PRESET = 10  # 0 (slowest) .. 13; 10 costs ~30 ms per 20-frame 224x224 window on one core
AV1_CRF = 30  # constant quality: ~3.6x fewer bytes than mpeg4 at ~1 dB lower PSNR (README)
AV1_MIN_SIZE = 4  # SVT-AV1 refuses frames narrower or lower than 4 pixels
__all__ = ["JPEG_QUALITY", "MP4_CODEC", "AV1_ENCODER", "encode_mp4", "encode_av1", "encode_jpegs", "encode_clip",
           "IntraClips", "pack_jpegs", "to_yuv420p", "psnr"]


def to_yuv420p(rgb: np.ndarray, reformatter: Any) -> Any:
    """One uint8 [H, W, 3] frame as the yuv420p VideoFrame the clip encoders take, with the conversion
    the encoder would do itself (swscale, bilinear, one thread): made once per frame by the export and
    reused by every window that holds the frame, instead of once per window inside each encoder."""
    import av

    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
    return reformatter.reformat(frame, format="yuv420p", threads=1)


def _clip_settings(encoding: str, width: int, height: int, rate_hz: float) -> tuple[str, dict[str, str], int | None]:
    """(codec, options, bit rate) of a clip encoding: "mp4" (MPEG-4 part 2) or "av1" (SVT-AV1)."""
    if encoding == "mp4":
        fps = float(Fraction(rate_hz).limit_denominator(1000))
        return MP4_CODEC, {}, int(max(100_000, MP4_BITS_PER_PIXEL * width * height * fps))
    if encoding == "av1":
        # SVT_LOG=1 keeps SVT-AV1's per-encoder banner (about 30 lines to stderr for every window)
        # quiet; set SVT_LOG yourself to see it
        os.environ.setdefault("SVT_LOG", "1")
        return AV1_ENCODER, {"preset": str(AV1_PRESET), "crf": str(AV1_CRF), "svtav1-params": "lp=1"}, None
    raise ValueError(f"clip encoding must be mp4 or av1, got {encoding!r}")


def encode_clip(frames: Sequence[Any], rate_hz: float, encoding: str) -> bytes:
    """yuv420p VideoFrames [n] of one size (`to_yuv420p`) -> mp4 bytes in `encoding` ("mp4" or "av1");
    frame i has pts i at time base 1/rate. The frames are only read, so one frame object may be
    passed for several steps and reused by later clips."""
    codec, options, bit_rate = _clip_settings(encoding, frames[0].width, frames[0].height, rate_hz)
    return mux_frames(frames, codec, Fraction(rate_hz).limit_denominator(1000), options, bit_rate)


def mux_frames(frames: Sequence[Any], codec: str, rate: Fraction, options: dict[str, str],
               bit_rate: int | None = None) -> bytes:
    """yuv420p VideoFrames [n] encoded by `codec` (one thread, bitexact flags) into an mp4 in memory,
    frame i at pts i (time base 1/rate)."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4", options={"fflags": "+bitexact"}) as container:
        stream: Any = container.add_stream(codec, rate=rate, options={"flags": "+bitexact", **options})
        stream.width, stream.height, stream.pix_fmt = frames[0].width, frames[0].height, "yuv420p"
        stream.thread_count = 1
        if bit_rate is not None:
            stream.bit_rate = bit_rate
        for i, frame in enumerate(frames):
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


class IntraClips:
    """`mp4-intra` clips of one video: every frame an intra picture, so a frame is encoded once and its
    packet is muxed into every window that holds it (with 2 frames of history at stride 1 that halves
    the encoding, and a window costs a mux instead of an encoder).

    Why not `mp4`'s encoder per window: opening an MPEG-4 encoder and muxer costs more than the frames
    (1.5-2 ms of CPU per 2-frame window on G1 224x224, against ~0.3 ms per intra frame and ~0.15 ms
    per mux). The price: intra-only clips store each frame whole (constant quantiser
    `MP4_INTRA_QSCALE`), 1.46x the bytes of `mp4` for 2-frame windows and more for long ones
    (docs/video-and-images.md).

    One encoder per video, opened once as the stream of a throw-away mp4 (so its codec parameters,
    extradata included, are filled in and serve as the template of every clip's stream: no encoder is
    opened per clip). Packets are numbered in the order they are made (the encoder refuses a pts that
    does not increase); the MPEG-4 headers carry that number as a time code, which decoders of the mp4
    ignore (frame times come from the container: frame i of a clip at i / rate). The decoded pixels of
    a packet depend on its frame alone."""

    def __init__(self, width: int, height: int, rate_hz: float) -> None:
        import av

        self.rate = Fraction(rate_hz).limit_denominator(1000)
        self._time_base = 1 / self.rate  # of a clip's packets: made once (Fraction arithmetic is slow)
        self._sink = av.open(io.BytesIO(), "w", format="mp4", options={"fflags": "+bitexact"})
        stream: Any = self._sink.add_stream(MP4_CODEC, rate=self.rate, options={
            "flags": "+bitexact", "g": "1", "bf": "0", "qmin": str(MP4_INTRA_QSCALE), "qmax": str(MP4_INTRA_QSCALE)})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.thread_count = 1
        self._sink.start_encoding()  # opens the encoder and fills the stream's codec parameters
        self._stream, self._count, self._encoder_time_base = stream, 0, stream.codec_context.time_base

    def packet(self, frame: Any) -> bytes:
        """One yuv420p VideoFrame (`to_yuv420p`, or the scaled planes of a decoded frame) -> its intra
        packet's bytes."""
        # pts in the encoder's own time base (a decoded frame still carries its source's)
        frame.pts, frame.time_base, self._count = self._count, self._encoder_time_base, self._count + 1
        packets = self._stream.encode(frame)
        assert len(packets) == 1 and packets[0].is_keyframe, "an intra encoder without delay: one keyframe per frame"
        return bytes(packets[0])

    def clip(self, packets: Sequence[bytes]) -> bytes:
        """Packets [n] (`packet`) -> the mp4 bytes of a clip, packet i at pts i / rate."""
        import av

        buf = io.BytesIO()
        with av.open(buf, "w", format="mp4", options={"fflags": "+bitexact"}) as container:
            stream = container.add_stream_from_template(self._stream)
            for i, data in enumerate(packets):
                packet = av.Packet(data)
                packet.stream, packet.pts, packet.dts, packet.time_base = stream, i, i, self._time_base
                packet.is_keyframe = True
                container.mux(packet)
        return buf.getvalue()


def _encode_rgb(frames: np.ndarray, rate_hz: float, encoding: str) -> bytes:
    from av.video.reformatter import VideoReformatter

    reformatter = VideoReformatter()
    return encode_clip([to_yuv420p(image, reformatter) for image in frames], rate_hz, encoding)


def encode_mp4(frames: np.ndarray, rate_hz: float) -> bytes:
    """A short MPEG-4 part 2 clip of frames [n, H, W, 3] (even H and W), bit rate from the frame size."""
    return _encode_rgb(frames, rate_hz, "mp4")


def encode_av1(frames: np.ndarray, rate_hz: float) -> bytes:
    """A short AV1 clip (SVT-AV1, constant quality, one logical processor) of frames [n, H, W, 3].

    SVT-AV1 output was byte-identical across runs and across its SIMD levels (C, SSE2, AVX2,
    AVX-512), so it does not depend on the machine."""
    return _encode_rgb(frames, rate_hz, "av1")


def encode_jpegs(frames: np.ndarray) -> bytes:
    """A msgpack list of one JPEG per frame [n, H, W, 3] (Pillow, fixed quality, no metadata)."""
    return pack_jpegs([jpeg_bytes(frame) for frame in frames])


def pack_jpegs(jpegs: Sequence[bytes]) -> bytes:
    """The `jpgs.msgpack` member: a msgpack list of JPEG byte strings, one per step."""
    import msgpack

    return msgpack.packb(list(jpegs), use_bin_type=True)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 arrays, in dB (capped at 100 for identical arrays)."""
    return psnr_of_mse(float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean()))


def psnr_of_mse(mse: float) -> float:
    """PSNR in dB of a mean squared error of uint8 values (capped at 100: identical arrays)."""
    return 100.0 if mse == 0 else min(100.0, 10 * float(np.log10(255.0 ** 2 / mse)))
