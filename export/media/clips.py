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
from typing import Any

import numpy as np

from robowds.export.media.images import JPEG_QUALITY, jpeg_bytes

MP4_CODEC = "mpeg4"  # FFmpeg's MPEG-4 part 2: bit-exact with the flags below
MP4_BITS_PER_PIXEL = 0.6
AV1_ENCODER = "libsvtav1"  # bundled with PyAV 18; decoded by libdav1d
AV1_PRESET = 10  # 0 (slowest) .. 13; 10 costs ~30 ms per 20-frame 224x224 window on one core
AV1_CRF = 30  # constant quality: ~3.6x fewer bytes than mpeg4 at ~1 dB lower PSNR (README)
AV1_MIN_SIZE = 4  # SVT-AV1 refuses frames narrower or lower than 4 pixels
__all__ = ["JPEG_QUALITY", "MP4_CODEC", "AV1_ENCODER", "encode_mp4", "encode_av1", "encode_jpegs", "psnr"]


def _encode_clip(frames: np.ndarray, rate_hz: float, codec: str, options: dict[str, str],
                 bit_rate: int | None = None) -> bytes:
    """frames [n, H, W, 3] uint8 -> mp4 bytes; frame i has pts i at time base 1/rate (yuv420p)."""
    import av

    height, width = frames.shape[1:3]
    rate = Fraction(rate_hz).limit_denominator(1000)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4", options={"fflags": "+bitexact"}) as container:
        stream: Any = container.add_stream(codec, rate=rate, options={"flags": "+bitexact", **options})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.thread_count = 1
        if bit_rate is not None:
            stream.bit_rate = bit_rate
        for i, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def encode_mp4(frames: np.ndarray, rate_hz: float) -> bytes:
    """A short MPEG-4 part 2 clip of frames [n, H, W, 3] (even H and W), bit rate from the frame size."""
    height, width = frames.shape[1:3]
    bit_rate = int(max(100_000, MP4_BITS_PER_PIXEL * width * height * float(Fraction(rate_hz).limit_denominator(1000))))
    return _encode_clip(frames, rate_hz, MP4_CODEC, {}, bit_rate)


def encode_av1(frames: np.ndarray, rate_hz: float) -> bytes:
    """A short AV1 clip (SVT-AV1, constant quality, one logical processor) of frames [n, H, W, 3].

    SVT-AV1 output was byte-identical across runs and across its SIMD levels (C, SSE2, AVX2,
    AVX-512), so it does not depend on the machine. SVT_LOG=1 keeps its per-encoder banner (about 30
    lines to stderr for every window) quiet; set SVT_LOG yourself to see it."""
    os.environ.setdefault("SVT_LOG", "1")
    options = {"preset": str(AV1_PRESET), "crf": str(AV1_CRF), "svtav1-params": "lp=1"}
    return _encode_clip(frames, rate_hz, AV1_ENCODER, options)


def encode_jpegs(frames: np.ndarray) -> bytes:
    """A msgpack list of one JPEG per frame [n, H, W, 3] (Pillow, fixed quality, no metadata)."""
    import msgpack

    return msgpack.packb([jpeg_bytes(frame) for frame in frames], use_bin_type=True)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 arrays, in dB (capped at 100 for identical arrays)."""
    return psnr_of_mse(float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean()))


def psnr_of_mse(mse: float) -> float:
    """PSNR in dB of a mean squared error of uint8 values (capped at 100: identical arrays)."""
    return 100.0 if mse == 0 else min(100.0, 10 * float(np.log10(255.0 ** 2 / mse)))
