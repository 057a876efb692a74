"""The export's side files (issue 25, items 2 and 4): per-episode identity (`episodes.msgpack`) and the
mergeable statistics state (`stats-state.msgpack`), both listed in the manifest and checked by verify.

What a later `export --append` builds on: an old episode whose rows or media changed, or that was
removed, is found by comparing the old export's table with fingerprints of the current store taken by
the same loader; and the saved state of an export of E1 merged with the states of new episodes E2
(made by the export's own map task) is byte-identical to the state and statistics of an export of
E1 + E2 (the report's parts saved beside the state too).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robowds.export.check.verify import verify_export
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.job.config import load_config
from robowds.export.job.report import SplitStats
from robowds.export.job.run import run_export
from robowds.export.job.report_state import merge_parts, report_parts
from robowds.export.job.side_files import (EpisodeChanges, compare_episodes, decode_episodes, encode_stats_state,
                                           load_report_parts, load_stats_state, read_declarations, read_stats_state)
from robowds.export.job.spec import resolve
from robowds.export.job.stage import load_record, stage_episodes
from robowds.export.store.episode_identity import row_digest
from robowds.export.store.episodes import EpisodeLoader
from robowds.reader.manifest import ManifestError, dump_manifest, parse_manifest

SETTINGS = ["splits={train: rest}", "window.duration_s=0.4", "stride=8"]


def _export(store: Path, out: Path, workers: int = 1) -> dict:
    run_export(store, out, load_config(None, SETTINGS), workers=workers, progress=False)
    return json.loads((out / "manifest.json").read_bytes())


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A store of 4 episodes and one of 7 (the same 4 first: synth draws episode i from (seed, i)),
    each exported once (the 7-episode one with 2 workers)."""
    root = tmp_path_factory.mktemp("identity")
    write_synthetic_store(root / "s4", episodes=4)
    write_synthetic_store(root / "s7", episodes=7)
    _export(root / "s4", root / "o4")
    _export(root / "s7", root / "o7", workers=2)
    return {"root": root, "s4": root / "s4", "s7": root / "s7", "o4": root / "o4", "o7": root / "o7"}


def _current(store: Path) -> dict[str, tuple[str | None, str]]:
    """id -> (fingerprint, split) of the store as it is now, through the export's loader (what an
    append computes), without building any window."""
    job, _ = resolve(store, load_config(None, SETTINGS))
    loaded = EpisodeLoader(job.schema, job.load_fields).load(job.schema.episode_ids)
    return {d.episode_id: (d.fingerprint, job.splits[d.episode_id]) for d in loaded}


def _old(out: Path) -> dict[str, tuple[str | None, str]]:
    return {ep: (e.fingerprint, e.split) for ep, e in decode_episodes((out / "episodes.msgpack").read_bytes()).items()}


def test_manifest_lists_side_files_and_episode_table(stores: dict[str, Path]) -> None:
    manifest = json.loads((stores["o4"] / "manifest.json").read_bytes())
    # keys: reader/keys.py; episode_facts: job/episode_facts.py
    assert sorted(manifest["files"]) == ["episode_facts", "episodes", "keys.train", "stats_state"]
    assert manifest["format_version"] == 2  # the side files are optional for readers: no version bump
    for entry in manifest["files"].values():
        data = (stores["o4"] / entry["path"]).read_bytes()
        assert len(data) == entry["bytes"]
    table = decode_episodes((stores["o4"] / "episodes.msgpack").read_bytes())
    assert read_declarations((stores["o4"] / "episodes.msgpack").read_bytes()) == hashlib.sha256(
        (stores["s4"] / "store.yaml").read_bytes()).hexdigest()
    assert list(table) == ["ep_0000", "ep_0001", "ep_0002", "ep_0003"]
    assert all(e.split == "train" and e.exported and len(e.fingerprint or "") == 64 for e in table.values())
    assert sum(e.windows for e in table.values()) == manifest["splits"]["train"]["samples"]
    assert len({e.fingerprint for e in table.values()}) == 4
    # the map tasks' fingerprints are the loader's (what an append computes); the shared episodes of
    # the 7-episode store, exported with 2 workers and other batches, have the same ones
    assert _old(stores["o4"]) == _current(stores["s4"])
    assert {ep: v for ep, v in _old(stores["o7"]).items() if ep in table} == _old(stores["o4"])
    assert compare_episodes(_old(stores["o4"]), _current(stores["s7"])) == EpisodeChanges(
        [], [], ["ep_0004", "ep_0005", "ep_0006"])


def test_changed_and_removed_episodes_are_found(stores: dict[str, Path]) -> None:
    store = stores["root"] / "edited"
    write_synthetic_store(store, episodes=4)
    table = pq.read_table(store / "trajectories.parquet")
    joints = table.column("joints").to_pylist()
    joints[1][3][2] += 1e-9  # one value of one row of one episode
    table = table.set_column(table.schema.get_field_index("joints"), "joints", pa.array(joints, table.schema.field("joints").type))
    pq.write_table(table, store / "trajectories.parquet")
    with open(store / "media/overview/ep_0002.png", "ab") as fh:  # a media file of another size
        fh.write(b"\0")
    for name in ("trajectories", "sensors", "text", "images"):  # ep_0003 removed from every table
        t = pq.read_table(store / f"{name}.parquet")
        pq.write_table(t.slice(0, 3), store / f"{name}.parquet")
    assert compare_episodes(_old(stores["o4"]), _current(store)) == EpisodeChanges(
        ["ep_0001", "ep_0002"], ["ep_0003"], [])
    moved = {**_current(stores["s4"]), "ep_0000": (_current(stores["s4"])["ep_0000"][0], "val")}
    assert compare_episodes(_old(stores["o4"]), moved).changed == ["ep_0000"]  # another split: changed
    unknown = {**_old(stores["o4"]), "ep_0001": (None, "train")}  # unreadable then: nothing proves it the same
    assert compare_episodes(unknown, _current(stores["s4"])).changed == ["ep_0001"]


