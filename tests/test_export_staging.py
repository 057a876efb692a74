"""Staged episodes are trusted on a re-run only when they check out (export/job/stage.py): staging is
not fsynced, so a power loss can leave a renamed `.bin` without its bytes or a `.rec` torn; such an
episode is built again, to the same bytes, instead of going silently wrong into a shard."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import msgpack

from robowds.export.cli.synth import write_synthetic_store
from robowds.export.job.config import load_config
from robowds.export.job.spec import resolve
from robowds.export.job.stage import episode_paths, stage_episodes, staged_record


def _staged(work: Path, count: int) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(work.glob("ep-*")) if p.suffix in (".bin", ".rec")}


def test_a_damaged_staged_episode_is_built_again_to_the_same_bytes(tmp_path: Path) -> None:
    store = write_synthetic_store(tmp_path / "store", episodes=4, seed=2).root
    job, _ = resolve(store, load_config(None, ["window.duration_s=0.5", "exclude=[overview]"]))
    work = tmp_path / "work"
    work.mkdir()
    job = replace(job, work=str(work))
    ids = list(job.schema.episode_ids)
    first = stage_episodes((job, ids))
    clean = _staged(work, len(ids))
    assert len(clean) == 2 * len(ids)
    for ep in ids:  # every record carries its .bin's length and CRC-32, and checks out
        bin_path, rec_path = episode_paths(work, job.index[ep])
        record = staged_record(bin_path, rec_path)
        assert record is not None and record["bin_bytes"] == bin_path.stat().st_size > 0

    damaged = [episode_paths(work, job.index[ep]) for ep in ids]
    data = bytearray(damaged[0][0].read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped byte
    damaged[0][0].write_bytes(bytes(data))
    damaged[1][0].write_bytes(b"\0" * damaged[1][0].stat().st_size)  # renamed, its blocks never written
    damaged[2][1].write_bytes(b"\0" * 64)  # a zero-filled record
    damaged[3][0].unlink()  # a record without its .bin
    assert [staged_record(*paths) for paths in damaged] == [None] * 4

    again = stage_episodes((job, ids))
    assert _staged(work, len(ids)) == clean  # each built again, byte for byte
    assert again.episode_ids == first.episode_ids
    assert msgpack.packb(again.stats) == msgpack.packb(first.stats)

    mtimes = {p: p.stat().st_mtime_ns for p in work.glob("ep-*")}
    stage_episodes((job, ids))  # all staged and sound: nothing is written
    assert {p: p.stat().st_mtime_ns for p in work.glob("ep-*")} == mtimes


def test_a_map_tasks_payload_does_not_grow_with_the_store(tmp_path: Path) -> None:
    """What is pickled per map task is the spec cut to its batch: the same size for a store of 40 and
    of 400 episodes (the whole spec grows by ~100 bytes per episode, and went with every task)."""
    import pickle

    sizes = {}
    for episodes in (40, 400):
        store = write_synthetic_store(tmp_path / f"s{episodes}", episodes=episodes, seed=1).root
        job, _ = resolve(store, load_config(None, []))
        batch = job.schema.episode_ids[8:16]
        cut = job.for_episodes(batch)
        assert cut.schema.episode_ids == batch and sorted(cut.index) == sorted(batch)
        assert {e: cut.index[e] for e in batch} == {e: job.index[e] for e in batch}
        assert all(cut.schema.rows[t] == {e: job.schema.rows[t][e] for e in batch} for t in job.schema.rows)
        sizes[episodes] = (len(pickle.dumps(cut)), len(pickle.dumps(job)))
    assert sizes[400][1] > 5 * sizes[40][1] // 2  # the whole spec grows with the store
    assert abs(sizes[400][0] - sizes[40][0]) <= 64, sizes  # a task's does not (key widths aside)
