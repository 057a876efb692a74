"""Per-step camera frames stored in HDF5 -> one video file per episode and camera.

Three ways frames are stored, each kept as exact as the store allows:
- raw uint8 `[T, H, W, 3]` (robomimic `obs/<cam>_image`, ALOHA `/observations/images/<cam>`): encoded
  losslessly (FFV1) by default, so decoded frames equal the arrays bit for bit;
- JPEG bytes per step, either padded rows `[T, L]` uint8 (mobile ALOHA / ACT++ with `compress`: each
  row one JPEG file followed by zeros, `/compress_len` `[cams, T]` holding the true lengths) or
  variable-length bytes `[T]`: muxed as MJPEG packets byte for byte (no decode, no re-encode).

`/compress_len` has one row per camera in the order the recorder listed its cameras, which the file
does not keep (h5py lists groups by name; ALOHA's own config lists cam_high, cam_low, cam_left_wrist,
cam_right_wrist). So the row is checked, not trusted: the camera's position in name order (what
ACT++'s own loader assumes) when its lengths cut every frame at a JPEG end-of-image marker, else the row
whose lengths do, else each frame is cut after its last end-of-image marker (the padding is zeros).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

SOI, EOI = b"\xff\xd8", b"\xff\xd9"  # JPEG start / end of image


def cut_jpeg_rows(rows: np.ndarray, lengths: np.ndarray | None) -> list[bytes]:
    """Padded JPEG rows ([T, L] uint8) -> T JPEG files. `lengths` ([T], e.g. one row of compress_len):
    each frame is `row[:length]`; None: each frame ends after the row's last end-of-image marker. A frame
    that is not one JPEG file (no start marker, no end marker, a length out of the row) raises
    ValueError naming the step."""
    rows = np.asarray(rows, np.uint8)  # [T, L]
    if rows.ndim != 2:
        raise ValueError(f"JPEG rows must be [T, L] uint8, got shape {list(rows.shape)}")
    if lengths is not None and len(lengths) != len(rows):
        raise ValueError(f"{len(lengths)} lengths for {len(rows)} frames")
    out = []
    for k, row in enumerate(rows):
        data = row.tobytes()
        if lengths is None:
            end = data.rfind(EOI)
            if end < 0:
                raise ValueError(f"step {k}: no JPEG end-of-image marker in the row")
            n = end + 2
        else:
            n = int(lengths[k])
            if not 4 <= n <= len(data):
                raise ValueError(f"step {k}: length {n} is outside the row of {len(data)} bytes")
            if data[n - 2:n] != EOI:
                raise ValueError(f"step {k}: the {n} bytes do not end with a JPEG end-of-image marker")
        if not data.startswith(SOI):
            raise ValueError(f"step {k}: the row does not start with a JPEG start-of-image marker")
        out.append(data[:n])
    return out


def fits(rows: np.ndarray, lengths: np.ndarray) -> bool:
    """Whether `lengths` ([T]) cut every row of `rows` ([T, L]) right after a JPEG end-of-image marker."""
    if len(lengths) != len(rows):
        return False
    width = rows.shape[1]
    n = np.asarray(lengths, np.int64)  # [T]
    if np.any(n < 4) or np.any(n > width):
        return False
    k = np.arange(len(rows))
    return bool(np.all(rows[k, n - 2] == 0xFF) and np.all(rows[k, n - 1] == 0xD9))


def pick_length_row(rows: np.ndarray, compress_len: np.ndarray, preferred: int) -> int | None:
    """The row of `compress_len` ([cams, T]) that holds this camera's frame lengths: `preferred` (its
    position in name order) when it fits, else the first row that fits, else None."""
    compress_len = np.asarray(compress_len)
    if compress_len.ndim != 2:
        return None
    order = ([preferred] if 0 <= preferred < len(compress_len) else []) + \
        [r for r in range(len(compress_len)) if r != preferred]
    return next((r for r in order if fits(rows, compress_len[r])), None)


def jpeg_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a JPEG's header (Pillow reads the header only); ValueError if not a JPEG."""
    from PIL import Image, UnidentifiedImageError

    if not data.startswith(SOI):
        raise ValueError("not a JPEG file (no start-of-image marker)")
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format != "JPEG":
                raise ValueError(f"not a JPEG file ({image.format})")
            return image.size
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"not a readable JPEG file: {exc}") from exc


def write_jpegs(jpegs: Sequence[bytes], times_s: np.ndarray, path: Path) -> float:
    """JPEG files ([T]) -> an MJPEG Matroska file, byte for byte; every frame must have the first one's
    size (a video has one). Returns the first frame's time (the video's `clock_offset_s`)."""
    from robowds.export.media.encode import mux_jpegs

    size = jpeg_size(jpegs[0])
    for k, data in enumerate(jpegs):
        other = jpeg_size(data)
        if other != size:
            raise ValueError(f"step {k}: frame is {other[0]}x{other[1]}, step 0 is {size[0]}x{size[1]}")
    path.parent.mkdir(parents=True, exist_ok=True)
    return mux_jpegs(jpegs, times_s, path, *size)


def write_raw(frames: Iterable[np.ndarray], times_s: np.ndarray, path: Path, codec: str) -> float:
    """Raw frames ([H, W, 3] uint8 RGB each, T of them) -> a Matroska file with `codec` (FFV1: lossless)."""
    from robowds.export.media.encode import encode_frames

    path.parent.mkdir(parents=True, exist_ok=True)
    return encode_frames(frames, times_s, path, codec=codec)
