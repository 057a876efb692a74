"""LeRobot datasets as users have them, built from the vendored real data in a test's tmp_path: the
Hugging Face cache layout `snapshot_download` leaves, and a GR00T-style v2.0 table (no frame_index,
`annotation.*` label columns indexing tasks.jsonl)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from realdata import G1_EPISODES, g1

REVISION = "4f1c0d2e9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d"  # a commit hash, as the cache names its snapshots


def hf_cache(src: Path, cache: Path, repo: str = "datasets--unitree--g1-policy-train") -> Path:
    """`src` laid out as `huggingface_hub.snapshot_download` leaves it under `cache`: every file a blob
    named by its sha256 in `<repo>/blobs/` (no extension; files with the same bytes share one blob), and
    `<repo>/snapshots/<rev>/<path>` a relative link to it (`../../../blobs/<sha>`, as deep as the path);
    `<repo>/refs/main` names the revision. Returns the snapshot folder (what users pass)."""
    repo_dir = cache / repo
    blobs, snapshot = repo_dir / "blobs", repo_dir / "snapshots" / REVISION
    blobs.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(REVISION)
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = blobs / hashlib.sha256(data).hexdigest()
        if not blob.exists():
            blob.write_bytes(data)
        link = snapshot / path.relative_to(src)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


def hf_local_dir(snapshot: Path, local: Path) -> Path:
    """A `snapshot_download(local_dir=...)` copy of `snapshot` as older huggingface_hub leaves it with
    links: small files copied, each video an absolute link to its blob in the cache."""
    for link in sorted(p for p in snapshot.rglob("*") if p.is_file()):
        path = local / link.relative_to(snapshot)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".mp4":
            path.symlink_to(link.resolve())
        else:
            shutil.copyfile(link, path)
    return local


def g1_with_a_shared_video(root: Path) -> Path:
    """A copy of the vendored G1 data plus episode 3: episode 1's rows (its episode_index set to 3) and a
    copy of episode 1's video, so that in the cache both videos are one blob."""
    shutil.copytree(g1(), root)
    table = pq.read_table(root / "data" / "chunk-000" / "episode_000001.parquet")
    table = table.set_column(table.schema.get_field_index("episode_index"), "episode_index",
                             pa.array([3] * len(table), pa.int64()))
    pq.write_table(table, root / "data" / "chunk-000" / "episode_000003.parquet")
    videos = root / "videos" / "chunk-000" / "observation.images.cam_high"
    shutil.copyfile(videos / "episode_000001.mp4", videos / "episode_000003.mp4")
    return root


GR00T_TASKS = ["pick the yellow bottle from the table and place it in the basket on the left",
               "valid", "pick the yellow bottle from the table and hand it to the person in front"]
ROWS = 40  # rows kept per episode: enough for windows, small enough to be quick


def gr00t_like(root: Path, frame_index: bool = False) -> Path:
    """The two G1 episodes as NVIDIA's GR00T demo data writes LeRobot v2.0 (`frame_index` absent unless
    asked, float64 `timestamp`, `annotation.human.action.task_description` and `annotation.human.validity`
    integer columns indexing meta/tasks.jsonl, whose labels episodes.jsonl also lists among `tasks`),
    cut to ROWS rows, without the camera, and a `data_path` that puts `{episode_index}` in the chunk
    folder while the files sit in chunk-000."""
    (root / "meta").mkdir(parents=True)
    info = json.loads(g1("meta", "info.json").read_text())
    info["codebase_version"] = "v2.0"
    info["data_path"] = "data/chunk-{episode_index:03d}/episode_{episode_index:06d}.parquet"
    features = info["features"]
    del features["observation.images.cam_high"]
    if not frame_index:
        del features["frame_index"]
    features["timestamp"]["dtype"] = "float64"
    features["annotation.human.action.task_description"] = {"dtype": "int64", "shape": [1]}
    features["annotation.human.validity"] = {"dtype": "int64", "shape": [1]}
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    (root / "meta" / "tasks.jsonl").write_text(
        "".join(json.dumps({"task_index": i, "task": t}) + "\n" for i, t in enumerate(GR00T_TASKS)))
    described = {1: 0, 2: 2}  # episode -> its task's index
    (root / "meta" / "episodes.jsonl").write_text("".join(
        json.dumps({"episode_index": e, "tasks": [GR00T_TASKS[d], "valid"], "length": ROWS}) + "\n"
        for e, d in described.items()))
    for episode in G1_EPISODES:
        index = int(episode[-6:])
        table = pq.read_table(g1("data", "chunk-000", f"{episode}.parquet")).slice(0, ROWS)
        if not frame_index:
            table = table.drop(["frame_index"])
        table = table.set_column(table.schema.get_field_index("timestamp"), "timestamp",
                                 pc.cast(table["timestamp"], pa.float64()))
        labels = {"task_index": described[index], "annotation.human.action.task_description": described[index],
                  "annotation.human.validity": 1}
        for name, value in labels.items():
            column = pa.array([value] * len(table), pa.int64())
            at = table.schema.get_field_index(name)
            table = table.set_column(at, name, column) if at >= 0 else table.append_column(name, column)
        path = root / "data" / "chunk-000" / f"{episode}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
    return root
