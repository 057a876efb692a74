"""`robowds export STORE OUT --append` (issue 25, item 1 with 2 and 5), OUT a local folder (OUT at an S3
URL: tests/test_export_append_s3.py; `--executor ray`: tests/test_export_ray.py).

A store of 4 episodes is exported; the store grown to 7 (synth draws episode i from (seed, i), so the
first 4 are the same) is appended. The old files must be untouched (bytes and mtimes), the new shards
numbered on, and the appended export must hold, per split, the same samples (keys and member bytes, as
a multiset) as a full export of the grown store, with byte-identical statistics and side files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sys
import tarfile
from collections import Counter
from pathlib import Path

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from robowds.export.check.verify import verify_export
from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.job.config import load_config
from robowds.export.output.energon import energon_files
from robowds.reader import ShardIndex
from robowds.reader.keys import encode_key_index, key_hashes

from kills import WORK, run_and_kill_in, run_paused_in
from old_exports import without_episode_facts

SETTINGS = ["splits={train: rest, val: 0.3}", "window.duration_s=0.4", "stride=8", "shard.min_shards=2"]


def changed_store(grown: Path, to: Path) -> Path:
    """A copy of the grown store with one value of one row of ep_0001 changed (1e-9 added)."""
    shutil.copytree(grown, to)
    table = pq.read_table(to / "trajectories.parquet")
    joints = table.column("joints").to_pylist()
    joints[1][3][2] += 1e-9
    table = table.set_column(table.schema.get_field_index("joints"), "joints",
                             pa.array(joints, table.schema.field("joints").type))
    pq.write_table(table, to / "trajectories.parquet")
    return to


def _cli(*argv: str) -> int:
    args = ["export", *map(str, argv), "--quiet", "--workers", "1"]
    return main(args)


def _export(store: Path, out: Path, *extra: str) -> None:
    assert _cli(store, out, *[a for s in SETTINGS for a in ("--set", s)], *extra) == 0


def _files(out: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under OUT: relative path -> (mtime_ns, bytes)."""
    return {p.relative_to(out).as_posix(): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(out.rglob("*")) if p.is_file()}


