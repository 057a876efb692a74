"""Bilinear resampling of a box of each frame to a new size, and integer shifts: with PIL in workers
and torch (batches on any device), the same filter in both.

The filter is PIL's bilinear one: a triangle over the source pixels around each output pixel's centre
(half-pixel centres, the box in pixel units), widened by the downscale factor so that a downscale
averages every source pixel it covers (antialiased, as torchvision's `antialias=True`); taps outside the
image are dropped and the others renormalised. Sampling is in image space: near the box's edge the
filter may read pixels just outside the box (never outside the image). It is separable: the columns
pass first, rounded to uint8, then the rows (PIL's order and intermediate rounding), so the torch path
(`taps` + gathers, in PIL's fixed point: integer weights of 2**-22, sums rounded half up) gives PIL's
`Image.resize(size, BILINEAR, box=...)` bytes (a weight whose last float bit differs can move a value
by one grey level, which the tests allow).

Cost: K = ceil(2 * max(1, downscale)) taps per axis (2 for an upscale). Workers use PIL, per frame (C
code: a 2-frame 224x224 crop-and-resize is a fraction of a millisecond, where the same taps applied with
numpy gathers took several times longer, its column gathers over [T, H, W, 3] being the slow part).
The torch path gathers one tap at a time, so memory stays at a few copies of the output.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


PRECISION_BITS = 22  # PIL's fixed point for 8-bit resampling: weights in units of 2**-22
HALF = 1 << (PRECISION_BITS - 1)


def taps(start: float, length: float, out: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(index [out, K] int64, weight [out, K] int64 in units of 2**-22) of the source pixels
    (0 .. size-1) each of `out` output pixels reads, for the source span [start, start + length) in
    pixel units. The float weights are computed in the order PIL computes them, then made fixed point
    as PIL does, so the torch path's integer sums are PIL's."""
    scale = length / out  # source pixels per output pixel
    support = max(scale, 1.0)  # half-width of the triangle, in source pixels
    centre = start + (np.arange(out) + 0.5) * scale  # [out] output pixel centres in source coordinates
    first = np.floor(centre - 0.5 - support).astype(np.int64) + 1  # [out] first pixel with weight > 0
    k = max(int(np.ceil(2.0 * support)), 1)
    index = first[:, None] + np.arange(k)  # [out, K]
    weight = np.maximum(0.0, 1.0 - np.abs((index - centre[:, None] + 0.5) * (1.0 / support)))  # [out, K]
    weight[(index < 0) | (index >= size)] = 0.0  # outside the image: dropped, the rest renormalised
    weight /= weight.sum(axis=1, keepdims=True)
    fixed = (0.5 + weight * (1 << PRECISION_BITS)).astype(np.int64)  # [out, K], weights >= 0
    return np.clip(index, 0, size - 1), fixed


