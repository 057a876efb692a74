"""`Normalize`: time-series fields scaled per dimension by the export's statistics, and back.

Why a transform of its own: every policy trainer normalises state and actions, and the details are
where runs go wrong: padded steps must keep the value the export padded them with (else the mask no
longer says what is real), the inverse at inference must undo exactly what training did, and the
numbers must not depend on whether the sample was normalised in a DataLoader worker (numpy) or as a
batch on the GPU (torch). So each mode is one affine map per dimension, written the way its formula
is, `y = (x - shift) * scale + bias`, whose float64 constants are computed once from the manifest's
statistics:

- `mean_std`: (x - mean) / (std + eps)             shift = mean, scale = 1 / (std + eps),         bias = 0
- `min_max`:  2 (x - min) / (max - min + eps) - 1   shift = min,  scale = 2 / (max - min + eps),   bias = -1
- `quantile`: 2 (x - q01) / (q99 - q01 + eps) - 1   shift = q01,  scale = 2 / (q99 - q01 + eps),   bias = -1

and `inverse` is `x = (y - bias) * width + shift` with `width = 1 / scale` (float64-derived too): a
constant dimension (std 0, max == min) maps to 0 or -1 and back to its constant exactly. The same
elementwise operations, in the same order and dtype, run on numpy arrays and on torch tensors (IEEE
subtraction, multiplication and addition are correctly rounded on every device), so both give the
same bits. Costs: O(fields x dims) memory (plus the constants tiled over one window's steps, per
distinct window layout); per sample about 8 numpy calls for all fields together (`__call__`); torch
constants are cached per (device, dtype) the first time a batch arrives there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from robowds.reader.format import MASK_SUFFIX  # `<field>_mask` bool [T] (True = a real step)

MODES = ("mean_std", "min_max", "quantile")
_NEEDS = {"mean_std": ("mean", "std"), "min_max": ("min", "max"), "quantile": ("q01", "q99")}
BIAS = {"mean_std": 0.0, "min_max": -1.0, "quantile": -1.0}  # added after the scaling
_COMPUTE = (np.dtype(np.float32), np.dtype(np.float64))  # dtypes computed in themselves; others in float32


def _affine(field: str, entry: Any, mode: str, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shift, scale, width) float64 [D] of one field's statistics entry under `mode`, checked (the
    bias is `BIAS[mode]`)."""
    fix = "pass one split's statistics as the export wrote them, e.g. ShardDataset(OUT, 'train').stats"
    if not isinstance(entry, Mapping):
        raise ValueError(f"Normalize: the statistics of field {field!r} are {type(entry).__name__}, not a mapping "
                         f"with {', '.join(_NEEDS[mode])}; {fix}")
    lo_key, hi_key = _NEEDS[mode]
    values = []
    for key in (lo_key, hi_key):
        if key not in entry:
            raise ValueError(f"Normalize: the statistics of field {field!r} have no {key!r} (mode {mode!r} needs "
                             f"{lo_key!r} and {hi_key!r}; they have {sorted(entry)}); {fix}")
        try:
            values.append(np.asarray(entry[key], dtype=np.float64).reshape(-1))  # [D]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"Normalize: statistics {field}.{key} is not a list of numbers: {exc}; {fix}") from None
    lo, hi = values
    if len(lo) != len(hi) or len(lo) == 0 or not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        raise ValueError(f"Normalize: statistics {field}.{lo_key} ({len(lo)} values) and {field}.{hi_key} "
                         f"({len(hi)} values) must be equally long, non-empty and finite; {fix}")
    width = hi + eps if mode == "mean_std" else (hi - lo + eps) / 2.0  # std + eps, or half the range
    if (width <= 0).any():
        dims = np.flatnonzero(width <= 0).tolist()
        raise ValueError(f"Normalize: field {field!r} dimensions {dims} have a zero or negative "
                         f"{'std' if mode == 'mean_std' else 'range'} + eps under mode {mode!r}; pass eps > 0 "
                         f"(the default 1e-8 keeps constant dimensions finite)")
    return lo, 1.0 / width, width  # lo: mean, min or q01


