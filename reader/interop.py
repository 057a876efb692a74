"""Decoders for reading our shards with other tools: webdataset, wids, Megatron-Energon and Hugging Face
`datasets`.

Why: those tools decode members by their last extension, and none knows `.jpgs.msgpack` (a camera
window: a msgpack list of JPEG bytes, one per step), so they hand it back as opaque bytes. These
functions decode every member exactly as `ShardDataset` does (`reader/decode.py`): camera windows to
uint8 [T, H, W, C] (C = 3, or 1 for grayscale), `.mp4` window clips to uint8 [T, H, W, 3], `.npy` to
arrays, `.txt` to str, `.json` to objects, images to uint8 [H, W, C]. They never unpickle: `.npy` with
`allow_pickle=False` semantics (object dtypes refused), msgpack with raw bytes and no ext hooks, and
members with other extensions (`.pkl`, `.pth`, ...) stay bytes, where wids' and webdataset's default
decoders would unpickle them. Each call decodes one sample; nothing is cached or shared.

Hugging Face `datasets` (its `webdataset` loader) decodes `.npy` members itself into Arrow lists (values
exact, in the Arrow type numpy's dtype maps to) and hands cameras back as bytes: `hf_transform(features)`
turns the lists back into arrays of the stored dtype and decodes the cameras.

An `npz` layout export (`reader/npz.py`) holds a sample's arrays in one `arrays.npz` member:
`decode_members` replaces it by its entries under the keys the `members` layout has (`joints.npy`),
`wds_decoder` decodes it to a dict of arrays (as webdataset's own `.npz` handler does).
"""

from __future__ import annotations

import io
from typing import Any, Callable, Mapping

import numpy as np

from robowds.reader.decode import IMAGE_EXTS, decode_member, image_array
from robowds.reader.npz import PACKED, read_npz

CAMERA_EXT = "jpgs.msgpack"
PACKED_EXT = PACKED.partition(".")[2]  # "npz"


def _ext(suffix: str) -> str:
    """`'.cam.jpgs.msgpack'` / `'cam.jpgs.msgpack'` -> `'jpgs.msgpack'`: the member's extension after its field."""
    return suffix.lstrip(".").partition(".")[2].lower()


def _raw(value: Any) -> bytes | memoryview | None:
    """A member's undecoded bytes (wids hands out BytesIO), or None for a value already decoded."""
    if isinstance(value, io.BytesIO):
        return value.getbuffer()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return value
    return None


def _decode(ext: str, data: bytes | memoryview) -> Any:
    """`decode_member`, with arrays writable: our reader hands out zero-copy read-only views, but other
    tools' pipelines may write in place, and `torch.as_tensor` (Energon's loader) warns on every one."""
    value = decode_member(ext, data)
    return value.copy() if isinstance(value, np.ndarray) and not value.flags.writeable else value


def _entries(data: bytes | memoryview) -> dict[str, Any]:
    """An `npz` layout's `arrays.npz` member (`reader/npz.py`, checked) -> entry name ("joints.npy") -> value."""
    return {name: _decode(name.partition(".")[2], view) for name, view in read_npz(data, "arrays.npz").items()}


def wds_decoder(key: str, data: bytes) -> Any:
    """A webdataset `.decode()` handler: camera windows, `.mp4` window clips, `.npy` arrays and the
    `npz` layout's `arrays.npz` (a dict field -> array, as webdataset's own `.npz` handler gives it);
    None for anything else, so the next handler (e.g. `"rgb8"` for `.png`/`.jpg`, webdataset's basic
    handlers for `.txt`/`.json`) decodes it.

        wds.WebDataset(urls).decode(wds_decoder, "rgb8")  # sample["cam.jpgs.msgpack"]: uint8 [T, H, W, 3]
    """
    ext = _ext(key)
    if ext == CAMERA_EXT or ext.rsplit(".", 1)[-1] in ("npy", "mp4"):
        return _decode(ext, data)
    if ext == PACKED_EXT:
        return {name.partition(".")[0]: value for name, value in _entries(data).items()}
    return None


