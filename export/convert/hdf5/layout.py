"""HDF5 robot datasets: the pure part of the mapping (no file is opened here).

A file is first described by its *outline* (every dataset's path, shape and dtype; see `plan`),
and everything that decides what the store gets is a function of that outline and the attributes:
which layout the file is in, the control rate, which dataset becomes which field of which kind, the
joint names, the split of each robomimic demo. Kept free of h5py so each rule is testable on its own
(and by hypothesis) without writing files.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from robowds.export.convert.episode_store import unique_names

LAYOUTS = ("robomimic", "aloha", "mapping")
ALOHA_DT_S = 0.02  # ALOHA/ACT's documented control period (constants.py: DT = 0.02): 50 Hz
# ALOHA's 14 joints, as its visualize_episodes.py labels them: per arm 6 joints + the gripper
_ALOHA_JOINTS = ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate", "gripper")
ALOHA_NAMES = tuple(f"{j}_{side}" for side in ("left", "right") for j in _ALOHA_JOINTS)
ALOHA_NAMED = ("qpos", "qvel", "effort", "action")  # the 14-wide datasets that carry these names
ROBOMIMIC_SPLIT_MASKS = ("train", "valid", "val", "validation", "test", "eval")  # robomimic's split filter keys
ROBOMIMIC_SKIPPED = ("next_obs",)  # obs shifted by one step: the same data, not converted
MAX_SERIES_NDIM = 3  # [T], [T, N], [T, A, B] become time series (trailing dims flattened, row-major)


@dataclass(frozen=True)
class DatasetInfo:
    """One dataset of the outline: its shape and numpy dtype string ("float32", "uint8", "vlen-bytes"...)."""

    shape: tuple[int, ...]
    dtype: str


Outline = Mapping[str, DatasetInfo]  # dataset path ("data/demo_0/obs/eef_pos", no leading "/") -> info


def natural_key(name: str) -> tuple[Any, ...]:
    """Sort key that orders `demo_2` before `demo_10` (robomimic and ALOHA number their demos and files
    without padding; a plain sort would interleave them)."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def groups_of(outline: Outline) -> set[str]:
    """Every group that holds a dataset, at any depth ("" is the root)."""
    out = {""}
    for path in outline:
        parts = path.split("/")[:-1]
        out.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


def robomimic_demos(outline: Outline) -> list[str]:
    """The demo groups `data/<demo>` that hold `actions` or an `obs/` dataset, in natural order."""
    demos = set()
    for path in outline:
        parts = path.split("/")
        if len(parts) >= 3 and parts[0] == "data" and (parts[2] == "actions" or (parts[2] == "obs" and len(parts) > 3)):
            demos.add(parts[1])
    return sorted(demos, key=natural_key)


def is_aloha(outline: Outline) -> bool:
    return "observations/qpos" in outline and "action" in outline


def detect_layout(outline: Outline) -> str | None:
    """"robomimic" (data/<demo>/actions or obs/), "aloha" (/observations/qpos and /action), or None when
    neither or both match (the caller then asks for --layout or --mapping)."""
    robomimic, aloha = bool(robomimic_demos(outline)), is_aloha(outline)
    if robomimic == aloha:
        return None
    return "robomimic" if robomimic else "aloha"


def robomimic_rate(env_args: Any) -> float | None:
    """`env_kwargs.control_freq` of robomimic's `data.attrs["env_args"]` (a JSON string), or None when
    absent; a value that is not a positive number is None too (the caller asks for --fps)."""
    if isinstance(env_args, bytes):
        env_args = env_args.decode("utf-8", "replace")
    if isinstance(env_args, str):
        try:
            env_args = json.loads(env_args)
        except ValueError:
            return None
    if not isinstance(env_args, dict):
        return None
    kwargs = env_args.get("env_kwargs")
    freq = kwargs.get("control_freq") if isinstance(kwargs, dict) else None
    if isinstance(freq, bool) or not isinstance(freq, (int, float)) or not np.isfinite(freq) or freq <= 0:
        return None
    return float(freq)


