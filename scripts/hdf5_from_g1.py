"""Write HDF5 files in the robomimic, ALOHA/ACT and a custom layout from the REAL vendored Unitree G1 data.

No real robomimic or ALOHA file with a licence that allows redistribution exists, so the HDF5 tests
(tests/test_convert_hdf5*.py) and the examples of docs/convert-hdf5.md build them from real data: the G1
episodes of `tests/data/real/unitree_g1_lerobot_v2.1_real` (MIT; LeRobot v2.1, 30 fps, state/action
26-D float32, one AV1 640x480 camera). Values are the G1's own, placed at each layout's paths:

| layout | dataset | from the G1 episode |
|---|---|---|
| robomimic | `data/demo_N/obs/joint_pos` float32 [T, 26] | `observation.state` |
| | `data/demo_N/obs/agentview_image` uint8 [T, 48, 64, 3] | camera frames decoded with PyAV, downscaled |
| | `data/demo_N/actions` float32 [T, 26], `states` float64 [T, 26] | `action`, `observation.state` widened |
| | `rewards` float64 [T], `dones` int64 [T] | 1 at the last step (robomimic's sparse success) |
| | `next_obs/*` | the obs one step later (robomimic writes it; not converted) |
| | `data.attrs["env_args"]` | `{"env_kwargs": {"control_freq": 30}}` (the G1's rate) |
| | `mask/train`, `mask/valid`, `mask/20_percent` | demo name lists |
| ALOHA | `/observations/qpos` float32 [T, 14], `/action` [T, 14] | the G1's 14 arm joints (7 per arm, as ALOHA's 6 + gripper) |
| | `/observations/qvel` [T, 14] | finite difference of qpos x 30 |
| | `/observations/images/cam_high`, `cam_low` | raw uint8 [T, 48, 64, 3] (cam_low: a 64x48 centre crop of the full frame), or JPEG per step: padded rows [T, L] + `/compress_len` (cameras recorded as cam_low, cam_high: rows not in name order), or variable-length bytes |
| custom | `episodes/ep_N/{timestamps, joints/position, joints/command, camera/front}` + attribute `instruction` | frame_index / 30 in float64, state, action, frames, the task text |

Steps are the first `steps` rows of each episode (frames decoded only that far, so tests stay fast).
Run it to get example files: `python scripts/hdf5_from_g1.py /tmp/g1_hdf5` (then see docs/convert-hdf5.md).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import h5py
import numpy as np
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
G1_ROOT = REPO / "tests" / "data" / "real" / "unitree_g1_lerobot_v2.1_real"
G1_FPS = 30
TASK = "Pick up the yellow bottle on the table."
SIZE = (64, 48)  # downscaled frame (width, height)
ALOHA_CAMERAS = ("cam_low", "cam_high")  # recorder order (not name order), as ALOHA's own config lists cameras


@dataclass(frozen=True)
class G1Steps:
    """The first steps of one real G1 episode."""

    name: str  # episode_000001
    state: np.ndarray  # [T, 26] float32
    action: np.ndarray  # [T, 26] float32
    frames: np.ndarray  # [T, 48, 64, 3] uint8 RGB, the whole frame downscaled
    crops: np.ndarray  # [T, 48, 64, 3] uint8 RGB, the full-resolution frame's centre 64x48


def read_g1(episode: str, steps: int, root: Path = G1_ROOT) -> G1Steps:
    """State, action and `steps` camera frames of a G1 episode (frames through PyAV, one thread)."""
    from av.video.reformatter import VideoReformatter

    table = pq.read_table(root / "data" / "chunk-000" / f"{episode}.parquet")
    state = np.stack(table.column("observation.state").to_numpy(zero_copy_only=False))[:steps].astype(np.float32)
    action = np.stack(table.column("action").to_numpy(zero_copy_only=False))[:steps].astype(np.float32)
    video = root / "videos" / "chunk-000" / "observation.images.cam_high" / f"{episode}.mp4"
    frames, crops = [], []
    reformatter = VideoReformatter()
    with av.open(str(video)) as container:
        for frame in container.decode(video=0):
            rgb = reformatter.reformat(frame, format="rgb24", threads=1).to_ndarray()  # [480, 640, 3]
            small = reformatter.reformat(frame, format="rgb24", width=SIZE[0], height=SIZE[1], threads=1)
            frames.append(small.to_ndarray())
            top, left = (rgb.shape[0] - SIZE[1]) // 2, (rgb.shape[1] - SIZE[0]) // 2
            crops.append(np.ascontiguousarray(rgb[top:top + SIZE[1], left:left + SIZE[0]]))
            if len(frames) == len(state):
                break
    return G1Steps(episode, state, action, np.stack(frames), np.stack(crops))


def jpeg_encode(frames: np.ndarray, quality: int = 4) -> list[bytes]:
    """Each frame ([T, H, W, 3] uint8) as one JPEG file, with FFmpeg's MJPEG encoder (qscale `quality`)."""
    codec = av.CodecContext.create("mjpeg", "w")
    codec.width, codec.height, codec.pix_fmt = frames.shape[2], frames.shape[1], "yuvj420p"
    codec.time_base = Fraction(1, G1_FPS)
    codec.options = {"qscale": str(quality)}
    codec.flags |= av.codec.context.Flags.qscale
    out = []
    for k, image in enumerate(frames):
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24").reformat(format="yuvj420p")
        frame.pts = k
        out.extend(bytes(p) for p in codec.encode(frame))
    out.extend(bytes(p) for p in codec.encode(None))
    return out


