"""Forked DataLoader workers after FFmpeg work in the parent.

A swscale context built with PyAV's defaults owns a thread per CPU; a forked child that frees one it
inherited (garbage collection after fork) waits forever on threads that do not exist in the child.
That hung `DataLoader(num_workers=2)` after an in-process video export (this test, on the code before
the fix, timed out in its first epoch). Export and reader now convert and decode single-threaded, so
the platform's default `fork` start is safe for our own FFmpeg use, and ShardLoader no longer forces
forkserver for video datasets (which cost ~1 s of worker start-up per epoch).
"""

from __future__ import annotations

import gc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from torch.utils.data import DataLoader

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.reader import ShardDataset, ShardLoader

from videos import write_video


def _video_store(root: Path) -> Path:
    store = root / "store"
    write_synthetic_store(store, episodes=2, seed=0)
    for i in range(2):
        write_video(store / "media" / f"ep_{i:04d}.mp4", [k * 100 for k in range(40)])
    video = pa.array([{"path": f"media/ep_{i:04d}.mp4", "fps": 10.0} for i in range(2)])
    pq.write_table(pa.table({"episode_id": ["ep_0000", "ep_0001"], "cam_high": video}), store / "videos.parquet")
    return store


def _collect(worker_id: int) -> None:
    """Free what the child inherited now (the hang happened whenever the child's GC got to it)."""
    gc.collect()


def test_forked_workers_after_an_in_process_video_export(tmp_path: Path) -> None:
    """Worst case: nothing the export left in reference cycles is collected before the fork."""
    gc.disable()
    try:
        _export_then_fork(tmp_path)
    finally:
        gc.enable()


def _export_then_fork(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["export", str(_video_store(tmp_path)), str(out), "--quiet", "--workers", "1",
                 "--set", "streams.cam_high.encoding=mp4", "--set", "streams.cam_high.duration_s=0.5"]) == 0
    expected = sorted(s["__key__"] for s in ShardDataset(out, "train", shuffle=False))  # decodes in the parent
    assert len(expected) > 40
    # one epoch of each loader, each forking fresh workers (the hang came in the first epoch)
    samples = DataLoader(ShardDataset(out, "train", seed=0), batch_size=None, num_workers=2,
                         multiprocessing_context="fork", timeout=60, worker_init_fn=_collect)
    assert sorted(s["__key__"] for s in samples) == expected  # a hang fails after 60 s
    loader = ShardLoader(ShardDataset(out, "train", seed=1), batch_size=4, num_workers=2,
                         timeout=60, worker_init_fn=_collect)  # the platform default: fork on Linux
    batches = list(loader)
    assert sorted(k for b in batches for k in b["__key__"]) == expected
    assert tuple(batches[0]["cam_high"].shape) == (4, 5, 48, 64, 3)