class Normalize:
    """Scale time-series fields per dimension by the export's statistics (`ShardDataset(...).stats`).

    `mode` is one of "mean_std", "min_max", "quantile" for every normalised field, or a map
    `{field: mode}` (then only the fields it names are normalised). `fields=None` normalises every
    floating-point field that has statistics and is in the sample (integer and bool fields only when
    named, and they come back as float32); a named field must be in the sample. `clip=(lo, hi)` clips
    the normalised values (`inverse` of a clipped value is just the inverse formula). Steps whose
    `<field>_mask` is False (padding) keep their exported value, bit for bit. The output dtype is the
    input's for floating fields (float16 / bfloat16 are computed in float32 and cast back).

    `t(sample, rng)` on a decoded sample (numpy, in DataLoader workers; the input arrays, possibly
    read-only views of a mapped shard, are never written), `t.batch(batch)` on a collated batch of
    torch tensors [B, T, D] on any device, `t.inverse(array, field)` back to the field's units (numpy
    or torch; e.g. a policy's predicted actions at inference). Picklable; imports torch only when a
    tensor arrives.
    """

    def __init__(self, stats: Mapping[str, Any], mode: str | Mapping[str, str] = "mean_std",
                 fields: Sequence[str] | None = None, eps: float = 1e-8,
                 clip: tuple[float, float] | None = None) -> None:
        if not isinstance(stats, Mapping):
            raise ValueError(f"Normalize: stats must be a mapping field -> statistics, got {type(stats).__name__}; "
                             "pass ShardDataset(OUT, 'train').stats or Mixture.stats(name)")
        if isinstance(fields, str):
            raise ValueError(f"Normalize: fields must be a list of field names, got the string {fields!r}; "
                             f"write fields=[{fields!r}]")
        if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
            raise ValueError(f"Normalize: eps must be a finite number >= 0, got {eps!r}")
        if clip is not None:
            if not (isinstance(clip, Sequence) and len(clip) == 2 and all(isinstance(c, (int, float)) for c in clip)
                    and clip[0] < clip[1]):
                raise ValueError(f"Normalize: clip must be None or (lo, hi) with lo < hi, got {clip!r}")
            clip = (float(clip[0]), float(clip[1]))
        have = sorted(k for k, v in stats.items() if v is not None and "." not in k)  # fields with statistics
        if isinstance(mode, str):
            if mode not in MODES:
                raise ValueError(f"Normalize: unknown mode {mode!r}; use one of {', '.join(MODES)} (or a map field -> mode)")
            modes = {f: mode for f in (have if fields is None else fields)}
        elif isinstance(mode, Mapping):
            modes = dict(mode)
            if fields is not None and set(fields) != set(modes):
                raise ValueError(f"Normalize: fields {sorted(fields)} and the mode map's fields {sorted(modes)} "
                                 "differ; with a mode map leave fields=None (the map names the fields)")
        else:
            raise ValueError(f"Normalize: mode must be one of {MODES} or a map field -> mode, got {mode!r}")
        for field, m in modes.items():
            if m not in MODES:
                raise ValueError(f"Normalize: unknown mode {m!r} for field {field!r}; use one of {', '.join(MODES)}")
            if stats.get(field) is None:
                raise ValueError(f"Normalize: field {field!r} has no statistics (fields with statistics: "
                                 f"{', '.join(have) or 'none'}); leave it out of fields / the mode map, or pass "
                                 "the statistics of the split it comes from")
        self.modes = modes  # field -> mode
        self.named = fields is not None or not isinstance(mode, str)  # named fields must be in every sample
        self.eps, self.clip = float(eps), clip
        self._affine = {f: _affine(f, stats[f], m, self.eps) for f, m in modes.items()}  # float64 [D] x 3
        # the constants in each dtype numpy computes in: (shift, scale, width) [D]
        self._np = {f: {dt: tuple(a.astype(dt) for a in c) for dt in _COMPUTE} for f, c in self._affine.items()}
        self._torch: dict[tuple[str, str, Any], tuple[Any, Any, Any]] = {}  # (field, device, dtype) -> tensors
        self._mask_names = {f: f + MASK_SUFFIX for f in modes}
        self._flat: dict[tuple, tuple] = {}  # (fields, their dtypes and shapes) -> one-buffer plan (`__call__`)

    def __repr__(self) -> str:
        return f"Normalize(modes={self.modes!r}, eps={self.eps!r}, clip={self.clip!r})"

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the cached constants (torch ones may live on a GPU; rebuilt on first use)."""
        return {**self.__dict__, "_torch": {}, "_flat": {}}

    # -- which fields, and checks ----------------------------------------------------------------
    def _targets(self, data: Mapping[str, Any]) -> list[str]:
        """The fields of `data` to normalise: named ones must be there; the default set keeps floating ones."""
        if self.named:
            missing = [f for f in self.modes if f not in data]
            if missing:
                raise ValueError(f"Normalize: field(s) {missing} named in fields / the mode map are not in the sample "
                                 f"(it has {sorted(k for k in data if not k.startswith('__'))}); decode them "
                                 "(ShardDataset fields=) or leave them out of Normalize")
            return list(self.modes)
        return [f for f in self.modes if f in data and _is_floating(data[f])]  # ~1 us for 5 fields

    def _check(self, field: str, shape: tuple[int, ...]) -> None:
        dims = len(self._affine[field][0])
        if not shape or shape[-1] != dims:
            raise ValueError(f"Normalize: field {field!r} has shape {list(shape)} (last dimension "
                             f"{shape[-1] if shape else 'none'}) but its statistics have {dims} values (one per "
                             "dimension); pass the statistics of the export this data comes from "
                             "(ShardDataset(OUT, split).stats)")

    # -- numpy: one sample, in a DataLoader worker -----------------------------------------------
    def __call__(self, sample: dict[str, Any], rng: np.random.Generator | None = None) -> dict[str, Any]:
        """A new sample dict with the fields normalised (new arrays; the input's are not written).

        Why one buffer: a window's fields are small ([10, 7]), so the cost is numpy's per-call
        overhead, not arithmetic. When every field has one dtype (float32 or float64) they are copied
        into one flat buffer and normalised there by the same elementwise operations with the
        constants tiled per step (cached per shape set), about 8 calls per sample instead of 5 per
        field; each field comes back as a contiguous view of its slice. Other dtypes go field by field.
        """
        out = dict(sample)
        targets = self._targets(sample)
        xs = [np.asarray(sample[f]) for f in targets]
        key = (tuple(targets), tuple([(x.dtype, x.shape) for x in xs]))
        plan = self._flat.get(key)
        if plan is None:
            plan = self._flat[key] = self._flat_plan(targets, xs)  # a few entries: one per window layout
        if not plan:  # mixed or other dtypes: field by field
            for field, x in zip(targets, xs):
                out[field] = self._numpy(field, x, sample.get(self._mask_names[field]))
            return out
        shift, scale, bias, slices, mask_names = plan
        y = np.concatenate(xs, axis=None)  # [N]: every field's values, flattened into a new buffer
        np.subtract(y, shift, out=y)
        np.multiply(y, scale, out=y)
        if bias is not None:  # -1 where a field's mode has one (mean_std's slices untouched: -0.0 stays -0.0)
            np.add(y, -1.0, out=y, where=bias)
        if self.clip is not None:
            np.clip(y, self.clip[0], self.clip[1], out=y)
        masks = [sample.get(k) for k in mask_names]  # [T] each, or None
        known = [m for m in masks if m is not None]
        real = np.concatenate(known) if known else None  # usually every step is real: one count for all fields
        padded = real is not None and np.count_nonzero(real) < real.size
        for field, x, mask, part in zip(targets, xs, masks, slices):
            out[field] = view = y[part].reshape(x.shape)
            if padded and mask is not None:
                np.copyto(view, x, where=~np.asarray(mask)[..., None])  # padded steps: the exported value
        return out

    def _flat_plan(self, targets: list[str], xs: list[np.ndarray]) -> tuple:
        """For one buffer of `targets` shaped as `xs`: (shift, scale) [N] tiled over each field's
        steps, where the bias -1 applies (None: nowhere, True: everywhere, else a bool [N]), each field's slice of the buffer and mask name; () when the fields are not all
        float32 or all float64 (then they go field by field)."""
        if not xs or xs[0].dtype not in _COMPUTE or any(x.dtype != xs[0].dtype for x in xs):
            return ()
        dtype = xs[0].dtype
        for field, x in zip(targets, xs):
            self._check(field, x.shape)
        sizes = [x.size for x in xs]
        tiled = [np.concatenate([np.tile(self._np[f][dtype][i], x.size // x.shape[-1]) for f, x in zip(targets, xs)])
                 for i in (0, 1)]  # [N]: shift, scale
        bias = np.concatenate([np.full(n, BIAS[self.modes[f]] != 0) for f, n in zip(targets, sizes)])  # [N] bool
        bounds = np.cumsum([0, *sizes]).tolist()
        return (tiled[0], tiled[1], None if not bias.any() else True if bias.all() else bias, [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])],
                [self._mask_names[f] for f in targets])

    def _numpy(self, field: str, x: Any, mask: Any) -> np.ndarray:
        """One field (any dtype, any leading shape [..., D]) by the same operations as `__call__`."""
        x = np.asarray(x)  # [T, D] (or [B, T, D])
        self._check(field, x.shape)
        dtype = x.dtype if x.dtype in _COMPUTE else np.dtype(np.float32)
        shift, scale, _ = self._np[field][dtype]
        y = np.subtract(x, shift, dtype=dtype)  # a new array: x may be a read-only view of a shard
        np.multiply(y, scale, out=y)
        if BIAS[self.modes[field]]:
            y += BIAS[self.modes[field]]  # a Python float: added in y's dtype
        if self.clip is not None:
            np.clip(y, self.clip[0], self.clip[1], out=y)
        if x.dtype.kind == "f" and x.dtype != dtype:
            y = y.astype(x.dtype)  # float16: computed in float32
        if mask is not None:  # padded steps: the exported value (an integer field's as float32, as torch.where does)
            y = np.where(np.asarray(mask)[..., None], y, x if x.dtype == y.dtype else x.astype(y.dtype))
        return y

    # -- torch: a collated batch on any device ----------------------------------------------------
    def batch(self, batch: dict[str, Any], generator: Any = None) -> dict[str, Any]:
        """A new batch dict with the fields ([B, T, D] tensors on any device, masks `<field>_mask`
        [B, T]) normalised by the same operations as `__call__`: the same numbers. numpy values go
        through the numpy path. `generator` is unused (the protocol's)."""
        out = dict(batch)
        for field in self._targets(batch):
            x, mask = batch[field], batch.get(field + MASK_SUFFIX)
            out[field] = self._numpy(field, x, mask) if isinstance(x, np.ndarray) else self._tensor(field, x, mask)
        return out

    def _constants(self, field: str, x: Any) -> tuple[Any, Any, Any]:
        """(shift, scale, width) tensors [D] of `field` on x's device in its compute dtype (cached)."""
        import torch

        dtype = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
        key = (field, str(x.device), dtype)
        found = self._torch.get(key)
        if found is None:
            np_dtype = np.dtype(np.float64 if dtype == torch.float64 else np.float32)
            found = tuple(torch.from_numpy(a.copy()).to(x.device) for a in self._np[field][np_dtype])
            self._torch[key] = found
        return found

    def _tensor(self, field: str, x: Any, mask: Any) -> Any:
        import torch

        if not isinstance(x, torch.Tensor):
            raise ValueError(f"Normalize: field {field!r} is a {type(x).__name__}, not a numpy array or torch tensor")
        self._check(field, tuple(x.shape))
        shift, scale, _ = self._constants(field, x)
        y = torch.sub(x.to(shift.dtype), shift).mul_(scale)  # the numpy path's operations, in its order
        if BIAS[self.modes[field]]:
            y.add_(BIAS[self.modes[field]])
        if self.clip is not None:
            y.clamp_(self.clip[0], self.clip[1])
        if x.is_floating_point() and x.dtype != y.dtype:
            y = y.to(x.dtype)  # float16 / bfloat16: computed in float32
        if mask is not None:
            y = torch.where(mask.to(torch.bool).unsqueeze(-1), y, x)  # padded steps: the exported value
        return y

    # -- back to the field's units -----------------------------------------------------------------
    def inverse(self, array: Any, field: str) -> Any:
        """`array` [..., D] (numpy or torch, normalised by this transform) back in `field`'s units:
        `(y - bias) * width + shift`. A clipped value comes back as the inverse formula gives it (the clipped
        bound's value), not the original. float32 round trips within ~1e-5 of the field's scale."""
        if field not in self.modes:
            raise ValueError(f"Normalize.inverse: field {field!r} is not normalised by this transform (it normalises "
                             f"{', '.join(self.modes) or 'nothing'})")
        bias = BIAS[self.modes[field]]
        if not isinstance(array, np.ndarray) and type(array).__module__.split(".")[0] == "torch":
            import torch

            self._check(field, tuple(array.shape))
            shift, _, width = self._constants(field, array)
            y = torch.sub(array.to(shift.dtype), bias).mul_(width).add_(shift)  # as the numpy path below
            return y.to(array.dtype) if array.is_floating_point() else y
        x = np.asarray(array)  # [..., D]
        self._check(field, x.shape)
        dtype = x.dtype if x.dtype in _COMPUTE else np.dtype(np.float32)
        shift, _, width = self._np[field][dtype]
        y = np.subtract(x, bias, dtype=dtype)
        np.multiply(y, width, out=y)
        y += shift
        return y.astype(x.dtype) if x.dtype.kind == "f" else y


def _is_floating(value: Any) -> bool:
    """Whether a sample's value is a floating-point array or tensor (the default set's fields)."""
    if isinstance(value, np.ndarray):
        return value.dtype.kind == "f"
    return bool(getattr(value, "is_floating_point", lambda: False)())