def write_robomimic(path: Path, demos: dict[str, G1Steps], masks: dict[str, list[str]] | None = None,
                    control_freq: float | None = G1_FPS) -> Path:
    """A robomimic file: one demo per entry of `demos` (name -> steps); `control_freq` None leaves it out
    of env_args (a file whose rate must come from --fps)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        kwargs = {"control_freq": control_freq} if control_freq is not None else {}
        data.attrs["env_args"] = json.dumps({"env_name": "unitree_g1_pick_bottle", "type": 1, "env_kwargs": kwargs})
        data.attrs["total"] = sum(len(g.state) for g in demos.values())
        for name, g in demos.items():
            demo = data.create_group(name)
            demo.attrs["num_samples"] = len(g.state)
            obs = {"joint_pos": g.state, "agentview_image": g.frames}
            for key, value in obs.items():
                demo.create_dataset(f"obs/{key}", data=value)
                demo.create_dataset(f"next_obs/{key}", data=np.concatenate([value[1:], value[-1:]]))
            demo.create_dataset("actions", data=g.action)
            demo.create_dataset("states", data=g.state.astype(np.float64))
            done = np.zeros(len(g.state), np.int64)
            done[-1] = 1
            demo.create_dataset("rewards", data=done.astype(np.float64))
            demo.create_dataset("dones", data=done)
        for mask, names in (masks or {}).items():
            f.create_dataset(f"mask/{mask}", data=np.array(names, dtype="S"))
    return path


def write_aloha(folder: Path, episodes: list[G1Steps], images: str = "raw") -> list[Path]:
    """ALOHA/ACT episode files `episode_<i>.hdf5`; `images`: "raw" (uint8 [T, H, W, 3]), "padded" (JPEG
    rows [T, L] + /compress_len, root attr compress) or "vlen" (variable-length JPEG bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, g in enumerate(episodes):
        qpos = g.state[:, :14]  # [T, 14]: left arm 7, right arm 7
        qvel = (np.diff(qpos, axis=0, prepend=qpos[:1]) * G1_FPS).astype(np.float32)
        cams = {"cam_low": g.crops, "cam_high": g.frames}
        path = folder / f"episode_{i}.hdf5"
        with h5py.File(path, "w") as f:
            f.attrs["sim"] = False
            f.attrs["compress"] = images != "raw"
            f.create_dataset("observations/qpos", data=qpos)
            f.create_dataset("observations/qvel", data=qvel)
            f.create_dataset("action", data=g.action[:, :14])
            jpegs = {cam: jpeg_encode(cams[cam]) for cam in ALOHA_CAMERAS} if images != "raw" else {}
            if images == "padded":
                lengths = np.array([[len(j) for j in jpegs[cam]] for cam in ALOHA_CAMERAS])  # [cams, T]
                for cam in ALOHA_CAMERAS:
                    rows = np.zeros((len(qpos), lengths.max()), np.uint8)  # [T, L], zero padded
                    for k, data in enumerate(jpegs[cam]):
                        rows[k, :len(data)] = np.frombuffer(data, np.uint8)
                    f.create_dataset(f"observations/images/{cam}", data=rows)
                f.create_dataset("compress_len", data=lengths)
            for cam in ALOHA_CAMERAS:
                if images == "raw":
                    f.create_dataset(f"observations/images/{cam}", data=cams[cam], chunks=(1, *cams[cam].shape[1:]))
                elif images == "vlen":
                    ds = f.create_dataset(f"observations/images/{cam}", (len(qpos),), dtype=h5py.vlen_dtype(np.uint8))
                    for k, data in enumerate(jpegs[cam]):
                        ds[k] = np.frombuffer(data, np.uint8)
        paths.append(path)
    return paths


def write_custom(path: Path, episodes: list[G1Steps]) -> Path:
    """A layout no converter knows, for the --mapping example of docs/convert-hdf5.md."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f.attrs["robot"] = "unitree_g1"
        for i, g in enumerate(episodes):
            ep = f.create_group(f"episodes/ep_{i}")
            ep.attrs["instruction"] = TASK
            ep.create_dataset("timestamps", data=np.arange(len(g.state), dtype=np.float64) / G1_FPS)
            ep.create_dataset("joints/position", data=g.state)
            ep.create_dataset("joints/command", data=g.action)
            ep.create_dataset("camera/front", data=g.frames)
    return path


def write_all(out: Path, steps: int = 30, root: Path = G1_ROOT) -> dict[str, Path]:
    """Every example: robomimic.hdf5 (3 demos, masks), aloha_raw/, aloha_jpeg/, aloha_vlen/, custom.h5."""
    first = read_g1("episode_000001", 2 * steps, root)
    second = read_g1("episode_000002", steps, root)
    half = lambda g, lo, hi: G1Steps(g.name, g.state[lo:hi], g.action[lo:hi], g.frames[lo:hi], g.crops[lo:hi])  # noqa: E731
    a, b, c = half(first, 0, steps), second, half(first, steps, 2 * steps)
    paths = {"robomimic": write_robomimic(out / "robomimic.hdf5", {"demo_0": a, "demo_1": b, "demo_2": c},
                                          {"train": ["demo_0", "demo_2"], "valid": ["demo_1"], "20_percent": ["demo_0"]})}
    for images in ("raw", "padded", "vlen"):
        write_aloha(out / f"aloha_{'jpeg' if images == 'padded' else images}", [a, b], images)
    paths.update({"aloha_raw": out / "aloha_raw", "aloha_jpeg": out / "aloha_jpeg", "aloha_vlen": out / "aloha_vlen",
                  "custom": write_custom(out / "custom.h5", [a, b])})
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write the example files into")
    parser.add_argument("--g1", type=Path, default=G1_ROOT, help="the G1 LeRobot v2.1 dataset root")
    parser.add_argument("--steps", type=int, default=30, help="steps per episode (frames decoded)")
    args = parser.parse_args()
    for name, path in write_all(args.out, args.steps, args.g1).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
