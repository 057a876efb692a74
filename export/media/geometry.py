"""Crop and resize geometry shared by camera frames and per-episode images. Pure integer arithmetic.

`crop` is None (keep the whole frame), "center" (the largest centred crop with the aspect ratio of
`resize`, so a later resize does not stretch the picture) or (w, h) (a centred crop of w x h source
pixels). The crop comes first, then the resize: the stored size is `resize`, else the crop, else the
source size.
"""

from __future__ import annotations

from typing import Union

Crop = Union[None, str, tuple[int, int]]  # None | "center" | (width, height)
Box = tuple[int, int, int, int]  # (x0, y0, width, height) in source pixels


class CropError(ValueError):
    """A crop that does not fit the source picture (a user-facing message)."""


def crop_box(width: int, height: int, crop: Crop, resize: tuple[int, int] | None) -> Box | None:
    """The source rectangle to keep, or None for the whole picture.

    Offsets are floor((source - crop) / 2), so a crop one pixel smaller than the source drops the
    last column/row: deterministic and the same for frames and images.
    """
    if crop is None:
        return None
    if crop == "center":
        if resize is None:
            raise CropError('crop "center" needs resize: [width, height] (it keeps that aspect ratio)')
        out_w, out_h = resize
        if width * out_h > height * out_w:  # source is wider than the target: full height
            w, h = (2 * height * out_w + out_h) // (2 * out_h), height  # round(height * W / H)
        else:  # source is taller (or equal): full width
            w, h = width, (2 * width * out_h + out_w) // (2 * out_w)  # round(width * H / W)
        w, h = max(1, min(w, width)), max(1, min(h, height))
    else:
        w, h = crop
        if w > width or h > height:
            raise CropError(f"crop [{w}, {h}] is larger than the {width}x{height} source picture")
    if (w, h) == (width, height):
        return None
    return (width - w) // 2, (height - h) // 2, w, h


def output_size(width: int, height: int, crop: Crop, resize: tuple[int, int] | None) -> tuple[int, int]:
    """(width, height) of what is stored: the resize, else the crop, else the source."""
    if resize is not None:
        return resize
    box = crop_box(width, height, crop, resize)
    return (box[2], box[3]) if box else (width, height)


def configured_size(crop: Crop, resize: tuple[int, int] | None) -> tuple[int, int] | None:
    """The stored (width, height) when the config alone fixes it (for the manifest schema), else None."""
    if resize is not None:
        return resize
    if isinstance(crop, tuple):
        return crop
    return None