def box_taps(box: Sequence[float], out_size: tuple[int, int], image: tuple[int, int]) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Row and column taps of a box (top, left, height, width) resampled to out_size (h, w)."""
    top, left, height, width = box
    return taps(top, height, out_size[0], image[0]), taps(left, width, out_size[1], image[1])


def resample(frames: np.ndarray, box: tuple[int, int, int, int], size: tuple[int, int]) -> np.ndarray:
    """frames [T, H, W, 3] uint8 -> [T, h, w, 3] uint8: the box (top, left, height, width) of every
    frame resized to size (h, w) by PIL."""
    from PIL import Image

    top, left, height, width = box
    region = (left, top, left + width, top + height)
    return np.stack([np.asarray(Image.fromarray(frame).resize(size[::-1], Image.Resampling.BILINEAR, box=region))
                     for frame in frames])


def _stack_taps(per_element: list[tuple[np.ndarray, np.ndarray]], device: Any) -> tuple[Any, Any]:
    """Per-element taps padded to one K (index 0, weight 0) -> torch int64 (index, weight) [B, n, K]."""
    import torch

    k = max(index.shape[1] for index, _ in per_element)
    index = np.zeros((len(per_element), per_element[0][0].shape[0], k), np.int64)
    weight = np.zeros(index.shape, np.int64)
    for b, (i, w) in enumerate(per_element):
        index[b, :, : i.shape[1]], weight[b, :, : w.shape[1]] = i, w
    return torch.from_numpy(index).to(device), torch.from_numpy(weight).to(device)


def resample_batch(frames: Any, rows: list[tuple[np.ndarray, np.ndarray]],
                   cols: list[tuple[np.ndarray, np.ndarray]]) -> Any:
    """frames torch [B, T, H, W, C] uint8 -> [B, T, h, w, C] uint8, element b through cols[b] then
    rows[b] (one output size for every element), rounded to uint8 after each pass as PIL does."""
    import torch

    row_index, row_weight = _stack_taps(rows, frames.device)  # [B, h, K]
    col_index, col_weight = _stack_taps(cols, frames.device)  # [B, w, K]
    b = torch.arange(frames.shape[0], device=frames.device)[:, None]  # [B, 1]
    acc = torch.full((), HALF, dtype=torch.int64, device=frames.device)
    for k in range(col_index.shape[2]):  # frames[b, :, :, cols] -> [B, w, T, H, C]
        acc = acc + frames[b, :, :, col_index[:, :, k]].long() * col_weight[:, :, k, None, None, None]
    acc = (acc >> PRECISION_BITS).clamp_(0, 255)  # uint8 values, rounded half up, as PIL
    out = torch.full((), HALF, dtype=torch.int64, device=frames.device)
    for k in range(row_index.shape[2]):  # acc[b, :, :, rows] -> [B, h, w, T, C]
        out = out + acc[b, :, :, row_index[:, :, k]] * row_weight[:, :, k, None, None, None]
    out = out.permute(0, 3, 1, 2, 4)  # [B, T, h, w, C]
    return (out >> PRECISION_BITS).clamp_(0, 255).to(torch.uint8)


def shift_index(size: int, offset: int) -> np.ndarray:
    """[size] source index of each output pixel for a shift by `offset` with the edge replicated."""
    return np.clip(np.arange(size) + offset, 0, size - 1)


def shift(frames: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """frames [T, H, W, C] -> [T, H, W, C]: out[y, x] = in[clip(y + dy), clip(x + dx)] (exact). Rows by
    a gather of whole rows, columns by two slice copies (a numpy gather along W, 3-byte items, is
    several times slower)."""
    rows = frames[:, shift_index(frames.shape[1], dy)]  # [T, H, W, C], a new array
    width = frames.shape[2]
    dx = max(-width, min(width, dx))
    if dx == 0:
        return rows
    out = np.empty_like(rows)
    if dx > 0:
        out[:, :, : width - dx], out[:, :, width - dx :] = rows[:, :, dx:], rows[:, :, -1:]
    else:
        out[:, :, -dx:], out[:, :, :-dx] = rows[:, :, : width + dx], rows[:, :, :1]
    return out


def shift_batch(frames: Any, offsets: np.ndarray) -> Any:
    """frames torch [B, T, H, W, C] -> same shape, element b shifted by offsets[b] = (dy, dx)."""
    import torch

    height, width = frames.shape[2:4]
    rows = np.stack([shift_index(height, int(dy)) for dy, _ in offsets])  # [B, H]
    cols = np.stack([shift_index(width, int(dx)) for _, dx in offsets])  # [B, W]
    rows_t, cols_t = (torch.from_numpy(a).to(frames.device) for a in (rows, cols))
    b = torch.arange(frames.shape[0], device=frames.device)[:, None, None]  # [B, 1, 1]
    out = frames[b, :, rows_t[:, :, None], cols_t[:, None, :]]  # [B, H, W, T, C]
    return out.permute(0, 3, 1, 2, 4)
