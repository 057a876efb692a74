"""What every camera transform shares: which fields are camera windows, their layouts, one draw per
window (optionally one for all cameras of a sample), and the two protocols over one pair of methods.

A camera transform only says how to draw its parameters (`draw_params(rng, height, width)`, pure numpy,
so tests can check the draws' distribution) and how to apply them to one window of numpy frames
(`apply(frames [T, H, W, 3] uint8, params)`) and to a batch in torch (`apply_batch(frames [B, T, H, W, 3]
uint8, params: one per element)`). `CameraTransform` does the rest: it finds the fields, brings them to
channel-last, draws once per window (the same numbers for every camera with `shared=True`) and puts
the results back in the field's layout. No torch at import: the batch path imports it when it runs.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

LAYOUTS = ("THWC", "TCHW")


def checked_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'THWC' ([T, H, W, 3], as stored) or 'TCHW' ([T, 3, H, W], "
                         f"ShardDataset(video_layout='TCHW')), got {layout!r}")
    return layout


def checked_cameras(cameras: Sequence[str] | None) -> tuple[str, ...] | None:
    if cameras is None:
        return None
    if isinstance(cameras, str) or not all(isinstance(c, str) for c in cameras):
        raise ValueError(f"cameras must be None (every camera window) or a list of field names, got {cameras!r}")
    return tuple(cameras)


def numpy_rng(generator: Any = None) -> np.random.Generator:
    """A numpy Generator seeded by one draw from a torch.Generator (or, with None, from torch's global
    RNG, so `torch.manual_seed` makes it reproducible): the batch path draws its parameters with the
    same numpy code as a worker does, one element after another."""
    import torch

    device = generator.device if generator is not None else "cpu"
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=device).item())
    return np.random.default_rng(seed)


def _is_uint8(value: Any, batched: bool) -> bool:
    if batched:
        import torch

        return isinstance(value, torch.Tensor) and value.dtype == torch.uint8
    return isinstance(value, np.ndarray) and value.dtype == np.uint8


def _channels(shape: Sequence[int], layout: str, window_ndim: int) -> int | None:
    """The channel count of a window (ndim == window_ndim, channel axis by layout) or of a single
    image (one dim fewer, always channel-last as the reader decodes images); None for anything else."""
    if len(shape) == window_ndim:
        return shape[-1] if layout == "THWC" else shape[-3]
    if len(shape) == window_ndim - 1:
        return shape[-1]
    return None


def camera_fields(sample: dict[str, Any], cameras: tuple[str, ...] | None, layout: str,
                  batched: bool) -> list[str]:
    """The fields to transform, sorted (the draw order). `cameras=None`: every uint8 array of ndim 4
    (a sample's window; 5 in a batch) whose channel axis (by `layout`) has 3 entries; single images
    are left alone. Named fields must be such windows or `[H, W, 3]` images (`[B, H, W, 3]`)."""
    window_ndim = 5 if batched else 4
    if cameras is None:
        return sorted(name for name, value in sample.items()
                      if _is_uint8(value, batched) and value.ndim == window_ndim
                      and _channels(value.shape, layout, window_ndim) == 3)
    for name in cameras:
        if name not in sample:
            raise ValueError(f"camera field {name!r} is not in the {'batch' if batched else 'sample'} "
                             f"(fields: {sorted(sample)}): name fields the reader decodes")
        value = sample[name]
        if not _is_uint8(value, batched) or _channels(value.shape, layout, window_ndim) != 3:
            what = f"{getattr(value, 'dtype', type(value).__name__)} {tuple(getattr(value, 'shape', ()))}"
            raise ValueError(f"camera field {name!r} is {what}, not a uint8 window ({layout}, 3 channels) or "
                             f"[H, W, 3] image{' with a batch dim' if batched else ''}: check `layout` "
                             f"(ShardDataset(video_layout=...)) or leave the field out of `cameras`")
    return sorted(cameras)


def to_thwc(value: Any, layout: str, window_ndim: int) -> Any:
    """A window (or an image, as a window of one frame) as channel-last frames: numpy [T, H, W, 3] or
    torch [B, T, H, W, 3]; a view."""
    if value.ndim == window_ndim - 1:
        return value[..., None, :, :, :]
    if layout == "TCHW":
        return value.swapaxes(-3, -2).swapaxes(-2, -1)  # [.., T, 3, H, W] -> [.., T, H, W, 3]
    return value


def from_thwc(frames: Any, layout: str, like: Any, window_ndim: int) -> Any:
    """`frames` [.., T, H, W, 3] back in the layout of `like` (the field as it came)."""
    if like.ndim == window_ndim - 1:
        return frames[..., 0, :, :, :]
    if layout == "TCHW":
        return frames.swapaxes(-1, -2).swapaxes(-2, -3)  # [.., T, H, W, 3] -> [.., T, 3, H, W]
    return frames


class CameraTransform:
    """Base of the camera transforms: one draw per window from the sample's `rng` (worker path) or per
    batch element from `generator` (batch path); `shared=True` gives every camera of a sample the same
    random numbers (cameras of one size get the same crop, shift and jitter)."""

    def __init__(self, cameras: Sequence[str] | None = None, layout: str = "THWC", shared: bool = False) -> None:
        self.cameras = checked_cameras(cameras)
        self.layout = checked_layout(layout)
        self.shared = bool(shared)

    # -- what a transform defines ----------------------------------------------------------------
    def draw_params(self, rng: np.random.Generator, height: int, width: int) -> Any:
        raise NotImplementedError

    def apply(self, frames: np.ndarray, params: Any) -> np.ndarray:
        """frames [T, H, W, 3] uint8 -> [T, H', W', 3] uint8."""
        raise NotImplementedError

    def apply_batch(self, frames: Any, params: list[Any]) -> Any:
        """frames torch [B, T, H, W, 3] uint8 (any device) -> [B, T, H', W', 3] uint8."""
        raise NotImplementedError

    # -- the two protocols -----------------------------------------------------------------------
    def _draws(self, rng: np.random.Generator, sizes: dict[str, tuple[int, int]]) -> dict[str, Any]:
        """One draw per camera, in name order; with `shared`, every camera draws from the same
        generator state (the generator ends where the last camera's draw left it)."""
        if not self.shared:
            return {name: self.draw_params(rng, h, w) for name, (h, w) in sizes.items()}
        state, out = rng.bit_generator.state, {}
        for name, (h, w) in sizes.items():
            rng.bit_generator.state = state
            out[name] = self.draw_params(rng, h, w)
        return out

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        names = camera_fields(sample, self.cameras, self.layout, batched=False)
        frames = {name: to_thwc(sample[name], self.layout, 4) for name in names}  # [T, H, W, 3] views
        params = self._draws(rng, {name: f.shape[1:3] for name, f in frames.items()})
        out = dict(sample)
        for name in names:
            out[name] = from_thwc(self.apply(frames[name], params[name]), self.layout, sample[name], 4)
        return out

    def batch(self, batch: dict[str, Any], generator: Any = None) -> dict[str, Any]:
        names = camera_fields(batch, self.cameras, self.layout, batched=True)
        if not names:
            return batch
        frames = {name: to_thwc(batch[name], self.layout, 5) for name in names}  # [B, T, H, W, 3] views
        sizes = {name: tuple(f.shape[2:4]) for name, f in frames.items()}
        rng = numpy_rng(generator)
        count = next(iter(frames.values())).shape[0]
        draws = [self._draws(rng, sizes) for _ in range(count)]  # per element, per camera
        out = dict(batch)
        for name in names:
            result = self.apply_batch(frames[name], [d[name] for d in draws])  # [B, T, H', W', 3]
            out[name] = from_thwc(result, self.layout, batch[name], 5).contiguous()
        return out

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({shown})"
