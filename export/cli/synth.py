"""Deterministic synthetic episode store (see the README, section "The episode store").

The store is meant to exercise the awkward parts of export, not to look pretty: streams at different
rates on one shared clock, a jittery IMU with a dropout, a held discrete command, quaternions with a
hemisphere sign flip, episodes of different lengths, text and one PNG per episode. Everything is drawn
from ``numpy.random.default_rng`` and written with fixed writer options, so the same
``(episodes, seed)`` gives byte-identical files, which keeps benchmarks and golden tests reproducible.
"""
from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from PIL import Image

JOINT_HZ = 50  # joints, actions, orientation
GRIPPER_HZ = 10
IMU_HZ = 200
N_JOINTS = 7
ACTION_LEAD_S = 0.1  # actions are the joint targets 0.1 s ahead, as a position controller would see
IMU_JITTER_S = 0.0004
IMAGE_W, IMAGE_H = 96, 72
IMU_UNITS = "m/s^2 (accel), rad/s (gyro)"  # store.yaml documents one units string per field
TASKS: tuple[str, ...] = (
    "pick up the red cube and place it in the bowl",
    "open the top drawer",
    "push the green block to the left edge of the table",
    "stack the blue cube on the yellow cube",
    "put the sponge in the sink",
    "close the cabinet door",
    "pour the cup into the bowl",
    "hang the towel on the rack",
)


@dataclasses.dataclass(frozen=True)
class SynthSummary:
    root: pathlib.Path
    episodes: int
    episode_ids: tuple[str, ...]
    total_seconds: float  # sum over episodes of the joint clock extent (first to last sample)


@dataclasses.dataclass(frozen=True)
class _Episode:
    joints: np.ndarray  # [T, 1+7]
    actions: np.ndarray  # [T, 1+7]
    gripper_cmd: np.ndarray  # [G, 1+1]
    orientation: np.ndarray  # [T, 1+4] xyzw
    imu: np.ndarray  # [M, 1+6]
    task: str
    image: np.ndarray  # [H, W, 3] uint8
    duration_s: float


