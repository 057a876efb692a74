"""Collation of decoded samples into a training batch (`DataLoader(collate_fn=collate)`).

A decoded sample (README, "Output: shards and manifest") holds fixed-shape windows `[T, N]` and their
`[T]` masks, uint8 images `[H, W, C]`, text, a `meta` dict and possibly variable-length arrays (token
ids `[L]` or `[L, D]`). `torch.utils.data.default_collate` fails on the last kind and nests dicts, so
this module keeps one rule per kind of value:

- numeric arrays of one shape -> stacked tensor `[B, ...]`, dtype kept, one copy;
- numeric arrays whose first dim differs -> padded along dim 0 to a length L chosen by the pad mode,
  plus `<field>_pad_mask` bool `[B, L]` (True = real element). Bool arrays pad with False;
- Python / NumPy scalars and 0-d arrays -> tensor `[B]`;
- anything else (str, dict, None, `__key__`, other `__*` fields) -> list of length B.

Pad modes: `batch_max` pads to the longest in the batch; `max_len` to exactly `max_len`, TRUNCATING
longer arrays (their pad mask is all True, the cut-off tail is lost); `multiple_of` to the longest
rounded up to a multiple of `multiple_of` (fewer distinct shapes for compiled / cudnn kernels).
The global mode applies to fields whose lengths happen to differ in a batch. A field named in
`fields` is always padded and always gets its pad mask, so the batch layout does not depend on which
samples a batch drew: list every truly variable-length field there.
A bool `<field>_mask` with the same per-sample length as a padded `<field>` (the exported per-step
masks) is padded to the same L with False and gets no pad mask of its own (`<field>_pad_mask` says it).

A value may also be a `RawArray` (`reader/layout.py`): a fixed-shape array's bytes in place in the
mapped shard, as `ShardDataset` hands them to `Collate` (the batch path). A field whose values are
all RawArrays of one native dtype and one shape, and that would be stacked, is filled by copying
each sample's bytes straight into its row of the batch tensor (one memcpy per sample and field, no
ndarray built); in any other case the RawArrays become ndarrays first. Either way the batch is the
one the ndarrays would give, byte for byte.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import get_worker_info

from robowds.reader.format import MASK_SUFFIX
from robowds.reader.layout import RawArray

PAD_MODES = ("batch_max", "max_len", "multiple_of")
PAD_MASK_SUFFIX = "_pad_mask"
_SPEC_KEYS = frozenset({"pad", "max_len", "multiple_of", "pad_value"})
_NUMERIC_KINDS = "biufc"  # bool, int, uint, float, complex: what torch.from_numpy takes
_IMAGE_CHANNELS = (1, 3, 4)


def _is_array(v: Any) -> bool:
    return isinstance(v, np.ndarray) and v.ndim >= 1 and v.dtype.kind in _NUMERIC_KINDS


def _is_scalar(v: Any) -> bool:
    if isinstance(v, (bool, int, float)):
        return True
    return isinstance(v, (np.generic, np.ndarray)) and v.ndim == 0 and v.dtype.kind in _NUMERIC_KINDS


def _native(dtype: np.dtype) -> np.dtype:
    """torch.from_numpy rejects non-native byte order (e.g. '>f4' from a foreign .npy)."""
    return dtype if dtype.isnative else dtype.newbyteorder("=")


def _check_spec(spec: dict[str, Any], where: str) -> dict[str, Any]:
    """Fail at construction rather than on the first odd batch deep inside a DataLoader worker."""
    unknown = set(spec) - _SPEC_KEYS
    if unknown:
        raise ValueError(f"{where}: unknown padding option(s) {sorted(unknown)}; allowed {sorted(_SPEC_KEYS)}")
    if spec["pad"] not in PAD_MODES:
        raise ValueError(f"{where}: pad must be one of {PAD_MODES}, got {spec['pad']!r}")
    for name in ("max_len", "multiple_of"):
        v = spec[name]
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{where}: {name} must be a positive int, got {v!r}")
    if spec["pad"] != "batch_max" and spec[spec["pad"]] is None:  # the mode is named after its parameter
        raise ValueError(f"{where}: pad={spec['pad']!r} needs {spec['pad']}=<int>")
    return spec


def _fill_value(pad_value: float, dtype: np.dtype, field: str) -> Any:
    """Bool pads with False (padding is never real); ints refuse a value they would silently wrap."""
    if dtype.kind == "b":
        return False
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if not float(pad_value).is_integer() or not info.min <= pad_value <= info.max:
            raise ValueError(f"field {field!r}: pad_value {pad_value!r} does not fit dtype {dtype}")
    return pad_value


@dataclass(frozen=True)
class _Planned:
    """A batch tensor to allocate, and how to write its values into its numpy view."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fill: Callable[[np.ndarray], Any]


