"""The real third-party data vendored in `tests/data/real/` (see its README.md): the one place tests
name it, so every clone runs the real-data tests. A vendored file that is missing fails the test
with the path and how to restore it; it never skips, because a skipped real-data test passes silently."""

from __future__ import annotations

from pathlib import Path

import pytest

REAL_DATA = Path(__file__).resolve().parent / "data" / "real"
G1 = "unitree_g1_lerobot_v2.1_real"  # LeRobot v2.1, MIT: episodes 1 and 2 of YifanTian07/G1-policy-train
G1_EPISODES = ("episode_000001", "episode_000002")  # the vendored ones, in order
G1_LENGTHS = {"episode_000001": 393, "episode_000002": 343}  # parquet rows = video frames (meta/episodes.jsonl)


def real_path(*parts: str) -> Path:
    """`tests/data/real/<parts>`, failing the calling test (not skipping it) when it is absent."""
    path = REAL_DATA.joinpath(*parts)
    if not path.exists():
        pytest.fail(f"vendored real data missing: {path}; it is committed in the repository under "
                    f"tests/data/real (restore it with `git checkout -- tests/data`)", pytrace=False)
    return path


def g1(*parts: str) -> Path:
    """A path inside the vendored Unitree G1 LeRobot v2.1 subset (the dataset root when no parts)."""
    return real_path(G1, *parts)


def g1_parquet(episode: str) -> Path:
    """The episode's LeRobot data file: one row per frame, `observation.state` / `action` 26-D float32."""
    return g1("data", "chunk-000", f"{episode}.parquet")


def g1_video(episode: str) -> Path:
    """The episode's real camera file: AV1 640x480 yuv420p mp4 at 30 fps, as LeRobot wrote it."""
    return g1("videos", "chunk-000", "observation.images.cam_high", f"{episode}.mp4")