def step_kind(info: DatasetInfo) -> str | None:
    """What a per-step dataset becomes: "video" (uint8 [T, H, W, 3] raw frames; uint8 [T, L] padded
    JPEG rows or [T] variable-length bytes: encoded frames), "timeseries" (numeric [T], [T, N], [T, A, B]),
    or None (a shape or dtype no field kind holds: e.g. depth [T, H, W, 1], strings)."""
    if not info.shape:
        return None
    if info.dtype in ("vlen-bytes", "vlen-uint8") and len(info.shape) == 1:
        return "video"
    if info.dtype == "uint8" and len(info.shape) == 4 and info.shape[-1] == 3:
        return "video"
    if info.dtype in ("vlen-bytes", "vlen-uint8", "str", "other"):
        return None
    if info.dtype == "uint8" and len(info.shape) == 3:
        return None  # a greyscale image stack, not H x W series
    return "timeseries" if len(info.shape) <= MAX_SERIES_NDIM else None


def series_width(info: DatasetInfo) -> int:
    return int(np.prod(info.shape[1:], dtype=np.int64)) if len(info.shape) > 1 else 1


def store_dtype(dtype: str) -> str:
    """The store dtype of an HDF5 numeric dtype: kept, except float16 (Arrow and the export take
    float32 and float64 only: float16 widens exactly)."""
    return "float32" if dtype == "float16" else dtype


def quaternion_declare(key: str, width: int) -> dict[str, Any]:
    """robosuite writes end-effector orientations as xyzw quaternions in keys ending in `_quat`:
    declared slerp so the export interpolates them on the sphere."""
    return {"interpolation": "slerp", "quaternion_order": "xyzw"} if key.endswith("_quat") and width == 4 else {}


def aloha_names(key: str, width: int) -> tuple[str, ...] | None:
    return ALOHA_NAMES if key in ALOHA_NAMED and width == len(ALOHA_NAMES) else None


def robomimic_keys(outline: Outline, demo: str) -> list[tuple[str, str]]:
    """(dataset path relative to the demo, field key) for what a demo converts: `obs/<key>` -> key,
    `actions`, `rewards`, `dones`, `states` and any other top-level dataset -> its name; `next_obs/` is
    skipped (the same observations one step later)."""
    prefix = f"data/{demo}/"
    out = []
    for path in sorted(p[len(prefix):] for p in outline if p.startswith(prefix)):
        parts = path.split("/")
        if parts[0] in ROBOMIMIC_SKIPPED:
            continue
        out.append((path, parts[-1] if parts[0] == "obs" and len(parts) == 2 else path.replace("/", "_")))
    return out


def aloha_keys(outline: Outline) -> list[tuple[str, str]]:
    """(dataset path, field key) for an ALOHA episode file: `/observations/<x>` -> x,
    `/observations/images/<cam>` -> cam, every other dataset -> its path with `/` as `_` (`action`,
    `base_action`); `/compress_len` is bookkeeping of the JPEG rows, not a field."""
    out = []
    for path in sorted(outline):
        if path == "compress_len":
            continue
        parts = path.split("/")
        if parts[0] == "observations" and len(parts) == 2:
            out.append((path, parts[1]))
        elif parts[:2] == ["observations", "images"] and len(parts) == 3:
            out.append((path, parts[2]))
        else:
            out.append((path, path.replace("/", "_")))
    return out


def split_of_demos(masks: Mapping[str, Sequence[str]], chosen: Sequence[str] | None) -> dict[str, str]:
    """Demo -> split from robomimic's `mask/<name>` lists. `chosen`: the mask names to use (None: those of
    ROBOMIMIC_SPLIT_MASKS present; robomimic's other filter keys such as `20_percent` are subsets, not
    splits). A demo in two chosen masks is ambiguous: ValueError naming it."""
    names = [m for m in (chosen if chosen is not None else ROBOMIMIC_SPLIT_MASKS) if m in masks]
    out: dict[str, str] = {}
    for name in names:
        for demo in masks[name]:
            if demo in out and out[demo] != name:
                raise ValueError(f"demo {demo!r} is in both mask/{out[demo]} and mask/{name}")
            out[demo] = name
    return out


def unique_fields(keys: Sequence[str], taken: Sequence[str] = ()) -> dict[str, str]:
    """Field key -> distinct store field name; names in `taken` (fields the converter adds itself, e.g.
    `split`) are never given out (`episode_store.unique_names`)."""
    return dict(zip(keys, unique_names(keys, taken)))


def episode_id(text: str) -> str:
    """A store episode id from a file stem and group path: characters outside `[A-Za-z0-9_-]` become
    `_` (ids become tar keys, which allow no dots)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", text).strip("_") or "episode"