ALIGN = 64  # bytes: each tensor of a shared batch starts on a cache line


StorageFn = Callable[[int], "torch.UntypedStorage | None"]  # bytes -> a shared storage to reuse, or None


def _allocate(planned: list[_Planned], storage_fn: StorageFn | None = None) -> list[torch.Tensor]:
    """Uninitialised tensors for one batch.

    Inside a DataLoader worker they are views of ONE shared-memory storage, so the batch reaches the
    main process without being copied into shared memory on the way (torch's default_collate also
    allocates shared), and as one file descriptor: torch sends each storage's descriptor over a
    socket connection of its own, and a batch of 12 tensors took 9-12 ms to cross that way against
    1.8 ms as one storage (2 workers, this machine). Elsewhere one plain tensor each, so keeping
    one field does not keep the whole batch alive. `storage_fn` (a worker's slot pool,
    `reader/batching.py`) may supply a reused shared storage instead of a fresh one."""
    if not planned:
        return []
    dtypes = [torch.from_numpy(np.empty(0, p.dtype)).dtype for p in planned]
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)  # what default_collate uses too
    if get_worker_info() is None or new_shared is None:
        return [torch.empty(p.shape, dtype=d) for p, d in zip(planned, dtypes)]
    offsets, total = [], 0
    for p in planned:
        offsets.append(total)
        total += -(-math.prod(p.shape) * p.dtype.itemsize // ALIGN) * ALIGN
    storage = storage_fn(total) if storage_fn is not None else None
    if storage is None:
        storage = new_shared(max(1, total))
    return [torch.empty(0, dtype=d).set_(storage, offset // p.dtype.itemsize, p.shape)
            for p, d, offset in zip(planned, dtypes, offsets)]


def _stack(arrays: list[np.ndarray], dtype: np.dtype) -> _Planned:
    """np.stack into a batch tensor: [B, ...], one copy."""
    def fill(out: np.ndarray) -> None:
        np.stack(arrays, out=out, casting="same_kind")  # dtypes are equal up to byte order
    return _Planned((len(arrays), *arrays[0].shape), dtype, fill)


def _pack(arrays: list[np.ndarray], length: int, dtype: np.dtype, fill_value: Any, channels_first: bool) -> _Planned:
    """Copy each array (cut or padded to `length` along dim 0) into one new buffer: one copy in all.
    With channels_first the buffer is allocated [B, C, L, W] and written through a [B, L, W, C] view,
    so the result is contiguous NCHW without a second copy."""
    b, rest = len(arrays), arrays[0].shape[1:]
    shape = (b, rest[1], length, rest[0]) if channels_first else (b, length, *rest)  # [B, C, H, W] / [B, L, ...]

    def fill(out: np.ndarray) -> None:
        view = out.transpose(0, 2, 3, 1) if channels_first else out  # [B, H, W, C] / [B, L, ...]
        for i, a in enumerate(arrays):
            n = min(len(a), length)
            view[i, :n] = a[:n]
            if n < length:
                view[i, n:] = fill_value
    return _Planned(shape, dtype, fill)


def _rows(raws: list[RawArray]) -> _Planned:
    """Each sample's bytes into its row of a [B, *shape] tensor: one memcpy per sample, nothing decoded.
    (np.stack of ndarray views over the same bytes costs ~1 us per sample more in building the views
    and ~20 us per field in np.stack's own checks; for 4 KB samples that was most of collation.)"""
    first = raws[0]
    size = len(first.data)

    def fill(out: np.ndarray) -> None:
        rows = memoryview(out.reshape(-1).view(np.uint8))  # [B * size] bytes, out is C-contiguous
        for i, raw in enumerate(raws):
            rows[i * size:(i + 1) * size] = raw.data
    return _Planned((len(raws), *first.shape), first.dtype, fill)


def _direct(values: list[Any]) -> bool:
    """Whether a field's values can be copied row by row: RawArrays of one native numeric dtype and shape."""
    first = values[0]
    if not isinstance(first, RawArray) or not first.dtype.isnative or first.dtype.kind not in _NUMERIC_KINDS:
        return False
    return all(isinstance(v, RawArray) and v.dtype == first.dtype and v.shape == first.shape for v in values)


def _as_array(value: Any) -> Any:
    if isinstance(value, RawArray):
        return np.frombuffer(value.data, value.dtype).reshape(value.shape)
    return value


def _pad_mask(lengths: list[int], length: int) -> _Planned:
    def fill(out: np.ndarray) -> None:
        np.less(np.arange(length)[None, :], np.asarray(lengths)[:, None], out=out)
    return _Planned((len(lengths), length), np.dtype(np.bool_), fill)  # [B, L]


class Collate:
    """Picklable collate_fn (plain attributes), so DataLoader workers can use it.

    fields: per-field overrides of `pad`, `max_len`, `multiple_of`, `pad_value`, e.g.
    `{"tokens": {"pad": "multiple_of", "multiple_of": 8, "pad_value": -1}}`; unset keys take the
    constructor's values. channels_first: uint8 `[H, W, C]` arrays (C in 1, 3, 4) become contiguous
    `[B, C, H, W]` (what torchvision / conv layers take); images whose H differs are padded first and
    their pad mask indexes H.
    """

    def __init__(self, pad: str = "batch_max", max_len: int | None = None, multiple_of: int | None = None,
                 pad_value: float = 0, fields: dict[str, dict] | None = None, channels_first: bool = False) -> None:
        base = {"pad": pad, "max_len": max_len, "multiple_of": multiple_of, "pad_value": pad_value}
        self.default = _check_spec(base, "Collate")
        for name, spec in (fields or {}).items():
            if not isinstance(spec, dict):
                raise ValueError(f"fields[{name!r}] must be a dict of padding options, got {spec!r}")
        self.fields = {name: _check_spec({**base, **spec}, f"fields[{name!r}]")
                       for name, spec in (fields or {}).items()}
        self.channels_first = channels_first

    def __call__(self, samples: list[dict]) -> dict:
        return self.collate(samples)

    def collate(self, samples: list[dict], storage_fn: StorageFn | None = None) -> dict:
        """The batch of `samples`; in a DataLoader worker its tensors lie in one shared storage, which
        `storage_fn` may supply (a reused one, `reader/batching.py`)."""
        if not samples:
            raise ValueError("cannot collate an empty batch")
        keys = [s.get("__key__", f"<sample {i} without __key__>") for i, s in enumerate(samples)]
        names = list(dict.fromkeys(name for s in samples for name in s))  # ordered union
        for name in names:
            for s, key in zip(samples, keys):
                if name not in s:
                    raise ValueError(f"field {name!r} is missing from sample {key!r}")
        # Per-step masks are done after their field, whatever the dict order, to reuse its length.
        paired = {n for n in names if n.endswith(MASK_SUFFIX) and n[:-len(MASK_SUFFIX)] in names}
        out: dict[str, Any] = {}  # name -> list (passed through) or _Planned (a tensor to make)
        padded: dict[str, tuple[list[int], int]] = {}  # field -> (per-sample lengths, L)
        for name in [n for n in names if n not in paired] + [n for n in names if n in paired]:
            values = [s[name] for s in samples]
            base = padded.get(name[:-len(MASK_SUFFIX)]) if name in paired else None
            if any(isinstance(v, RawArray) for v in values):
                if base is None and self._stacks(name, values):
                    if name + PAD_MASK_SUFFIX in names:
                        raise ValueError(f"field {name + PAD_MASK_SUFFIX!r} in the samples clashes with the pad mask "
                                         f"of {name!r}")
                    out[name] = _rows(values)  # [B, *shape]
                    continue
                values = [_as_array(v) for v in values]
            if base is not None and all(_is_array(v) and v.dtype.kind == "b" and len(v) == n
                                        for v, n in zip(values, base[0])):
                out[name] = self._arrays(name, values, keys, length=base[1])[0]  # padded with False
            elif name in self.fields and not all(map(_is_array, values)):
                raise ValueError(f"field {name!r} is configured for padding but its values are not numeric arrays")
            elif name.startswith("__") or not (all(map(_is_array, values)) or all(map(_is_scalar, values))):
                out[name] = values  # str, dict, None, keys: nothing to stack
            elif _is_scalar(values[0]):
                scalars = [np.asarray(v) for v in values]
                out[name] = _stack(scalars, _native(np.result_type(*scalars)))  # [B]
            else:
                mask_name = name + PAD_MASK_SUFFIX
                if mask_name in names:
                    raise ValueError(f"field {mask_name!r} in the samples clashes with the pad mask of {name!r}")
                out[name], pad_mask = self._arrays(name, values, keys)
                if pad_mask is not None:
                    out[mask_name] = pad_mask
                    padded[name] = ([len(v) for v in values], pad_mask.shape[1])
        order = [m for n in names for m in (n, n + PAD_MASK_SUFFIX) if m in out]
        planned = [n for n in order if isinstance(out[n], _Planned)]
        for name, tensor in zip(planned, _allocate([out[n] for n in planned], storage_fn)):
            out[name].fill(tensor.numpy())
            out[name] = tensor
        return {n: out[n] for n in order}

    def _stacks(self, name: str, values: list[Any]) -> bool:
        """Whether `values` (RawArrays) would be stacked as they are: not padded (not in `fields`),
        not a channels-first image, and all of one native dtype and shape."""
        if name.startswith("__") or name in self.fields or not _direct(values):
            return False
        first = values[0]
        return not (self.channels_first and first.dtype == np.uint8 and len(first.shape) == 3
                    and first.shape[-1] in _IMAGE_CHANNELS)

    def _arrays(self, name: str, arrays: list[np.ndarray], keys: list[str],
                length: int | None = None) -> tuple[_Planned, _Planned | None]:
        """(stacked or padded tensor, pad mask or None) for one numeric-array field, planned; `length`
        forces padding to that length (a per-step mask following its field)."""
        first = arrays[0]
        if any(a.shape[1:] != first.shape[1:] for a in arrays):
            seen: dict[tuple[int, ...], str] = {}
            for a, key in zip(arrays, keys):
                seen.setdefault(a.shape, key)  # each distinct shape with the first sample that has it
            shapes = ", ".join(f"{shape} (sample {key!r})" for shape, key in seen.items())
            raise ValueError(f"field {name!r}: arrays differ in dimensions other than the first: {shapes}")
        dtypes = {a.dtype for a in arrays}
        if len(dtypes) > 1:
            raise ValueError(f"field {name!r}: arrays have different dtypes {sorted(map(str, dtypes))}")
        dtype = _native(first.dtype)
        channels_first = (self.channels_first and dtype == np.uint8 and first.ndim == 3
                          and first.shape[-1] in _IMAGE_CHANNELS)
        lengths = [len(a) for a in arrays]
        pad = length is not None or name in self.fields or len(set(lengths)) > 1
        if not pad and not channels_first:
            return _stack(arrays, dtype), None  # [B, T, ...]: one copy
        if not pad:
            return _pack(arrays, lengths[0], dtype, None, True), None  # [B, C, H, W]
        spec = self.fields.get(name, self.default)
        if length is None and spec["pad"] == "max_len":
            length = spec["max_len"]
        elif length is None:
            step = spec["multiple_of"] if spec["pad"] == "multiple_of" else 1
            length = -(-max(lengths) // step) * step  # longest, rounded up
        fill = _fill_value(spec["pad_value"], dtype, name)
        return _pack(arrays, length, dtype, fill, channels_first), _pad_mask(lengths, length)  # [B, L, ...], [B, L]


collate = Collate()  # the default instance: batch_max padding with 0 / False
