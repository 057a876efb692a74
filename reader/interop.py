"""Decoders for reading our shards with other tools: webdataset, wids and Megatron-Energon.

Why: those tools decode members by their last extension, and none knows `.jpgs.msgpack` (a camera
window: a msgpack list of JPEG bytes, one per step), so they hand it back as opaque bytes. These
functions decode every member exactly as `ShardDataset` does (`reader/decode.py`): camera windows to
uint8 [T, H, W, C] (C = 3, or 1 for grayscale), `.mp4` window clips to uint8 [T, H, W, 3], `.npy` to
arrays, `.txt` to str, `.json` to objects, images to uint8 [H, W, C]. They never unpickle: `.npy` with
`allow_pickle=False` semantics (object dtypes refused), msgpack with raw bytes and no ext hooks, and
members with other extensions (`.pkl`, `.pth`, ...) stay bytes, where wids' and webdataset's default
decoders would unpickle them. Each call decodes one sample; nothing is cached or shared.

Hugging Face `datasets` is not covered: it was not installed where this was written and tested.
"""

from __future__ import annotations

import io
from typing import Any, Mapping

import numpy as np

from robowds.reader.decode import decode_member

CAMERA_EXT = "jpgs.msgpack"


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


def wds_decoder(key: str, data: bytes) -> Any:
    """A webdataset `.decode()` handler: camera windows, `.mp4` window clips and `.npy` arrays; None for
    anything else, so the next handler (e.g. `"rgb8"` for `.png`/`.jpg`, webdataset's basic handlers
    for `.txt`/`.json`) decodes it.

        wds.WebDataset(urls).decode(wds_decoder, "rgb8")  # sample["cam.jpgs.msgpack"]: uint8 [T, H, W, 3]
    """
    ext = _ext(key)
    if ext == CAMERA_EXT or ext.rsplit(".", 1)[-1] in ("npy", "mp4"):
        return _decode(ext, data)
    return None


def decode_members(sample: Mapping[str, Any]) -> dict[str, Any]:
    """A sample dict whose member values (bytes, memoryview or BytesIO, under keys like
    `"cam.jpgs.msgpack"` or wids' `".cam.jpgs.msgpack"`) are decoded as `ShardDataset` decodes them;
    keys are kept, `__key__`-style entries and values another decoder already decoded pass through.

    A wids transform (`wids.ShardListDataset(url, transformations=[decode_members])`, in place of wids'
    default decoder, which unpickles `.pkl`), and the body of an Energon cooker for the
    `CrudeWebdataset` the export declares in `.nv-meta/dataset.yaml`
    (`Cooker(stateless(decode_members))`, with the task encoder's `decoder = None`).
    """
    out: dict[str, Any] = {}
    for name, value in sample.items():
        raw = None if name.startswith("__") else _raw(value)
        out[name] = value if raw is None else _decode(_ext(name), raw)
    return out


wids_transform = decode_members  # the name the docs use for wids