def _samples(out: Path) -> dict[str, Counter]:
    """split -> multiset of (member name, member bytes) over every shard the manifest lists."""
    manifest = json.loads((out / "manifest.json").read_bytes())
    found: dict[str, Counter] = {}
    for split, entry in manifest["splits"].items():
        acc = found.setdefault(split, Counter())
        for shard in entry["shards"]:
            with tarfile.open(out / shard["path"]) as tar:
                for member in tar.getmembers():
                    acc[(member.name, tar.extractfile(member).read())] += 1
    return found


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Stores of 4 and 7 episodes; an export of the 4 and a full export of the 7."""
    root = tmp_path_factory.mktemp("append")
    write_synthetic_store(root / "s4", episodes=4)
    write_synthetic_store(root / "s7", episodes=7)
    _export(root / "s4", root / "o4")
    _export(root / "s7", root / "full7")
    return {"root": root, "s4": root / "s4", "s7": root / "s7", "o4": root / "o4", "full7": root / "full7"}


def test_append_adds_new_shards_and_equals_a_full_export(grown: dict[str, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    shutil.copytree(grown["o4"], out)
    old_manifest = json.loads((out / "manifest.json").read_bytes())
    before = _files(out)
    capsys.readouterr()
    assert _cli(grown["s7"], out, "--append") == 0
    printed = capsys.readouterr().out
    assert printed.startswith("appended 3 episodes (0 rejected) -> ") and " in 2 shards, " in printed
    after = _files(out)
    old_shards = [p for p in before if p.endswith((".tar", ".tar.idx"))]
    assert old_shards and all(after[p] == before[p] for p in old_shards)  # bytes and mtimes
    manifest = json.loads((out / "manifest.json").read_bytes())
    full = json.loads((grown["full7"] / "manifest.json").read_bytes())
    for split, entry in manifest["splits"].items():
        old = old_manifest["splits"].get(split, {"shards": []})["shards"]
        assert entry["shards"][:len(old)] == old
        numbers = [int(s["path"].split("-")[-1].split(".")[0]) for s in entry["shards"]]
        assert numbers == list(range(len(numbers)))  # numbered on after the split's last
        assert entry["episodes"] == full["splits"][split]["episodes"]
        assert entry["samples"] == full["splits"][split]["samples"]
    assert sum(len(e["shards"]) for e in manifest["splits"].values()) > \
        sum(len(e["shards"]) for e in old_manifest["splits"].values())
    assert set(after) - set(before) >= {p["path"] for e in manifest["splits"].values() for p in e["shards"]} - \
        set(before)
    assert not (out / ".robowds-work").exists()
    assert verify_export(out, progress=False).ok
    assert _samples(out) == _samples(grown["full7"])
    assert manifest["stats"] == full["stats"]
    for name in ("stats-state.msgpack", "episodes.msgpack", "episode-facts.msgpack"):
        assert (out / name).read_bytes() == (grown["full7"] / name).read_bytes(), name
    assert manifest["files"]["episode_facts"] == full["files"]["episode_facts"]
    for split in manifest["splits"]:  # the key index of the grown split (reader/keys.py): old shards and new
        keys = [key for key, _ in ShardIndex(out, split).positions()]
        assert (out / f"{split}.keys").read_bytes() == encode_key_index(key_hashes(keys))
        assert manifest["files"][f"keys.{split}"]["shards"] == len(manifest["splits"][split]["shards"])
    # the whole report (masked_fraction, duration_s from the parts saved in stats-state.msgpack) but the
    # shards' total bytes: the same samples in other shards are other tars (docs/output-format.md)
    assert manifest["report"].keys() == full["report"].keys()
    for doc in (manifest, full):
        storage = doc["report"]["storage"]
        del storage["output_bytes"], storage["amplification"]
    assert manifest["report"] == full["report"]
    assert manifest["source"] == full["source"] and manifest["schema"] == full["schema"]
    for rel, data in energon_files(manifest).items():  # Energon's metadata describes the grown export
        assert (out / rel).read_bytes() == data
    wids = json.loads((out / "train.wids.json").read_bytes())
    assert [s["url"] for s in wids["shardlist"]] == [s["path"] for s in manifest["splits"]["train"]["shards"]]
    # generation 2: generation 1's entry as the full export wrote it, then the append's
    assert old_manifest["generation"] == 1 and manifest["generation"] == 2
    assert old_manifest["generations"] == [{"generation": 1, "job_id": old_manifest["job_id"], "shards": {
        split: len(e["shards"]) for split, e in old_manifest["splits"].items()}}]
    assert manifest["generations"] == [*old_manifest["generations"], {"generation": 2, "job_id": manifest["job_id"],
                                       "shards": {split: len(e["shards"]) for split, e in manifest["splits"].items()}}]
    assert manifest["job_id"] != old_manifest["job_id"]
    assert full["generation"] == 1
    assert _cli(grown["s7"], out, "--append") == 0  # now up to date
    assert _files(out) == after
    # verify --since checks the side files as a full verify does (every append rewrites them)
    damaged = bytearray((out / "episode-facts.msgpack").read_bytes())
    damaged[-1] ^= 0xFF
    (out / "episode-facts.msgpack").write_bytes(bytes(damaged))
    result = verify_export(out, progress=False, since=1)
    old_count = sum(len(e["shards"]) for e in old_manifest["splits"].values())
    assert (result.selected, result.skipped) == (
        sum(len(e["shards"]) for e in manifest["splits"].values()) - old_count, old_count)  # new shards only
    assert result.failures == ["file episode-facts.msgpack: sha256 does not match the manifest"]


def test_append_with_nothing_added_is_up_to_date(grown: dict[str, Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    shutil.copytree(grown["o4"], out)
    before = _files(out)
    assert _cli(grown["s4"], out, "--append", "--set", "stride=8") == 0  # a setting equal to OUT's: fine
    assert "export is up to date" in capsys.readouterr().out
    assert _files(out) == before and not (out / ".robowds-work").exists()


def test_append_refuses_a_changed_or_removed_episode(grown: dict[str, Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    store, out = changed_store(grown["s7"], tmp_path / "s"), tmp_path / "o"
    shutil.copytree(grown["o4"], out)
    before = _files(out)
    capsys.readouterr()
    assert _cli(store, out, "--append") != 0
    err = capsys.readouterr().err
    assert ("error: cannot append: 1 episode(s) of the export changed or were removed from the store: "
            "ep_0001 (changed); nothing was written") in err
    assert _files(out) == before and not (out / ".robowds-work").exists()
    for name in ("trajectories", "sensors", "text", "images"):  # ep_0003 removed from every table
        t = pq.read_table(store / f"{name}.parquet")
        pq.write_table(t.filter(pc.not_equal(t.column("episode_id"), "ep_0003")), store / f"{name}.parquet")
    assert _cli(store, out, "--append") != 0
    err = capsys.readouterr().err
    assert ("error: cannot append: 2 episode(s) of the export changed or were removed from the store: "
            "ep_0001 (changed), ep_0003 (removed); nothing was written") in err
    assert "fix: an append only adds episodes: run a full export of the store into OUT with --overwrite" in err
    assert _files(out) == before and not (out / ".robowds-work").exists()


def test_append_refuses_a_differing_setting(grown: dict[str, Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    shutil.copytree(grown["o4"], out)
    before = _files(out)
    assert _cli(grown["s7"], out, "--append", "--set", "stride=4", "--seed", "0") != 0
    err = capsys.readouterr().err
    assert "--append uses the config of the export in" in err
    assert "differs at 1 key(s): stride (OUT: 8, given: 4)" in err
    assert _files(out) == before


def test_append_needs_a_plan_2_export_with_side_files(grown: dict[str, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    shutil.copytree(grown["o4"], out)
    doc = json.loads((out / "manifest.json").read_bytes())
    doc.pop("files")
    (out / "manifest.json").write_text(json.dumps(doc))
    assert _cli(grown["s7"], out, "--append") != 0
    err = capsys.readouterr().err
    assert "made without episodes.msgpack and stats-state.msgpack" in err
    assert "fix: run a full export of the store into OUT with --overwrite" in err
    assert load_config(None)  # the default config is untouched by the CLI's parsing


@pytest.mark.parametrize(("extra", "out", "message"), [
    (["--overwrite"], None, "error: --append and --overwrite exclude each other"),
    (["--break-lock"], None, "error: --break-lock is for an output URL"),
])
def test_append_refuses_what_it_does_not_do(grown: dict[str, Path], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str], extra: list[str],
                                                out: str | None, message: str) -> None:
    target = out or tmp_path / "o"
    assert _cli(grown["s7"], target, "--append", *extra) != 0
    assert message in capsys.readouterr().err
    assert out is not None or not (tmp_path / "o").exists()  # nothing created


def test_append_retries_an_episode_the_export_rejected(grown: dict[str, Path], tmp_path: Path) -> None:
    """An episode rejected then (a missing media file) and fine now is appended like a new one."""
    broken, out = tmp_path / "s", tmp_path / "o"
    shutil.copytree(grown["s4"], broken)
    (broken / "media/overview/ep_0002.png").unlink()
    _export(broken, out, "--set", "on_bad_episode=skip")
    doc = json.loads((out / "manifest.json").read_bytes())
    assert [r["episode_id"] for r in doc["report"]["episodes"]["rejected"]] == ["ep_0002"]
    assert _cli(grown["s7"], out, "--append") == 0
    manifest = json.loads((out / "manifest.json").read_bytes())
    full = json.loads((grown["full7"] / "manifest.json").read_bytes())
    assert manifest["report"]["episodes"] == full["report"]["episodes"]  # 7 exported, none rejected
    assert _samples(out) == _samples(grown["full7"])
    for name in ("episodes.msgpack", "episode-facts.msgpack"):  # the rejected episode's facts row replaced
        assert (out / name).read_bytes() == (grown["full7"] / name).read_bytes(), name
    assert verify_export(out, progress=False).ok


def test_append_to_an_export_without_episode_facts_writes_none(grown: dict[str, Path], tmp_path: Path) -> None:
    """An export made before episode-facts.msgpack appends; its old episodes' facts are not known without
    reading them again, so the appended export lists no facts file either (docs/output-format.md)."""
    out = tmp_path / "o"
    without_episode_facts(grown["o4"], out)
    assert _cli(grown["s7"], out, "--append") == 0
    manifest = json.loads((out / "manifest.json").read_bytes())
    assert "episode_facts" not in manifest["files"] and not (out / "episode-facts.msgpack").exists()
    assert (out / "episodes.msgpack").read_bytes() == (grown["full7"] / "episodes.msgpack").read_bytes()
    assert verify_export(out, progress=False).ok


def _refused_while_held(store: Path, out: Path, holder: int, capsys: pytest.CaptureFixture[str]) -> None:
    """An `--append` into `out` while the export process `holder` (stopped) holds its lock: one error
    naming OUT, the holder and the fix; nothing written (bytes and mtimes, the work folder included)."""
    inside = _files(out)
    capsys.readouterr()
    assert _cli(store, out, "--append") == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert (f"robowds export: error: another robowds export is writing {out.resolve()} (pid {holder} on host "
            f"{socket.gethostname()}, since ") in err
    assert ("fix: wait for that export or append to finish, then run the append again (it adds what OUT lacks "
            "then; a crashed export frees its lock by itself)") in err
    assert _files(out) == inside


@pytest.mark.slow
def test_sigkill_during_an_append_leaves_the_old_or_the_new_export(grown: dict[str, Path], tmp_path: Path) -> None:
    """Kill an append (a real process, SIGKILL of its group) once its work folder shows staging (the
    map), then the reduce, then the publish; whatever OUT shows outside the work folder is a file of the
    old export or of the finished append, byte for byte, and before the publish the old export is all
    there (bytes and mtimes) and verifies; a re-run ends byte-identical to an uninterrupted append, the
    old shards never rewritten (same mtimes)."""
    reference, out = tmp_path / "ref", tmp_path / "o"
    shutil.copytree(grown["o4"], reference)
    shutil.copytree(grown["o4"], out)
    old = _files(out)
    old_manifest = (out / "manifest.json").read_bytes()
    assert _cli(grown["s7"], reference, "--append") == 0
    done = {rel: data for rel, (_, data) in _files(reference).items()}
    cmd = [sys.executable, "-m", "robowds.export", str(grown["s7"]), str(out), "--append", "--quiet", "--workers", "1"]
    landed: list[str] = []
    for target in ("map", "reduce", "publish"):
        landed.append(run_and_kill_in(cmd, dict(os.environ), out, 3, target, 0.0, old_manifest))
        files = _files(out)
        for rel, (_, data) in files.items():
            if WORK not in rel and rel != ".robowds-lock":
                assert data in (done.get(rel), old.get(rel, (0, None))[1]), f"{rel} is neither old nor new"
        if landed[-1] in ("map", "staged", "reduce"):  # before the journal: the old export, untouched
            assert all(files[rel] == old[rel] for rel in old), landed
            assert verify_export(out, progress=False).ok
    print(f"kills landed in {landed}")
    assert landed[0] == "map", landed  # killed the moment the first of the 3 new episodes was staged
    assert _cli(grown["s7"], out, "--append") == 0  # the re-run, in this process (no interpreter start)
    final = _files(out)
    assert {rel: data for rel, (_, data) in final.items()} == done
    assert all(final[rel] == old[rel] for rel in old if rel.endswith((".tar", ".tar.idx")))


@pytest.mark.slow
@pytest.mark.parametrize("holder", ["--append", "--overwrite"])
def test_an_append_while_another_export_holds_out_is_refused(grown: dict[str, Path], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str], holder: str) -> None:
    """An append, or a full export (`--overwrite`), a real process stopped in its staging, holds OUT:
    an `--append` then is refused with one error naming OUT, the holder and the fix, and writes
    nothing; the holder, let go on, finishes as an uninterrupted run does, byte for byte."""
    out, reference = tmp_path / "o", tmp_path / "ref"
    shutil.copytree(grown["o4"], out)
    if holder == "--append":
        shutil.copytree(grown["o4"], reference)
        assert _cli(grown["s7"], reference, "--append") == 0
    else:
        reference = grown["full7"]
    old_manifest = (out / "manifest.json").read_bytes()
    cmd = [sys.executable, "-m", "robowds.export", str(grown["s7"]), str(out), holder, "--quiet", "--workers", "1",
           *([a for s in SETTINGS for a in ("--set", s)] if holder == "--overwrite" else [])]
    episodes = 3 if holder == "--append" else 7  # what the holder stages
    phase, code = run_paused_in(cmd, dict(os.environ), out, episodes, "map",
                                lambda pid: _refused_while_held(grown["s7"], out, pid, capsys), old_manifest)
    assert (phase, code) == ("map", 0)
    assert {rel: data for rel, (_, data) in _files(out).items()} == \
        {rel: data for rel, (_, data) in _files(reference).items()}

def _camera_store(root: Path, episodes: int) -> Path:
    """`episodes` episodes of 2 s: `utm` [time, northing at 5e6 m x 2^e, time] (float32 loses precision:
    report.float32_loss; its spacing doubles per episode, so ep2, the new one, loses the most) and a
    camera `cam` (an mp4 of 20 frames: report.video)."""
    from videos import gradient_frames, write_frames

    root.mkdir(parents=True)
    t = np.arange(20) / 10.0  # [20] s
    rows = []
    for e in range(episodes):
        utm = np.column_stack([t, 5e6 * 2 ** e + 0.2 * np.arange(20), t])  # [20, 3]
        write_frames(root / f"media/ep{e}.mp4", np.roll(gradient_frames(20, 32, 32), e, axis=2), codec="mpeg4")
        rows.append({"episode_id": f"ep{e}", "utm": utm.tolist(), "cam": {"path": f"media/ep{e}.mp4", "fps": 10.0}})
    pq.write_table(pa.Table.from_pylist(rows), root / "t.parquet")
    return root


def test_append_report_equals_a_full_export_with_video_and_float32_loss(tmp_path: Path) -> None:
    """report.video (bytes per frame, PSNR mean and min), float32_loss (the worst episode, counted over
    all) and masked_fraction of an appended export are a full export's, from the parts saved in
    stats-state.msgpack; an export saved without them (made before them) appends with the old
    export's report entries, as documented."""
    small, grown = _camera_store(tmp_path / "s2", 2), _camera_store(tmp_path / "s3", 3)
    sets = ["--set", "window.duration_s=0.4", "--set", "stride=8"]
    for store, out in ((small, "o2"), (grown, "full3")):
        assert _cli(store, tmp_path / out, *sets) == 0
    old = tmp_path / "old-state"
    shutil.copytree(tmp_path / "o2", old)
    assert _cli(grown, tmp_path / "o2", "--append") == 0
    report = json.loads((tmp_path / "o2" / "manifest.json").read_bytes())["report"]
    full = json.loads((tmp_path / "full3" / "manifest.json").read_bytes())["report"]
    assert full["float32_loss"]["utm"]["episode_id"] == "ep2" and full["float32_loss"]["utm"]["episodes"] == 3
    assert full["video"]["cam"]["psnr_db_mean"] is not None
    for key in ("video", "float32_loss", "masked_fraction", "duration_s"):
        assert report[key] == full[key], key
    for name in ("stats-state.msgpack", "episode-facts.msgpack"):  # the camera's facts (rate, warnings) too
        assert (tmp_path / "o2" / name).read_bytes() == (tmp_path / "full3" / name).read_bytes(), name
    # an export whose stats-state.msgpack has no report parts: its report entries are kept
    state = msgpack.unpackb((old / "stats-state.msgpack").read_bytes())
    before = json.loads((old / "manifest.json").read_bytes())
    del state["report"]
    data = msgpack.packb(state, use_bin_type=True)
    (old / "stats-state.msgpack").write_bytes(data)
    before["files"]["stats_state"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (old / "manifest.json").write_text(json.dumps(before))
    assert _cli(grown, old, "--append") == 0
    kept = json.loads((old / "manifest.json").read_bytes())["report"]
    for key in ("video", "float32_loss", "masked_fraction"):
        assert kept[key] == before["report"][key], key
    assert kept["float32_loss"]["utm"]["episodes"] == 2 and kept["episodes"] == full["episodes"]
    assert "report" not in msgpack.unpackb((old / "stats-state.msgpack").read_bytes())  # still none: later appends too
    assert verify_export(old, progress=False).ok