def test_row_digest_is_of_values_not_buffers() -> None:
    rows = [[[0.0, 1.5], [0.1, float("nan")]], None, [[0.2, 2.0]]]
    big = pa.array(rows, pa.list_(pa.list_(pa.float64())))  # nulls elsewhere: a validity bitmap
    alone = pa.array([rows[2]], pa.list_(pa.field("element", pa.list_(pa.float64()))))
    fixed = pa.array([rows[2]], pa.list_(pa.list_(pa.float64(), 2)))
    assert row_digest({"joints": big.slice(2, 1)}) == row_digest({"joints": alone})
    assert row_digest({"joints": fixed}) != row_digest({"joints": alone})  # another type: another row
    assert row_digest({"joints": big.slice(1, 1)}) == row_digest({"joints": pa.array([None], big.type)})
    assert row_digest({"joints": big.slice(0, 1)}) != row_digest({"joints": big.slice(2, 1)})
    typed = pa.array([{"t": [0.0, 0.1], "v": [[True], [False]]}, {"t": [0.0], "v": [[True]]}])
    assert row_digest({"f": typed.slice(1, 1)}) == row_digest({"f": pa.array([{"t": [0.0], "v": [[True]]}])})
    text = pa.array(["a", None, "pick the cup"])
    assert row_digest({"task": text.slice(2, 1)}) == row_digest({"task": pa.array(["pick the cup"])})


def test_saved_state_merged_with_new_episodes_equals_the_full_export(stores: dict[str, Path], tmp_path: Path) -> None:
    """Export of E1 (4 episodes) + the map task's states of E2 (3 new ones) = export of E1 + E2, to the byte."""
    saved = (stores["o4"] / "stats-state.msgpack").read_bytes()
    full = (stores["o7"] / "stats-state.msgpack").read_bytes()
    assert saved != full
    job, _ = resolve(stores["s7"], load_config(None, SETTINGS))
    new = ["ep_0004", "ep_0005", "ep_0006"]
    batch = stage_episodes((replace(job.for_episodes(new), work=str(tmp_path)), new))  # the export's map task
    merged = SplitStats()
    merged.fold_states(load_stats_state(saved))
    merged.fold_states(batch.stats)
    folded = merged.result()
    # the report's parts (report_state.py): saved ones merged with the new episodes' records'
    parts = merge_parts(load_report_parts(saved), report_parts(load_record(tmp_path, job.index[ep]) for ep in new))
    assert parts == load_report_parts(full)
    assert encode_stats_state(folded, parts) == full
    manifest = json.loads((stores["o7"] / "manifest.json").read_bytes())
    assert {split: {k: s.summary() for k, s in keys.items()} for split, keys in folded.items()} == manifest["stats"]
    assert {split: {k: s.summary() for k, s in keys.items()} for split, keys in read_stats_state(full).items()} \
        == manifest["stats"]


def test_verify_checks_the_side_files(stores: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    out = tmp_path / "o"
    shutil.copytree(stores["o4"], out)
    assert verify_export(out, progress=False).ok
    data = bytearray((out / "episodes.msgpack").read_bytes())
    data[-1] ^= 1
    (out / "episodes.msgpack").write_bytes(bytes(data))
    (out / "stats-state.msgpack").unlink()
    assert verify_export(out, progress=False).failures == [
        "file episodes.msgpack: sha256 does not match the manifest", "file stats-state.msgpack: missing"]
    # a state listed with its own hash, but not the one the manifest's statistics came from
    shutil.copy(stores["o4"] / "episodes.msgpack", out / "episodes.msgpack")
    other = (stores["o7"] / "stats-state.msgpack").read_bytes()
    (out / "stats-state.msgpack").write_bytes(other)
    doc = json.loads((out / "manifest.json").read_bytes())
    doc["files"]["stats_state"].update(bytes=len(other), sha256=hashlib.sha256(other).hexdigest())
    (out / "manifest.json").write_bytes(dump_manifest(doc))
    assert verify_export(out, progress=False).failures == [
        "file stats-state.msgpack: the statistics it gives differ from the manifest's stats for train/actions, "
        "train/gripper_cmd, train/imu, train/joints, train/orientation"]


def test_manifest_refuses_side_files_outside_the_folder(stores: dict[str, Path]) -> None:
    """Publish deletes the files a replaced manifest lists: a side file's path must stay inside OUT."""
    doc = json.loads((stores["o4"] / "manifest.json").read_bytes())
    doc["files"]["episodes"]["path"] = "../notes.txt"
    with pytest.raises(ManifestError, match=r"^manifest.json: file 'episodes': path '../notes.txt' must be a plain "
                                            r"relative path inside the dataset folder$"):
        parse_manifest(json.dumps(doc))
    doc["files"]["episodes"] = {"path": "episodes.msgpack", "bytes": 1}
    with pytest.raises(ManifestError, match=r"^manifest.json: file 'episodes': 'sha256' is missing$"):
        parse_manifest(json.dumps(doc))
