"""`ColorJitter`: brightness, contrast, saturation and hue, one draw of the four factors per window,
applied as one affine map of RGB per frame (PIL on numpy frames in workers, batched torch on any device).

The colour maths (in float, on 0..255 values, rounded and clipped to uint8 once at the end):

- brightness b:  x -> b x
- contrast c:    x -> c x + (1 - c) m, m the frame's mean luma (so a black padded frame stays black)
- saturation s:  x -> s x + (1 - s) luma(x)
- hue h:         rotation of the chroma plane of YIQ by 2 pi h (h in turns, luma kept; h > 0 turns red
                 towards yellow, as HSV counts hue), which is close
                 to adding h to HSV's hue and is linear, where HSV's shift is not
with luma = 0.299 R + 0.587 G + 0.114 B (torchvision's grayscale, and YIQ's Y). In YIQ each op scales or
rotates the chroma (I, Q) and maps luma affinely, so without clipping between them the four commute:
the order is irrelevant and the whole jitter is RGB' = A RGB + beta m (A [3, 3], per window, beta a
per-window scalar, m per frame). torchvision clips after each op in a drawn order; this clips once.
Factors are drawn as torchvision's: b ~ Uniform(max(0, 1 - brightness), 1 + brightness) (or the
given (lo, hi)), likewise c and s, h ~ Uniform(-hue, hue) with hue <= 0.5; always in the order b, c, s,
h, all four drawn even when one is off (its range is one point), so the stream does not depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from robowds.reader.transforms._images import CameraTransform

RGB_TO_YIQ = np.array([[0.299, 0.587, 0.114],  # Y: luma
                       [0.596, -0.274, -0.322],  # I
                       [0.211, -0.523, 0.312]])  # Q   (NTSC 1953)
YIQ_TO_RGB = np.linalg.inv(RGB_TO_YIQ)
LUMA = RGB_TO_YIQ[0].astype(np.float32)  # [3]
LUMA_OFFSET = YIQ_TO_RGB[:, 0].astype(np.float32)  # [3] the RGB change of +1 luma: (1, 1, 1) to float precision


@dataclass(frozen=True)
class JitterFactors:
    brightness: float
    contrast: float
    saturation: float
    hue: float

    def affine(self) -> tuple[np.ndarray, float]:
        """(A [3, 3] float32, beta): the frame's RGB' = A RGB + beta * mean_luma (per channel)."""
        b, c, s, h = self.brightness, self.contrast, self.saturation, self.hue
        angle = -2.0 * np.pi * h  # this sign turns hue the way HSV counts it (red -> yellow for h > 0)
        cos, sin = np.cos(angle), np.sin(angle)
        scale = np.array([[b * c, 0.0, 0.0],
                          [0.0, b * c * s * cos, -b * c * s * sin],
                          [0.0, b * c * s * sin, b * c * s * cos]])  # [3, 3] on (Y, I, Q)
        a = YIQ_TO_RGB @ scale @ RGB_TO_YIQ
        # the luma offset b (1 - c) m enters Y only; YIQ_TO_RGB's first column is (1, 1, 1)
        return a.astype(np.float32), float(b * (1.0 - c))


def _factor_range(value: float | Sequence[float], name: str) -> tuple[float, float]:
    """(lo, hi) of a factor's uniform draw: a number v gives (max(0, 1 - v), 1 + v), for hue (-v, v)."""
    hue = name == "hue"
    if isinstance(value, (int, float, np.floating, np.integer)):
        if not 0 <= value <= (0.5 if hue else np.inf):
            raise ValueError(f"{name} must be {'in [0, 0.5]' if hue else '>= 0'} or a pair (lo, hi), got {value!r}")
        return (-float(value), float(value)) if hue else (max(0.0, 1.0 - value), 1.0 + value)
    pair = tuple(float(v) for v in value)
    if len(pair) != 2 or not (-0.5 if hue else 0.0) <= pair[0] <= pair[1] <= (0.5 if hue else np.inf):
        raise ValueError(f"{name} must be a number or a pair (lo, hi) with "
                         f"{'-0.5 <= lo <= hi <= 0.5' if hue else '0 <= lo <= hi'}, got {value!r}")
    return pair  # type: ignore[return-value]


class ColorJitter(CameraTransform):
    """Random brightness, contrast, saturation and hue (see the module docstring for the maths), one draw
    per window; `shared=True`: the same factors for every camera of a sample. A factor of 0 is off."""

    def __init__(self, brightness: float | Sequence[float] = 0, contrast: float | Sequence[float] = 0,
                 saturation: float | Sequence[float] = 0, hue: float | Sequence[float] = 0, *,
                 cameras: Sequence[str] | None = None, layout: str = "THWC", shared: bool = False) -> None:
        super().__init__(cameras, layout, shared)
        self.brightness = _factor_range(brightness, "brightness")
        self.contrast = _factor_range(contrast, "contrast")
        self.saturation = _factor_range(saturation, "saturation")
        self.hue = _factor_range(hue, "hue")

    def draw_params(self, rng: np.random.Generator, height: int, width: int) -> JitterFactors:
        return JitterFactors(*(float(rng.uniform(*r)) for r in (self.brightness, self.contrast, self.saturation,
                                                                 self.hue)))

    def apply(self, frames: np.ndarray, params: JitterFactors) -> np.ndarray:
        """Per frame, PIL's `convert("RGB", matrix)` (the affine map in C: float32, rounded half up,
        clipped) with the mean luma from PIL's histogram (exact); several times faster than the same
        maths in numpy, whose reductions over [H, W] of uint8 are slow."""
        from PIL import Image

        a, beta = params.affine()
        out = []
        for frame in frames:  # [H, W, 3]
            image = Image.fromarray(frame)
            mean = 0.0
            if beta != 0.0:
                counts = np.asarray(image.histogram(), np.float64).reshape(3, 256)  # [3, 256]
                mean = float(LUMA.astype(np.float64) @ (counts @ np.arange(256.0))) / (frame.shape[0] * frame.shape[1])
            offset = beta * mean * LUMA_OFFSET  # [3]
            out.append(np.asarray(image.convert("RGB", tuple(np.column_stack([a, offset]).ravel()))))
        return np.stack(out)

    def apply_batch(self, frames: Any, params: list[JitterFactors]) -> Any:
        import torch

        affines = [p.affine() for p in params]
        a = torch.from_numpy(np.stack([m for m, _ in affines])).to(frames.device)  # [B, 3, 3]
        beta = torch.tensor([b for _, b in affines], dtype=torch.float32, device=frames.device)  # [B]
        x = frames.float()  # [B, T, H, W, 3]
        out = torch.einsum("bthwc,bdc->bthwd", x, a)
        mean = x.mean(dim=(2, 3)) @ torch.from_numpy(LUMA).to(frames.device)  # [B, T]
        out += (beta[:, None] * mean)[:, :, None, None, None] * torch.from_numpy(LUMA_OFFSET).to(out.device)
        return out.add_(0.5).floor_().clamp_(0, 255).to(torch.uint8)  # rounded half up, as PIL
