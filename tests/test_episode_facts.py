"""The per-episode facts an export keeps for `robowds report` (issue 27): `episode-facts.msgpack`,
listed under the manifest's `files.episode_facts`, read by `read_episode_facts`, checked by verify.

One store of 4 synthetic episodes whose rates are known: ep_0000's 50 Hz joints have one 0.5 s hole
and two repeated timestamps, ep_0001 did not record `imu`, ep_0002's image file is gone (rejected
before it could be loaded) and ep_0003's actions are too large for statistics (rejected after its
extent was known). A camera store checks the video columns and the fps and float32 warnings. The
append side (byte-identical to a full export, an old export without the file): test_export_append.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robowds.export.check.verify import verify_export
from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.errors import UserError
from robowds.export.job.episode_facts import EpisodeFacts, decode_facts, read_episode_facts
from robowds.export.store.location import store_location

from old_exports import without_episode_facts

SETTINGS = ["--quiet", "--workers", "1", "--set", "window.duration_s=0.4", "--set", "stride=8",
            "--set", "on_bad_episode=skip"]
# ep_0003's 1e200 actions overflow the float32 cast and their squares: why they are refused
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in (cast|square):RuntimeWarning")
FIELDS = ["actions", "gripper_cmd", "imu", "joints", "orientation"]


def _set_cell(path: Path, column: str, row: int, cell: object) -> None:
    table = pq.read_table(path)
    cells = table.column(column).to_pylist()
    cells[row] = cell
    index = table.schema.get_field_index(column)
    pq.write_table(table.set_column(index, column, pa.array(cells, table.schema.field(column).type)), path)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("facts")
    store = root / "s"
    write_synthetic_store(store, episodes=4)
    trajectories = pq.read_table(store / "trajectories.parquet")
    joints = np.asarray(trajectories.column("joints")[0].as_py())  # [T, 1+7] of ep_0000, 50 Hz from t=0
    kept = joints[~((joints[:, 0] > 2.0) & (joints[:, 0] < 2.5))]  # a 0.5 s hole: 2.0 s, then 2.5 s
    repeated = np.concatenate([kept[:10], kept[9:10], kept[9:10], kept[10:]])  # 2 repeated timestamps
    _set_cell(store / "trajectories.parquet", "joints", 0, repeated.tolist())
    actions = np.asarray(trajectories.column("actions")[3].as_py())  # [T, 1+7] of ep_0003
    actions[:, 1:] *= 1e200  # squares overflow: rejected when its statistics are taken, after its extent
    _set_cell(store / "trajectories.parquet", "actions", 3, actions.tolist())
    _set_cell(store / "sensors.parquet", "imu", 1, None)  # ep_0001 did not record imu
    (store / "media/overview/ep_0002.png").unlink()  # ep_0002 cannot be loaded
    out = root / "o"
    assert main(["export", str(store), str(out), *SETTINGS]) == 0
    manifest = json.loads((out / "manifest.json").read_bytes())
    imu = np.asarray(pq.read_table(store / "sensors.parquet").column("imu")[0].as_py())  # [M, 1+6] of ep_0000
    return {"out": out, "manifest": manifest, "facts": read_episode_facts(store_location(out), manifest),
            "joints_times": kept[:, 0], "imu_times": imu[:, 0], "ep3_times": actions[:, 0]}


def test_rate_and_gaps_of_a_50hz_stream_with_one_half_second_hole(made: dict) -> None:
    facts: EpisodeFacts = made["facts"]
    assert facts.fields == FIELDS and facts.episode_id == ["ep_0000", "ep_0001", "ep_0002", "ep_0003"]
    joints, imu = FIELDS.index("joints"), FIELDS.index("imu")
    # the rate is 1 / the cleaned stream's median period (repeated timestamps dropped first)
    assert facts.rate_hz[0, joints] == 1.0 / np.median(np.diff(made["joints_times"]))
    assert facts.rate_hz[0, joints] == pytest.approx(50.0, rel=1e-12)
    assert facts.gaps[0, joints] == 1  # the 0.5 s hole; 2.5 x 20 ms is the max gap
    assert facts.gaps[1, joints] == 0 and facts.rate_hz[1, joints] == pytest.approx(50.0, rel=1e-12)
    # the synthetic IMU: 200 Hz with jittered stamps and one dropout of 0.15-0.3 s
    assert facts.rate_hz[0, imu] == 1.0 / np.median(np.diff(made["imu_times"]))
    assert facts.gaps[0, imu] == 1
    assert facts.gaps[0].tolist() == [0, 0, 1, 1, 0]
    assert facts.rate_hz[0, FIELDS.index("gripper_cmd")] == pytest.approx(10.0, rel=1e-12)
    assert facts.warnings[0] == ["joints: 2 duplicate timestamps dropped (the last sample of each run kept)"]
    assert facts.duration_s[0] == made["joints_times"][-1] and facts.windows[0] == 12 and facts.exported[0]
    assert facts.reason[0] is None and facts.split == ["train"] * 4


def test_a_missing_stream_is_all_masked_without_a_rate(made: dict) -> None:
    facts, manifest = made["facts"], made["manifest"]
    imu = FIELDS.index("imu")
    assert facts.missing[1].tolist() == [False, False, True, False, False] and not facts.missing[0].any()
    assert math.isnan(facts.rate_hz[1, imu]) and facts.gaps[1, imu] == 0
    per_window = manifest["schema"]["imu"]["shape"][0]
    assert facts.masked_steps[1, imu] == facts.steps[1, imu] == facts.windows[1] * per_window == 14 * per_window
    assert facts.warnings[1] == ["imu: not recorded in this episode (its windows carry zeros with an all-false mask)"]
    # masked and total steps add up to the parts the export report's masked_fraction comes from
    state = msgpack.unpackb((made["out"] / "stats-state.msgpack").read_bytes())
    assert {f: [int(facts.masked_steps[:, i].sum()), int(facts.steps[:, i].sum())] for i, f in enumerate(FIELDS)} \
        == state["report"]["masked"]


def test_rejected_episodes_keep_their_reason(made: dict) -> None:
    facts, manifest = made["facts"], made["manifest"]
    rejected = {r["episode_id"]: f"{r['field']}: {r['message']}" for r in manifest["report"]["episodes"]["rejected"]}
    assert sorted(rejected) == ["ep_0002", "ep_0003"]
    assert facts.exported.tolist() == [True, True, False, False] and facts.windows[2:].tolist() == [0, 0]
    assert facts.reason[2] == rejected["ep_0002"]
    assert facts.reason[2].startswith("overview: image file 'media/overview/ep_0002.png' cannot be read")
    assert facts.reason[3] == rejected["ep_0003"]
    assert facts.reason[3].startswith("actions: values too large for normalisation statistics")
    assert math.isnan(facts.duration_s[2])  # never loaded
    assert facts.duration_s[3] == made["ep3_times"][-1] - made["ep3_times"][0]  # refused after its extent
    assert np.isnan(facts.rate_hz[2:]).all() and not facts.steps[2:].any() and not facts.missing[2:].any()
    assert facts.warnings[2:] == [[], []]


def test_the_file_is_listed_and_its_format_checked(made: dict, tmp_path: Path) -> None:
    out, manifest = made["out"], made["manifest"]
    data = (out / "episode-facts.msgpack").read_bytes()
    assert manifest["files"]["episode_facts"] == {"path": "episode-facts.msgpack", "bytes": len(data),
                                                  "sha256": hashlib.sha256(data).hexdigest()}
    assert read_episode_facts(out, manifest).episode_id == made["facts"].episode_id  # a folder as a Path too
    doc = msgpack.unpackb(data)
    assert (doc["format"], doc["version"]) == ("robowds-episode-facts", 1)
    assert np.frombuffer(doc["gaps"], "<i8").tolist() == made["facts"].gaps.ravel().tolist()  # [E, F] row-major
    with pytest.raises(ValueError, match=r"^x/episodes\.msgpack is not a robowds-episode-facts version 1 file$"):
        decode_facts((out / "episodes.msgpack").read_bytes(), "x/episodes.msgpack")
    doc["windows"] = doc["windows"][:8]
    with pytest.raises(ValueError, match="^f: its columns have different lengths$"):
        decode_facts(msgpack.packb(doc), "f")


def _relisted(out: Path, data: bytes) -> None:
    """Write `data` as OUT's facts file and list its sha256 in the manifest (a consistent but wrong file)."""
    (out / "episode-facts.msgpack").write_bytes(data)
    manifest = json.loads((out / "manifest.json").read_bytes())
    manifest["files"]["episode_facts"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (out / "manifest.json").write_text(json.dumps(manifest))


def test_a_damaged_file_is_refused_by_the_reader_and_verify(made: dict, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    shutil.copytree(made["out"], out)
    data = bytearray((out / "episode-facts.msgpack").read_bytes())
    data[-1] ^= 0xFF
    (out / "episode-facts.msgpack").write_bytes(bytes(data))
    manifest = json.loads((out / "manifest.json").read_bytes())
    with pytest.raises(UserError) as caught:
        read_episode_facts(store_location(out), manifest)
    assert caught.value.message == (f"{out}/episode-facts.msgpack is damaged: its sha256 differs from the "
                                    "manifest's (files.episode_facts)")
    assert caught.value.hint.startswith("export again")
    result = verify_export(out, progress=False)
    assert result.failures == ["file episode-facts.msgpack: sha256 does not match the manifest"]
    assert main(["verify", str(out), "--quiet"]) != 0
    assert "episode-facts.msgpack: sha256 does not match the manifest" in capsys.readouterr().out
    (out / "episode-facts.msgpack").unlink()
    with pytest.raises(UserError, match="episode-facts.msgpack is missing: the manifest lists it"):
        read_episode_facts(store_location(out), manifest)
    # listed with its sha256 but not a facts file, or not the export's episodes: verify names it
    _relisted(out, (out / "episodes.msgpack").read_bytes())
    assert verify_export(out, progress=False).failures == [
        "file episode-facts.msgpack is not a robowds-episode-facts version 1 file"]
    with pytest.raises(UserError, match="episode-facts.msgpack is not a robowds-episode-facts version 1 file"):
        read_episode_facts(store_location(out), json.loads((out / "manifest.json").read_bytes()))
    outside = {**manifest, "files": {**manifest["files"], "episode_facts": {**manifest["files"]["episode_facts"],
                                                                            "path": "../episode-facts.msgpack"}}}
    with pytest.raises(UserError, match=r"manifest.json: files.episode_facts is not a file inside the export"):
        read_episode_facts(out, outside)
    doc = msgpack.unpackb((made["out"] / "episode-facts.msgpack").read_bytes())
    doc["exported"] = bytes([1, 0, 0, 0])  # ep_0001 marked rejected
    _relisted(out, msgpack.packb(doc, use_bin_type=True))
    assert verify_export(out, progress=False).failures == [
        "file episode-facts.msgpack: has no row of 1 exported episode(s) in their split, e.g. 'ep_0001'"]
    doc["exported"], doc["windows"] = bytes([1, 1, 0, 0]), np.asarray([12, 15, 0, 0], "<i8").tobytes()
    _relisted(out, msgpack.packb(doc, use_bin_type=True))
    assert verify_export(out, progress=False).failures == [
        "file episode-facts.msgpack: its episodes of split 'train' have 27 windows, the split holds 26 samples"]


def test_an_export_without_the_file_reads_as_none(made: dict, tmp_path: Path) -> None:
    """An export made before the facts file: no `files.episode_facts`; verify passes, the reader gives None."""
    out = tmp_path / "o"
    manifest = without_episode_facts(made["out"], out)
    assert read_episode_facts(store_location(out), manifest) is None
    assert verify_export(out, progress=False).ok


def test_camera_rate_and_warnings(tmp_path: Path) -> None:
    """A video field's rate is the camera's measured fps, with no gaps; a declared fps the frames do not
    have and a float32 loss are the episode's warnings."""
    from videos import gradient_frames, write_frames

    store = tmp_path / "s"
    store.mkdir()
    t = np.arange(20) / 10.0  # [20] s
    utm = np.column_stack([t, 5e6 + 0.2 * np.arange(20)])  # [20, 2]: float32 keeps 0.5 m of the northing
    write_frames(store / "media/ep0.mp4", gradient_frames(20, 32, 32), codec="mpeg4")  # 10 fps
    pq.write_table(pa.Table.from_pylist([{"episode_id": "ep0", "utm": utm.tolist(),
                                          "cam": {"path": "media/ep0.mp4", "fps": 12.0}}]), store / "t.parquet")
    out = tmp_path / "o"
    assert main(["export", str(store), str(out), *SETTINGS]) == 0
    manifest = json.loads((out / "manifest.json").read_bytes())
    facts = read_episode_facts(store_location(out), manifest)
    assert facts.fields == ["cam", "utm"]
    measured = manifest["report"]["video"]["cam"]["fps_mismatch"][0]["measured"]
    assert round(facts.rate_hz[0, 0], 4) == measured == 10.0 and facts.gaps[0].tolist() == [0, 0]
    assert facts.rate_hz[0, 1] == pytest.approx(10.0, rel=1e-12)
    assert facts.steps[0, 0] == facts.windows[0] * manifest["schema"]["cam"]["shape"][0]
    loss = manifest["report"]["float32_loss"]["utm"]
    assert facts.warnings[0] == [
        "cam: the video is declared at 12 fps but its frames come at 10 fps",
        f"utm: float32 changes its values by up to {loss['max_error']:.3g}, "
        f"{100 * loss['max_error'] / loss['spread']:.3g}% of the spread {loss['spread']:.3g} of value column 0 "
        "(float_dtype: float64 keeps them)"]
    assert verify_export(out, progress=False).ok
