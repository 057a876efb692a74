"""RLDS `features.json` -> the store fields, and the pure mapping of one record's flat values.

`features.json` is TFDS's JSON form of its `FeaturesDict` (`tensorflow_datasets/core/proto/feature.proto`):
nested dicts whose leaves are `tensor` (Tensor, Scalar: shape, dtype, encoding), `classLabel`, `image`
(shape, dtype, encodingFormat), `text`, `boundingBox`; RLDS puts the per-step features in the
`steps` sequence (`sequence.feature`) and the per-episode ones beside it (`episode_metadata`).

In a record (one `tf.train.Example` per episode) the step features are flattened along time: key
`steps/observation/state` holds T x 7 floats in one `float_list`, `steps/observation/image_0` T encoded
images in one `bytes_list`. The functions below undo that, given T, with no I/O.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from robowds.export.convert.episode_store import field_name
from robowds.export.errors import UserError

RESERVED = ("episode_id", "split", "start_s", "end_s", "meta")  # store columns a field may not be named
# nominal control rates of Open-X datasets (their papers / the Open X-Embodiment dataset sheet): RLDS
# stores no time, so the rate comes from here or from --fps
KNOWN_FPS = {"bridge_dataset": 5.0, "bridge": 5.0, "bridge_orig": 5.0, "droid": 15.0, "fractal20220817_data": 3.0}
WIDENED = {"float16": "float32", "bfloat16": "float32"}  # the store keeps float32/float64 (exact widening)
NUMERIC = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64")


@dataclass(frozen=True)
class Feature:
    """One leaf of features.json and the store field it becomes."""

    key: str  # its key in the Example: "steps/observation/state", "episode_metadata/file_path"
    field: str  # the store field name: "observation_state", "episode_file_path"
    step: bool  # per step (under `steps`) or once per episode
    kind: str  # the store kind: "timeseries" | "video" | "text" | "value"
    dtype: str  # the values' numpy dtype in the store ("str" for text, "uint8" for images)
    shape: tuple[int, ...]  # per step / per episode, as declared (-1: any length)
    encoding: str  # tensors: "none" | "bytes" | "zlib"; images: "jpeg" | "png" | "" (any)
    problem: str | None = None  # why it cannot be mapped (then it must be excluded)


def _shape(spec: dict[str, Any]) -> tuple[int, ...]:
    dims = (spec.get("shape") or {}).get("dimensions") or []
    return tuple(int(d) if d is not None else -1 for d in dims)


def _leaf(key: str, node: dict[str, Any], step: bool) -> Feature:
    """One features.json leaf -> a Feature (with `problem` set when the store has no place for it)."""
    cls = str(node.get("pythonClassName", "")).rsplit(".", 1)[-1] or "?"
    if "text" in node:
        return Feature(key, "", step, "text", "str", (), "")
    if "image" in node:
        spec = node["image"]
        shape, dtype = _shape(spec), str(spec.get("dtype", "uint8"))
        channels = shape[-1] if len(shape) == 3 else -1
        problem = None
        if not step:
            problem = "an image per episode (the store takes per-step images as video)"
        elif dtype != "uint8" or channels not in (1, 3, -1):
            problem = f"a {dtype} image with {channels} channels (videos take uint8 RGB or grey)"
        return Feature(key, "", step, "video", "uint8", shape, str(spec.get("encodingFormat") or ""), problem)
    if "tensor" in node or "boundingBox" in node or "classLabel" in node:
        spec = node.get("tensor") or node.get("boundingBox") or {}
        dtype = "int64" if "classLabel" in node else str(spec.get("dtype", "float32"))
        shape = _shape(spec) if "classLabel" not in node else ()
        encoding = str(spec.get("encoding") or "none").lower()
        if dtype == "string":
            problem = None if shape == () else f"a string tensor of shape {list(shape)}"
            return Feature(key, "", step, "text", "str", shape, encoding, problem)
        dtype = WIDENED.get(dtype, dtype)
        problem = None if dtype in NUMERIC else f"dtype {dtype}"
        if encoding not in ("none", "bytes", "zlib"):
            problem = f"tensor encoding {encoding!r}"
        return Feature(key, "", step, "timeseries" if step else "value", dtype, shape, encoding, problem)
    return Feature(key, "", step, "value", "", (), "", f"a {cls} feature")


def _walk(node: dict[str, Any], prefix: str, step: bool) -> list[Feature]:
    """The leaves under `node` (a FeaturesDict or a leaf), keys joined with '/' as in the Example."""
    features = (node.get("featuresDict") or {}).get("features")
    if features is not None:
        return [leaf for name in sorted(features) for leaf in _walk(features[name], f"{prefix}{name}/", step)]
    key = prefix.rstrip("/")
    if "sequence" in node:
        if step or key != "steps":  # a sequence inside the steps, or a second one beside them
            return [Feature(key, "", step, "value", "", (), "", "a nested sequence")]
        return _walk(node["sequence"].get("feature") or {}, prefix, True)
    return [_leaf(key, node, step)]


def read_features(spec: dict[str, Any], where: str) -> list[Feature]:
    """features.json (parsed) -> every leaf with its store field name, in key order. Step features are
    named by their path under `steps` (`observation/state` -> `observation_state`), those of
    `episode_metadata` get the prefix `episode_` (`episode_file_path`), any other by its key."""
    top = (spec.get("featuresDict") or {}).get("features")
    if not isinstance(top, dict) or "sequence" not in (top.get("steps") or {}):
        raise UserError(f"{where}: not an RLDS dataset: features.json has no `steps` sequence feature",
                        hint="pass the folder of an RLDS (Open X-Embodiment) dataset, holding features.json "
                             "and its *.tfrecord-* files")
    leaves = [leaf for name in sorted(top) for leaf in _walk(top[name], f"{name}/", False)]
    named = _field_names([f.key for f in leaves])
    return [Feature(f.key, named[f.key], f.step, f.kind, f.dtype, f.shape, f.encoding, f.problem) for f in leaves]


def _field_names(keys: Sequence[str]) -> dict[str, str]:
    """Feature keys -> distinct field names, none a reserved column; a clash gets `_2`, `_3`... in key
    order (`episode_store.unique_names` would merge two keys whose base names are equal)."""
    taken, out = set(RESERVED), {}
    for key in keys:
        base = name = field_name(_base_name(key))
        k = 2
        while name in taken:
            name = base[: 32 - len(f"_{k}")] + f"_{k}"
            k += 1
        out[key] = name
        taken.add(name)
    return out


def _base_name(key: str) -> str:
    """The key a field name is made from (before `field_name`'s cleaning and de-duplication)."""
    if key.startswith("steps/"):
        return key[len("steps/"):]
    if key.startswith("episode_metadata/"):
        return "episode_" + key[len("episode_metadata/"):]
    return key


def episode_spans(is_first: np.ndarray | None, is_last: np.ndarray | None, steps: int) -> list[tuple[int, int]]:
    """The episodes [start, end) that the RLDS flags mark in a record of `steps` steps.

    An episode runs from an `is_first` step (the record's first step when none is set before it) to its
    first `is_last` step, inclusive, or up to the next `is_first`, or to the end of the record. Steps
    after an `is_last` and before the next `is_first` belong to no episode. A record whose flags are
    never set (Bridge leaves `is_last` 0 everywhere) is one episode, every step."""
    first = np.flatnonzero(np.asarray(is_first)) if is_first is not None and len(is_first) == steps else []
    last = np.flatnonzero(np.asarray(is_last)) if is_last is not None and len(is_last) == steps else []
    spans: list[tuple[int, int]] = []
    start: int | None = int(first[0]) if len(first) else 0
    while start is not None and start < steps:
        ends = [steps, *(int(k) for k in first if k > start)][:2] + [int(k) + 1 for k in last if k >= start][:1]
        end = min(ends)
        spans.append((start, end))
        start = next((int(k) for k in first if k >= end), None)
    return spans


def step_count(raw: dict[str, Any], features: Sequence[Feature], where: str) -> int:
    """T of a record: the length of `steps/is_first` (every RLDS step has it), else of the first step
    feature whose size per step is known (`step_values` checks the others against it)."""
    if isinstance(raw.get("steps/is_first"), np.ndarray):  # read even when the field is excluded
        return len(raw["steps/is_first"])
    for f in (f for f in features if f.step and f.key in raw):
        if f.kind in ("video", "text") or f.encoding in ("bytes", "zlib"):
            return len(raw[f.key])  # one element per step
        if all(d >= 0 for d in f.shape) and int(np.prod(f.shape)) > 0:
            return len(raw[f.key]) // int(np.prod(f.shape))
    raise UserError(f"{where}: no per-step feature tells the number of steps",
                    hint="check the record against features.json, or pass --skip-bad")


def step_values(values: Any, feature: Feature, steps: int, where: str) -> np.ndarray:
    """One step feature's flat record values -> [T, N] in the feature's dtype (N = the per-step size;
    a [7] tensor gives N = 7, a scalar N = 1, a [2, 3] tensor N = 6 in row-major order)."""
    if feature.encoding in ("bytes", "zlib"):  # one raw little-endian tensor per step, as bytes
        if len(values) != steps:
            raise UserError(f"{where}: feature {feature.key!r} has {len(values)} encoded tensors for {steps} steps",
                            hint=f"exclude it with --exclude {feature.key}, or pass --skip-bad")
        blobs = [zlib.decompress(b) if feature.encoding == "zlib" else b for b in values]
        stored = np.dtype(feature.dtype).newbyteorder("<") if feature.dtype != "bool" else np.dtype(bool)
        flat = np.frombuffer(b"".join(blobs), dtype=stored)
    else:
        flat = np.asarray(values)
    if steps == 0 or len(flat) % steps:
        raise UserError(f"{where}: feature {feature.key!r} has {len(flat)} values, not a multiple of {steps} steps",
                        hint=f"exclude it with --exclude {feature.key}, or pass --skip-bad")
    width = len(flat) // steps
    declared = int(np.prod(feature.shape)) if feature.shape and min(feature.shape) >= 0 else width
    if width != declared:
        raise UserError(f"{where}: feature {feature.key!r} has {width} values per step, features.json says "
                        f"{declared} (shape {list(feature.shape)})", hint=f"exclude it with --exclude {feature.key}")
    return typed(flat, feature, where).reshape(steps, width)  # [T, N]


def typed(flat: np.ndarray, feature: Feature, where: str) -> np.ndarray:
    """Record values (float32 from float_list, int64 from int64_list) in the declared dtype: bools from
    0/1, integers range-checked (a value the dtype cannot hold is an error, never wrapped)."""
    dtype = np.dtype(feature.dtype)
    if dtype == flat.dtype:
        return flat
    if dtype.kind == "b":
        return flat != 0
    if dtype.kind in "iu" and flat.dtype.kind in "iu" and len(flat):
        info = np.iinfo(dtype)
        if flat.min() < info.min or flat.max() > info.max:
            raise UserError(f"{where}: feature {feature.key!r} holds {int(flat.min())}..{int(flat.max())}, "
                            f"outside {feature.dtype}", hint=f"exclude it with --exclude {feature.key}")
    if dtype.kind in "iub" and flat.dtype.kind == "f":
        raise UserError(f"{where}: feature {feature.key!r} is {feature.dtype} in features.json but stored as floats",
                        hint=f"exclude it with --exclude {feature.key}")
    return flat.astype(dtype)


def texts(values: Sequence[bytes], feature: Feature, where: str) -> list[str]:
    """UTF-8 byte strings -> str; text that is not UTF-8 is an error (a store's strings are UTF-8)."""
    try:
        return [bytes(v).decode("utf-8") for v in values]
    except UnicodeDecodeError as exc:
        raise UserError(f"{where}: feature {feature.key!r} is not UTF-8 text ({exc})",
                        hint=f"exclude it with --exclude {feature.key}") from exc


def constant_text(values: Sequence[str]) -> str | None:
    """The one string of a per-step text that is the same at every step (a task instruction), else None."""
    return values[0] if values and all(v == values[0] for v in values) else None