def _with_time(t: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Time goes in column 0 of every stream, as the store format requires."""
    return np.column_stack([t, values]).astype(np.float64)  # [T, 1+N]


def _rotate_into_body(v: np.ndarray, axis: np.ndarray, angle: np.ndarray) -> np.ndarray:
    """R(angle about axis)^T v for each angle: what a body-mounted accelerometer sees of gravity."""
    c, s = np.cos(angle)[:, None], np.sin(angle)[:, None]  # [M, 1]
    return v * c + np.cross(v, axis) * s + axis * (axis @ v) * (1.0 - c)  # [M, 3]


def _image(rng: np.random.Generator) -> np.ndarray:
    """A gradient plus a coloured square whose position varies per episode, so frames differ."""
    ys = np.linspace(0.0, 1.0, IMAGE_H)[:, None]  # [H, 1]
    xs = np.linspace(0.0, 1.0, IMAGE_W)[None, :]  # [1, W]
    base = rng.uniform(0.2, 0.8, size=3)  # [3]
    red = base[0] * (1 - xs) + 0.2 * ys  # [H, W]
    green = base[1] * ys + 0.1 * xs  # [H, W]
    blue = 0.6 * base[2] + 0.2 * xs * ys  # [H, W]
    img = np.clip(np.stack([red, green, blue], axis=-1), 0.0, 1.0) * 255.0  # [H, W, 3]
    side = int(rng.integers(12, 24))
    x0 = int(rng.integers(0, IMAGE_W - side))
    y0 = int(rng.integers(0, IMAGE_H - side))
    img[y0:y0 + side, x0:x0 + side] = rng.integers(0, 256, size=3)
    return img.astype(np.uint8)


def _episode(rng: np.random.Generator) -> _Episode:
    duration = float(rng.uniform(4.0, 12.0))
    n = int(round(duration * JOINT_HZ)) + 1
    t = np.arange(n) / JOINT_HZ  # [T]; times from integer indices, never accumulated

    # Joints: a few slow sinusoids per joint; the clean function is reused for the leading actions.
    amp = rng.uniform(0.05, 0.6, size=(3, N_JOINTS)) / np.array([1.0, 2.0, 4.0])[:, None]  # [3, 7]
    freq = rng.uniform(0.05, 0.8, size=(3, N_JOINTS))  # [3, 7] Hz
    phase = rng.uniform(0.0, 2 * np.pi, size=(3, N_JOINTS))  # [3, 7]
    offset = rng.uniform(-1.0, 1.0, size=N_JOINTS)  # [7]

    def clean(tt: np.ndarray) -> np.ndarray:  # [T] -> [T, 7]
        arg = 2 * np.pi * tt[:, None, None] * freq[None] + phase[None]  # [T, 3, 7]
        return offset + (amp[None] * np.sin(arg)).sum(axis=1)

    joints = clean(t) + rng.normal(0.0, 1e-3, size=(n, N_JOINTS))  # [T, 7]
    actions = clean(t + ACTION_LEAD_S) + rng.normal(0.0, 5e-4, size=(n, N_JOINTS))  # [T, 7]

    # Gripper: one grasp (0 -> 1 -> 0) at 10 Hz over the same extent as the joints.
    g = (n - 1) // (JOINT_HZ // GRIPPER_HZ) + 1
    tg = np.arange(g) / GRIPPER_HZ  # [G]
    close = int(rng.integers(g // 5, g // 2))
    release = int(rng.integers(close + g // 5, g - g // 10))
    closed = ((np.arange(g) >= close) & (np.arange(g) < release)).astype(np.float64)  # [G]

    # Orientation: rotation about a fixed axis at a slow constant rate, so the IMU gyro is consistent.
    axis = rng.normal(size=3)
    axis /= np.linalg.norm(axis)  # [3]
    omega = float(rng.uniform(0.2, 0.6) * rng.choice([-1.0, 1.0]))  # rad/s
    angle0 = float(rng.uniform(0.0, 2 * np.pi))
    half = (angle0 + omega * t) / 2  # [T]
    quat = np.column_stack([axis[None] * np.sin(half)[:, None], np.cos(half)])  # [T, 4] xyzw
    quat += rng.normal(0.0, 1e-4, size=quat.shape)
    quat /= np.linalg.norm(quat, axis=1, keepdims=True)
    flip = int(rng.integers(n // 4, 3 * n // 4))
    quat[flip:] *= -1.0  # same rotation, other hemisphere: export must fix the sign before slerp

    # IMU: starts/ends a few ms inside the joint clock, jittered stamps, one dropout mid-episode.
    k0 = int(rng.integers(1, 4))
    k1 = (n - 1) * (IMU_HZ // JOINT_HZ) - int(rng.integers(1, 4))
    k = np.arange(k0, k1 + 1)  # [M]
    ti = k / IMU_HZ + rng.uniform(-IMU_JITTER_S, IMU_JITTER_S, size=k.size)  # [M]
    gap_len = float(rng.uniform(0.15, 0.3))
    gap_at = float(rng.uniform(0.3, 0.6) * t[-1])
    keep = (ti < gap_at) | (ti > gap_at + gap_len)  # [M]
    gravity = np.array([0.0, 0.0, 9.81])
    accel = _rotate_into_body(gravity, axis, angle0 + omega * ti)  # [M, 3]
    accel += 0.3 * np.sin(2 * np.pi * 1.3 * ti + phase[0, 0])[:, None] + rng.normal(0.0, 0.05, size=accel.shape)
    gyro = omega * axis[None] + rng.normal(0.0, 0.01, size=(k.size, 3))  # [M, 3]
    imu = _with_time(ti, np.column_stack([accel, gyro]))[keep]  # [M', 1+6]
    assert np.all(np.diff(imu[:, 0]) > 0), "IMU stamps must be strictly increasing"

    return _Episode(
        joints=_with_time(t, joints),
        actions=_with_time(t, actions),
        gripper_cmd=_with_time(tg, closed),
        orientation=_with_time(t, quat),
        imu=imu,
        task=TASKS[int(rng.integers(len(TASKS)))],
        image=_image(rng),
        duration_s=float(t[-1]),
    )


def _series(blocks: list[np.ndarray]) -> pa.ListArray:
    """list<list<double>> from per-episode [T_i, 1+N] blocks without building Python lists."""
    rows = np.array([b.shape[0] for b in blocks], dtype=np.int64)  # [E]
    width = blocks[0].shape[1]
    values = pa.array(np.concatenate([b.reshape(-1) for b in blocks]), type=pa.float64())
    inner_offsets = pa.array(np.arange(int(rows.sum()) + 1, dtype=np.int32) * np.int32(width))
    inner = pa.ListArray.from_arrays(inner_offsets, values)
    outer_offsets = pa.array(np.concatenate([[0], np.cumsum(rows)]).astype(np.int32))
    return pa.ListArray.from_arrays(outer_offsets, inner)


def _write_table(path: pathlib.Path, columns: dict[str, pa.Array]) -> None:
    """Fixed writer options so the bytes depend only on the data."""
    pq.write_table(pa.table(columns), path, compression="zstd", use_dictionary=False, row_group_size=64)


def _store_yaml() -> dict:
    joint_names = [f"j{i}" for i in range(N_JOINTS)]
    return {
        "version": 1,
        "clock": "joints",
        "fields": {
            "joints": {"names": joint_names, "units": "rad"},
            "actions": {"names": [f"{n}_target" for n in joint_names], "units": "rad"},
            "gripper_cmd": {"interpolation": "hold", "names": ["closed"]},
            "orientation": {"interpolation": "slerp", "quaternion_order": "xyzw", "names": ["x", "y", "z", "w"]},
            "imu": {"names": ["ax", "ay", "az", "gx", "gy", "gz"], "units": IMU_UNITS},
            "overview": {"kind": "image"},
            "task": {"kind": "text"},
        },
    }


def write_synthetic_store(root: pathlib.Path, episodes: int = 8, seed: int = 0) -> SynthSummary:
    """Write a synthetic store to ``root`` (created; must not exist or be empty).

    Episode ``i`` is drawn from ``default_rng((seed, i))``, so it does not depend on how many episodes
    are written: a 300-episode store starts with the same episodes as an 8-episode one.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    root = pathlib.Path(root)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(f"refusing to write a synthetic store into {root}: it exists and is not an empty folder")
    media = root / "media" / "overview"
    media.mkdir(parents=True, exist_ok=True)

    ids = tuple(f"ep_{i:04d}" for i in range(episodes))
    eps = [_episode(np.random.default_rng((seed, i))) for i in range(episodes)]
    paths = [f"media/overview/{eid}.png" for eid in ids]
    for ep, rel in zip(eps, paths):
        Image.fromarray(ep.image).save(root / rel, format="PNG", optimize=False, compress_level=6)

    id_col = pa.array(ids, type=pa.string())
    _write_table(root / "trajectories.parquet", {
        "episode_id": id_col,
        "joints": _series([e.joints for e in eps]),
        "actions": _series([e.actions for e in eps]),
        "gripper_cmd": _series([e.gripper_cmd for e in eps]),
        "orientation": _series([e.orientation for e in eps]),
    })
    _write_table(root / "sensors.parquet", {"episode_id": id_col, "imu": _series([e.imu for e in eps])})
    _write_table(root / "text.parquet", {"episode_id": id_col, "task": pa.array([e.task for e in eps], type=pa.string())})
    _write_table(root / "images.parquet", {"episode_id": id_col, "overview": pa.array(paths, type=pa.string())})
    (root / "store.yaml").write_text(yaml.safe_dump(_store_yaml(), sort_keys=False), encoding="utf-8")

    return SynthSummary(root=root, episodes=episodes, episode_ids=ids, total_seconds=float(sum(e.duration_s for e in eps)))
