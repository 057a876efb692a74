"""Staged windows are let go once their shard is written (issue 26, item 6: the export's disk peak was
2x the export, 3x with --overwrite; `export/job/staging_release.py`). `scripts/bench_disk_peak.py`
measures the peak; here: what is freed, what is kept, and that a resumed job neither reads a freed
window nor stages its episodes again."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import msgpack
import numpy as np
import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.job import run as job_run
from robowds.export.job.stage import episode_paths, staged_record
from robowds.export.job.staging_release import RELEASED, StagingRelease, punch_hole, released_windows
from robowds.export.store import episodes as store_episodes

from test_export_e2e import tree_bytes

SIZES = [70_000, 5_000, 90_000, 3_000, 120_000, 64_000]  # bytes of the episode's 6 windows
BLOCK = 4096


def _staged(work: Path, ep: int = 0) -> tuple[dict, bytes]:
    """A staged episode as stage.py writes it: the windows back to back, the record with their CRCs."""
    rng = np.random.default_rng(ep)
    blobs = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in SIZES]
    data = b"".join(blobs)
    bin_path, rec_path = episode_paths(work, ep)
    bin_path.write_bytes(data)
    record = {"episode_id": f"e{ep}", "split": "train", "error": None, "bin_bytes": len(data),
              "sizes": np.asarray(SIZES, np.int64).tobytes(),
              "window_crc32": np.asarray([zlib.crc32(b) for b in blobs], "<u4").tobytes()}
    rec_path.write_bytes(msgpack.packb(record, use_bin_type=True))
    return record, data


def _entries(ep: int, windows: list[int]) -> np.ndarray:
    starts = np.concatenate([[0], np.cumsum(SIZES)])
    return np.asarray([[ep, starts[w], SIZES[w]] for w in windows], np.int64)  # [S, 3]


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_released_windows_are_freed_and_the_rest_is_kept(tmp_path: Path) -> None:
    record, data = _staged(tmp_path)
    bin_path = episode_paths(tmp_path, 0)[0]
    (tmp_path / "ready").mkdir()
    probe = tmp_path / "probe"
    probe.write_bytes(b"x" * 2 * BLOCK)
    fd = os.open(probe, os.O_RDWR)
    try:
        if not punch_hole(fd, 0, BLOCK):
            pytest.skip("this file system cannot punch holes (then only whole files are released)")
    finally:
        os.close(fd)
    release = StagingRelease(tmp_path, [record], {"e0": 0}, {})
    before = _allocated(bin_path)
    release.shard_done(_entries(0, [2, 4]), tmp_path / "ready" / "shard.tar")
    starts = np.concatenate([[0], np.cumsum(SIZES)])
    kept = bin_path.read_bytes()
    assert len(kept) == len(data)  # the size stays: offsets of later windows hold
    for w in (0, 1, 3, 5):  # windows no shard has taken yet: every byte as staged
        assert kept[starts[w]:starts[w + 1]] == data[starts[w]:starts[w + 1]]
    # windows 2 and 4 are separate runs: only the whole blocks inside each are freed
    inside = sum((starts[w + 1] // BLOCK - -(-starts[w] // BLOCK)) * BLOCK for w in (2, 4))
    assert before - _allocated(bin_path) == inside
    # window 3 joins 2..4 into one run: the blocks shared with its neighbours go too
    release.shard_done(_entries(0, [3]), tmp_path / "ready" / "shard.tar")
    run = (starts[5] // BLOCK - -(-starts[2] // BLOCK)) * BLOCK
    assert before - _allocated(bin_path) == run
    journal = np.frombuffer((tmp_path / RELEASED).read_bytes(), "<i4").reshape(-1, 2)
    assert journal.tolist() == [[0, 2], [0, 4], [0, 3]]
    bits = released_windows(tmp_path)
    assert list(bits) == [0]
    # a re-run checks only what is still needed: the freed windows read as zeros and are not checked
    assert staged_record(*episode_paths(tmp_path, 0), bits[0]) == record
    assert staged_record(*episode_paths(tmp_path, 0)) is None  # without the journal the CRCs differ
    with open(bin_path, "r+b") as fh:  # a torn window still needed: staged again
        fh.seek(starts[5] + 10)
        fh.write(b"\0" * 8)
    assert staged_record(*episode_paths(tmp_path, 0), bits[0]) is None
    release.shard_done(_entries(0, [0, 1, 5]), tmp_path / "ready" / "shard.tar")  # all taken: the file goes
    assert not bin_path.exists() and episode_paths(tmp_path, 0)[1].exists()
    assert staged_record(*episode_paths(tmp_path, 0), released_windows(tmp_path)[0]) == record


def test_a_torn_last_journal_record_is_ignored(tmp_path: Path) -> None:
    (tmp_path / RELEASED).write_bytes(np.asarray([[3, 1], [3, 4]], "<i4").tobytes() + b"\x07\x00")
    bits = released_windows(tmp_path)
    assert list(bits) == [3] and np.unpackbits(np.frombuffer(bits[3], np.uint8))[:5].tolist() == [0, 1, 0, 0, 1]


def test_a_job_killed_after_its_shards_resumes_without_staging_again(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after the reduce (its staged windows all released, the files gone): the re-run loads no
    episode from the store, writes no shard, and ends byte-identical to an uninterrupted export."""
    store = write_synthetic_store(tmp_path / "store", episodes=4).root
    settings = ["--quiet", "--workers", "1", "--set", "shard.max_samples=40"]
    assert main(["export", str(store), str(tmp_path / "ref"), *settings]) == 0
    out = tmp_path / "out"

    def killed(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(job_run, "publish", killed)
        assert main(["export", str(store), str(out), *settings]) == 130
    work = out / ".robowds-work"
    assert not list(work.glob("ep-*.bin")) and len(list(work.glob("ep-*.rec"))) == 4  # all released
    loaded: list[str] = []
    real = store_episodes.EpisodeLoader.load

    def counting(self: store_episodes.EpisodeLoader, ids: list[str]):  # type: ignore[no-untyped-def]
        loaded.extend(ids)
        return real(self, ids)

    monkeypatch.setattr(store_episodes.EpisodeLoader, "load", counting)
    assert main(["export", str(store), str(out), *settings]) == 0
    assert loaded == [] and tree_bytes(out) == tree_bytes(tmp_path / "ref")
    assert json.loads((out / "manifest.json").read_text())["report"]["episodes"]["exported"] == 4