def decode_members(sample: Mapping[str, Any]) -> dict[str, Any]:
    """A sample dict whose member values (bytes, memoryview or BytesIO, under keys like
    `"cam.jpgs.msgpack"` or wids' `".cam.jpgs.msgpack"`) are decoded as `ShardDataset` decodes them;
    keys are kept, `__key__`-style entries and values another decoder already decoded pass through.

    A wids transform (`wids.ShardListDataset(url, transformations=[decode_members])`, in place of wids'
    default decoder, which unpickles `.pkl`), and the body of an Energon cooker for the
    `CrudeWebdataset` the export declares in `.nv-meta/dataset.yaml`
    (`Cooker(stateless(decode_members))`, with the task encoder's `decoder = None`).

    An `npz` layout export's `arrays.npz` member is replaced by its entries, under the keys the
    `members` layout's members have (`"joints.npy"`, wids: `".joints.npy"`): the same dict either way.
    """
    out: dict[str, Any] = {}
    for name, value in sample.items():
        raw = None if name.startswith("__") else _raw(value)
        if raw is not None and _ext(name) == PACKED_EXT:
            dot = "." if name.startswith(".") else ""
            out.update({dot + entry: decoded for entry, decoded in _entries(raw).items()})
        else:
            out[name] = value if raw is None else _decode(_ext(name), raw)
    return out


wids_transform = decode_members  # the name the docs use for wids


def _leaf_dtype(feature: Any) -> np.dtype | None:
    """The numpy dtype at the bottom of a `datasets` feature (Value, or lists of Value), else None."""
    while not hasattr(feature, "dtype") and hasattr(feature, "feature"):
        feature = feature.feature  # List / Sequence / LargeList -> its element feature
    dtype = getattr(feature, "dtype", None)
    try:
        return np.dtype(dtype) if isinstance(dtype, str) and dtype not in ("string", "large_string", "binary") else None
    except TypeError:
        return None


def hf_transform(features: Mapping[str, Any]) -> Callable[[dict[str, list]], dict[str, list]]:
    """A `datasets` transform for `ds.with_transform(hf_transform(ds.features))`: `.npy` columns back to
    arrays of their stored dtype (an npz layout's `arrays.npz` struct: a dict of them), camera windows and
    `.mp4` clips decoded; other columns as they are.

        ds = datasets.load_dataset("webdataset", data_files={"train": shards}, split="train")
        ds = ds.with_transform(hf_transform(ds.features))  # ds[0]["cam.jpgs.msgpack"]: uint8 [T, H, W, 3]
    """
    dtypes = {name: _leaf_dtype(feature) for name, feature in features.items()}
    packed = {name: {entry: _leaf_dtype(f) for entry, f in feature.items()} for name, feature in features.items()
              if _ext(name) == PACKED_EXT and isinstance(feature, Mapping)}  # npz layout: a struct of arrays

    def transform(batch: dict[str, list]) -> dict[str, list]:
        out: dict[str, list] = {}
        for name, values in batch.items():
            ext = _ext(name)
            if ext == CAMERA_EXT or ext.rsplit(".", 1)[-1] == "mp4":
                out[name] = [None if v is None else _decode(ext, v) for v in values]
            elif ext.rsplit(".", 1)[-1] in IMAGE_EXTS:  # datasets' Image feature hands out PIL images
                out[name] = [v if v is None or isinstance(v, np.ndarray) else image_array(v) for v in values]
            elif ext.rsplit(".", 1)[-1] == "npy" and dtypes.get(name) is not None:
                out[name] = [None if v is None else np.asarray(v, dtype=dtypes[name]) for v in values]
            elif name in packed:  # {entry: array}, as wds_decoder gives it
                out[name] = [None if v is None else {k: np.asarray(x, dtype=packed[name].get(k)) for k, x in v.items()}
                             for v in values]
            else:
                out[name] = values
        return out

    return transform
