"""Crop-and-resize and integer shifts of camera frames, for workers (numpy in, numpy out) and for
collated batches (torch, any device).

Crop-and-resize is torchvision's `resized_crop` semantics: the box is cut out, then resized bilinearly
with antialiasing (a triangle filter widened by the downscale factor, half-pixel centres, the crop's
edge replicated), by torch's own `F.interpolate(..., mode="bilinear", antialias=True)`. On the CPU it
runs torch's uint8 kernel (fixed point, PIL's arithmetic: within one grey level of PIL's
`Image.resize(BILINEAR)`), in workers too: torch is imported when a window is first resized (a
DataLoader worker has it already), never at module import. Both paths call the same kernel on the
same channels-last uint8 crop, so a window gets the same bytes in a worker and in a CPU batch. Devices
without that kernel (CUDA) resize in float32 and round: within one grey level of the CPU bytes.

Measured (one core of this 2-core machine, 2 frames 224 x 224 -> a 150 x 130 box -> 224 x 224): torch's
uint8 kernel 0.18 ms, PIL `Image.resize(box=...)` per frame 1.07 ms, separable numpy gathers with
precomputed taps several ms (their gathers along W, 3-byte items, are the slow part); the JPEG decode
of the two frames 0.9-1.3 ms.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def _resize(crop: Any, size: tuple[int, int]) -> Any:
    """torch [N, h, w, 3] uint8 (any strides) -> [N, H', W', 3] uint8: bilinear, antialiased."""
    import torch
    import torch.nn.functional as F

    x = crop.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)  # [N, 3, h, w], one kernel path
    if tuple(x.shape[2:]) == tuple(size):
        return x.permute(0, 2, 3, 1)
    if x.device.type == "cpu":
        out = F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
    else:  # no uint8 kernel there
        out = F.interpolate(x.float(), size=size, mode="bilinear", antialias=True, align_corners=False)
        out = out.round_().clamp_(0, 255).to(torch.uint8)
    return out.permute(0, 2, 3, 1)  # [N, H', W', 3]


def resized_crop(frames: np.ndarray, box: tuple[int, int, int, int], size: tuple[int, int]) -> np.ndarray:
    """frames [T, H, W, 3] uint8 -> [T, h, w, 3] uint8: the box (top, left, height, width) of every
    frame resized to size (h, w)."""
    import torch

    top, left, height, width = box
    # a channels-last copy of the box: what the kernel wants, and writable (a sample's arrays may be
    # read-only views of the mapped shard, which torch.from_numpy warns about)
    crop = torch.from_numpy(np.array(frames[:, top:top + height, left:left + width], order="C"))
    return np.ascontiguousarray(_resize(crop, size).numpy())


def resized_crop_batch(frames: Any, boxes: Sequence[tuple[int, int, int, int]], size: tuple[int, int]) -> Any:
    """frames torch [B, T, H, W, 3] uint8 -> [B, T, h, w, 3]: element b's box boxes[b] resized to size.
    Elements whose boxes have one shape are resized in one call (a Resize: the whole batch at once)."""
    import torch

    count, steps = frames.shape[:2]
    out = torch.empty((count, steps, *size, frames.shape[-1]), dtype=torch.uint8, device=frames.device)
    groups: dict[tuple[int, int], list[int]] = {}
    for b, (_, _, height, width) in enumerate(boxes):
        groups.setdefault((height, width), []).append(b)
    for (height, width), members in groups.items():
        crops = torch.stack([frames[b, :, top:top + height, left:left + width]
                             for b in members for top, left in [boxes[b][:2]]])  # [G, T, h, w, 3]
        resized = _resize(crops.flatten(0, 1), size)  # [G * T, h', w', 3]
        out[torch.tensor(members, device=frames.device)] = resized.reshape(len(members), steps, *size, -1)
    return out


def shift_index(size: int, offset: int) -> np.ndarray:
    """[size] source index of each output pixel for a shift by `offset` with the edge replicated."""
    return np.clip(np.arange(size) + offset, 0, size - 1)


def _shift_columns(rows: Any, out: Any, dx: int) -> Any:
    """out[:, :, x] = rows[:, :, clip(x + dx)] by two slice copies (a gather along W, of 3-byte items,
    is several times slower in numpy); works on numpy arrays and torch tensors alike."""
    width = rows.shape[2]
    dx = max(-width, min(width, dx))
    if dx > 0:
        out[:, :, : width - dx], out[:, :, width - dx:] = rows[:, :, dx:], rows[:, :, -1:]
    elif dx < 0:
        out[:, :, -dx:], out[:, :, :-dx] = rows[:, :, : width + dx], rows[:, :, :1]
    else:
        out[...] = rows
    return out


def shift(frames: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """frames [T, H, W, C] -> [T, H, W, C]: out[y, x] = in[clip(y + dy), clip(x + dx)] (exact)."""
    rows = frames[:, shift_index(frames.shape[1], dy)]  # [T, H, W, C]: whole rows, a new array
    return rows if dx == 0 else _shift_columns(rows, np.empty_like(rows), dx)


def shift_batch(frames: Any, shifts: Sequence[tuple[int, int]]) -> Any:
    """frames torch [B, T, H, W, C] -> same shape, element b shifted by shifts[b] = (dy, dx)."""
    import torch

    out = torch.empty_like(frames)
    for b, (dy, dx) in enumerate(shifts):
        rows = frames[b].index_select(1, torch.from_numpy(shift_index(frames.shape[2], dy)).to(frames.device))
        _shift_columns(rows, out[b], dx)
    return out
