"""Per-episode images (kind "image"): kept as the stored bytes, or re-encoded once per episode.

`encoding: original` copies the source bytes into every window. `png` / `jpg` decode the image with
Pillow (RGB; alpha and palettes are flattened as the reader would), apply the optional centred crop
and resize (same geometry as camera frames, see export/media/geometry.py) and encode it with fixed settings
and no metadata, so the bytes depend only on the pixels. The result is computed once per episode and
shared by all its windows.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from robowds.export.media.geometry import Crop, crop_box

IMAGE_ENCODINGS = ("original", "png", "jpg")
JPEG_QUALITY = 90  # images and camera frames alike: byte-reproducible with Pillow's libjpeg
PNG_COMPRESS_LEVEL = 6


@dataclass(frozen=True)
class ImageOptions:
    encoding: str = "original"  # original | png | jpg
    resize: tuple[int, int] | None = None  # (width, height)
    crop: Crop = None  # None | "center" | (width, height)


def jpeg_bytes(image: np.ndarray) -> bytes:
    """One uint8 [H, W, 3] (or [H, W]) picture as JPEG (fixed quality, no EXIF/ICC: deterministic).

    [H, W, 4] is RGBX (the 4th byte ignored): Pillow keeps RGB in 4 bytes per pixel itself, so it maps
    contiguous RGBX without a copy, where [H, W, 3] is copied in; libjpeg gets the same RGB rows either
    way and the bytes are the same (tests/test_video_planes.py)."""
    from PIL import Image

    buf = io.BytesIO()
    if image.ndim == 3 and image.shape[2] == 4:
        height, width = image.shape[:2]
        picture = Image.frombuffer("RGBX", (width, height), np.ascontiguousarray(image), "raw", "RGBX", 0, 1)
    else:
        picture = Image.fromarray(image)
    picture.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return buf.getvalue()


def png_bytes(image: np.ndarray) -> bytes:
    """One uint8 [H, W, 3] picture as PNG (fixed zlib level, no text chunks: deterministic)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG", optimize=False, compress_level=PNG_COMPRESS_LEVEL)
    return buf.getvalue()


def decode_rgb(blob: bytes) -> np.ndarray:
    """Source image bytes -> uint8 [H, W, 3] (Pillow; any mode converted to RGB)."""
    from PIL import Image

    with Image.open(io.BytesIO(blob)) as img:
        return np.asarray(img.convert("RGB"), dtype=np.uint8)  # [H, W, 3]


def transform(image: np.ndarray, options: ImageOptions) -> np.ndarray:
    """Centred crop, then resize (Pillow bilinear, antialiased when shrinking): [H, W, 3] -> [h, w, 3]."""
    from PIL import Image

    height, width = image.shape[:2]
    box = crop_box(width, height, options.crop, options.resize)
    if box is not None:
        x, y, w, h = box
        image = image[y:y + h, x:x + w]  # [h, w, 3] view
    if options.resize is not None and (image.shape[1], image.shape[0]) != options.resize:
        resized = Image.fromarray(np.ascontiguousarray(image)).resize(options.resize, Image.Resampling.BILINEAR)
        image = np.asarray(resized, dtype=np.uint8)
    return np.ascontiguousarray(image)


def encode_image(blob: bytes, ext: str, options: ImageOptions) -> tuple[str, bytes]:
    """(member extension, bytes) of one episode's image under `options`.

    Raises ValueError (Pillow cannot decode it) or CropError (crop larger than the image)."""
    if options.encoding == "original":
        return ext, blob
    try:
        pixels = decode_rgb(blob)
    except OSError as exc:  # PIL.UnidentifiedImageError and truncated files are OSErrors
        raise ValueError(f"the image cannot be decoded: {exc}") from exc
    pixels = transform(pixels, options)
    if options.encoding == "png":
        return "png", png_bytes(pixels)
    return "jpg", jpeg_bytes(pixels)
