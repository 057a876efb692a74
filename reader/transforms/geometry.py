"""Geometric camera augmentation: `RandomResizedCrop`, `RandomShift` and `Resize`, one draw per window
(every frame of a window gets the same box), on numpy frames in workers and on batched torch tensors
on any device.

Each is a `CameraTransform` (reader/transforms/_images.py: which fields, layouts, `shared`, the two
protocols); the crop-and-resize and the shifts are reader/transforms/_resample.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from robowds.reader.transforms._images import CameraTransform
from robowds.reader.transforms._resample import resized_crop, resized_crop_batch, shift, shift_batch


@dataclass(frozen=True)
class CropBox:
    """A crop in pixels of the source frame, resampled to `size` (h, w)."""

    top: int
    left: int
    height: int
    width: int
    size: tuple[int, int]

    @property
    def box(self) -> tuple[int, int, int, int]:
        return self.top, self.left, self.height, self.width


def _pair(value: int | Sequence[int], name: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, (int, np.integer)) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, (int, np.integer)) and v >= 1 for v in pair):
        raise ValueError(f"{name} must be an int >= 1 or a pair (height, width) of them, got {value!r}")
    return int(pair[0]), int(pair[1])


def _range(value: Sequence[float], name: str) -> tuple[float, float]:
    pair = tuple(float(v) for v in value)
    if len(pair) != 2 or not 0 < pair[0] <= pair[1]:
        raise ValueError(f"{name} must be a pair (lo, hi) with 0 < lo <= hi, got {value!r}")
    return pair  # type: ignore[return-value]


class _BoxTransform(CameraTransform):
    """A transform that resamples a box of each frame to a size: the shared apply methods."""

    def apply(self, frames: np.ndarray, params: CropBox) -> np.ndarray:
        return resized_crop(frames, params.box, params.size)

    def apply_batch(self, frames: Any, params: list[CropBox]) -> Any:
        return resized_crop_batch(frames, [p.box for p in params], params[0].size)


class RandomResizedCrop(_BoxTransform):
    """A random box of area fraction ~ Uniform(scale) and aspect ratio (w / h) ~ exp(Uniform(log ratio)),
    cut out and resized to `size` (bilinear, antialiased: reader/transforms/_resample.py).

    The draw is the Inception-style one torchvision documents: up to 10 tries of (area, ratio) rounded
    to whole pixels, the first box that fits placed uniformly; if none fits, a centre crop of the whole
    frame clamped to the ratio range. One box per window; `shared=True` gives every camera of a sample
    the same random numbers (cameras of one size the same box). `size` an int is a square.
    """

    def __init__(self, size: int | Sequence[int], scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3 / 4, 4 / 3), *,
                 cameras: Sequence[str] | None = None, layout: str = "THWC", shared: bool = False) -> None:
        super().__init__(cameras, layout, shared)
        self.size = _pair(size, "size")
        self.scale = _range(scale, "scale")
        self.ratio = _range(ratio, "ratio")

    def draw_params(self, rng: np.random.Generator, height: int, width: int) -> CropBox:
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top, left = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
                return CropBox(top, left, h, w, self.size)
        aspect = width / height  # fallback: the whole frame, cut to the nearest allowed ratio
        if aspect < self.ratio[0]:
            w, h = width, round(width / self.ratio[0])
        elif aspect > self.ratio[1]:
            w, h = round(height * self.ratio[1]), height
        else:
            w, h = width, height
        return CropBox((height - h) // 2, (width - w) // 2, h, w, self.size)


class Resize(_BoxTransform):
    """Bilinear resize of every frame to `size` (deterministic, no draw). An int sets the shorter edge
    (the other scaled to keep the aspect ratio, truncated), as torchvision's Resize; a pair (h, w) is
    exact. Bilinear, antialiased, as RandomResizedCrop."""

    def __init__(self, size: int | Sequence[int], *, cameras: Sequence[str] | None = None,
                 layout: str = "THWC") -> None:
        super().__init__(cameras, layout, shared=False)
        self.size: int | tuple[int, int] = (_pair(size, "size")[0] if isinstance(size, (int, np.integer))
                                            else _pair(size, "size"))

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        if isinstance(self.size, tuple):
            return self.size
        if height <= width:
            return self.size, int(self.size * width / height)
        return int(self.size * height / width), self.size

    def draw_params(self, rng: np.random.Generator, height: int, width: int) -> CropBox:
        return CropBox(0, 0, height, width, self.output_size(height, width))  # draws nothing


@dataclass(frozen=True)
class Shift:
    """Output pixel (y, x) reads source pixel (y + dy, x + dx), the edge replicated."""

    dy: int
    dx: int


class RandomShift(CameraTransform):
    """DrQ-style shift: the frame padded by `pad` pixels on every side (edge replicated) and cropped back
    to H x W at a random integer offset, i.e. a shift by (dy, dx), each ~ Uniform{-pad, ..., pad}. One
    shift per window; `shared=True`: one for every camera of a sample. Exact (no resampling)."""

    def __init__(self, pad: int = 4, *, cameras: Sequence[str] | None = None, layout: str = "THWC",
                 shared: bool = False) -> None:
        super().__init__(cameras, layout, shared)
        if not isinstance(pad, (int, np.integer)) or pad < 0:
            raise ValueError(f"pad must be an int >= 0 (pixels), got {pad!r}")
        self.pad = int(pad)

    def draw_params(self, rng: np.random.Generator, height: int, width: int) -> Shift:
        dy, dx = rng.integers(-self.pad, self.pad + 1, size=2)
        return Shift(int(dy), int(dx))

    def apply(self, frames: np.ndarray, params: Shift) -> np.ndarray:
        return shift(frames, params.dy, params.dx)

    def apply_batch(self, frames: Any, params: list[Shift]) -> Any:
        return shift_batch(frames, [(p.dy, p.dx) for p in params])
