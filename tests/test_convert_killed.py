"""A conversion killed at any point leaves no store (nothing that validates but lacks episodes), and
the next run converts the whole dataset, clearing what the killed one left."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from robowds.export.store.validate import validate_store

from realdata import g1


def _many_episodes(root: Path, count: int = 20) -> Path:
    """The vendored G1 dataset with episodes 3..count-1 linked to episode 1's files (meta lists 100), so
    the conversion lasts long enough to be killed between rows."""
    shutil.copytree(g1(), root, symlinks=True)
    data = root / "data" / "chunk-000"
    video = root / "videos" / "chunk-000" / "observation.images.cam_high"
    for index in range(3, count):
        (data / f"episode_{index:06d}.parquet").symlink_to(data / "episode_000001.parquet")
        (video / f"episode_{index:06d}.mp4").symlink_to(video / "episode_000001.mp4")
    return root


def _work_folders(parent: Path) -> list[Path]:
    return [p for p in parent.iterdir() if p.name.startswith(".store.converting-")] if parent.exists() else []


@pytest.mark.parametrize("when", ["started", "rows-written"])
def test_a_killed_conversion_leaves_no_store_and_the_rerun_is_whole(tmp_path: Path, when: str) -> None:
    store, src = tmp_path / "store", _many_episodes(tmp_path / "src")
    command = [sys.executable, "-c", "import sys; from robowds.export.cli.main import main; sys.exit(main(sys.argv[1:]))",
               "convert", "lerobot", str(src), str(store),
               "--quiet", "--workers", "2"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            work = _work_folders(tmp_path)
            if work and (when == "started" or (work[0] / "episodes.parquet").exists()):
                os.kill(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.002)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    if proc.returncode != -signal.SIGKILL:
        pytest.fail(f"the conversion ended (exit {proc.returncode}) before it could be killed {when}: "
                    f"{proc.stderr.read().decode()[-500:] if proc.stderr else ''}")
    assert not store.exists()  # nothing published: no store that validates but is incomplete
    from robowds.export.cli.main import main

    assert main(["convert", "lerobot", str(src), str(store), "--quiet", "--workers", "1"]) == 0
    assert validate_store(store).exportable
    assert json.loads((store / "convert_report.json").read_text())["episodes"] == 19
    assert _work_folders(tmp_path) == []  # the killed run's work folder is gone
