"""LeRobot's item semantics in one step (issue 22 item 5), on the real G1 episode 2 (LeRobot v2.1, 30 fps):
`convert lerobot` writes a ready `STORE/export.yaml`, and an export with it gives, for every window, what
LeRobot's `delta_timestamps` rule gives: frame indices `clamp(i + d, 0, len - 1)`, `<key>_is_pad` where
`i + d` is outside the episode. The deltas are written rounded (-0.0667 for -2/30), as users write them:
the export takes them as whole frames. The expected values are computed here from the raw Parquet rows
and the mp4 decoded with PyAV, not with robowds."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.main import main
from robowds.export.job.config import load_config
from robowds.export.store.fingerprint import fingerprint
from robowds.export.store.validate import validate_store

from exports import export_members, npy
from realdata import g1, g1_parquet, g1_video
from videos import to_rgb

EPISODE = "episode_000002"  # 343 frames; the other vendored episode is left out to keep the test fast
STATE = np.arange(-2, 1)  # delta_timestamps [-2/30, -1/30, 0] in frames
ACTION = np.arange(0, 16)  # [0, 1/30, ..., 15/30]
CAMERA = np.arange(-1, 1)  # [-1/30, 0]
CAMERA_WINDOWS = 40  # windows whose frames are compared (all windows' masks are): decoding is the test's cost
CROP = (64, 48)  # a centred crop of the 640x480 frames, stored raw: exact pixels, small shards


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The G1 dataset with episode 2 only (episode 1's files left out: meta lists it, the converter
    skips it), converted."""
    root = tmp_path_factory.mktemp("lerobot")
    src = root / "src"
    shutil.copytree(g1(), src, ignore=shutil.ignore_patterns("episode_000001.*"))
    assert main(["convert", "lerobot", str(src), str(root / "store"), "--quiet", "--workers", "1"]) == 0
    return root / "store"


def _lerobot_window(values: np.ndarray, i: int, deltas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LeRobot's rule for the item at frame i: rows at the clamped indices [n, ...], and is_pad [n]."""
    wanted = i + deltas
    return values[np.clip(wanted, 0, len(values) - 1)], (wanted < 0) | (wanted >= len(values))


def _frames(path: Path, count: int) -> np.ndarray:
    """The first `count` frames of the mp4 decoded with PyAV ([count, H, W, 3] rgb24): frame k is the
    k-th decoded frame."""
    with av.open(str(path)) as container:
        decoded = []
        for frame in container.decode(video=0):
            decoded.append(frame)
            if len(decoded) == count:
                break
        return to_rgb(decoded)


def test_convert_writes_a_ready_export_config(store: Path, tmp_path: Path) -> None:
    config = load_config(store / "export.yaml")
    assert config["fps"] == 30.0 and config["window"] == {"duration_s": 1 / 30, "offset_s": 0.0, "rate_hz": None,
                                                          "pad": "edge"}
    assert config["streams"] == {name: {"pad": "edge"} for name in
                                 ("action", "observation_images_cam_high", "observation_state")}
    text = (store / "export.yaml").read_text()
    assert ("  observation_state:\n    pad: edge\n    # a state history: delta_timestamps [-2/30, -1/30, 0] (3 frames)\n"
            "    # offset_s: -0.066667\n    # duration_s: 0.1\n") in text
    assert "    # an action chunk: delta_timestamps [0, 1/30, ..., 15/30] (16 frames)\n    # duration_s: 0.533333\n" in text
    assert "    # a camera history: delta_timestamps [-1/30, 0] (2 frames)\n    # offset_s: -0.033333\n" in text
    documented = re.search(r"checks the written file is this block -->\n```yaml\n(.*?)```",
                           (Path(__file__).parents[1] / "docs" / "convert.md").read_text(), re.S)
    assert documented and text[text.index("\nfps: ") + 1:] == documented.group(1)  # docs/convert.md shows it
    report = validate_store(store)
    assert report.exportable and not report.problems, report.render()
    # a config, not store content: editing it leaves the fingerprint (and earlier exports' verify) alone
    before = fingerprint(store)
    (store / "export.yaml").write_text(text + "# edited\n")
    assert fingerprint(store) == before
    (store / "export.yaml").write_text(text)


def test_windows_equal_lerobot_delta_timestamps(store: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # the written config with its examples uncommented, the deltas rounded to 4 decimals as users write them
    config = tmp_path / "export.yaml"
    config.write_text(re.sub(r"# (offset_s|duration_s): ", r"\1: ", (store / "export.yaml").read_text()))
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--config", str(config), "--workers", "1", "--keep-order", "--quiet",
                 "--set", "streams.observation_state.offset_s=-0.0667", "--set", "streams.action.duration_s=0.5333",
                 "--set", "streams.observation_images_cam_high.offset_s=-0.0333",
                 "--set", "streams.observation_images_cam_high.duration_s=0.0667",
                 "--set", "streams.observation_images_cam_high.encoding=raw",
                 "--set", f"streams.observation_images_cam_high.crop=[{CROP[0]}, {CROP[1]}]"]) == 0
    printed = capsys.readouterr().out
    assert ("note: streams.observation_state.offset_s -0.0667 s taken as -2 x 1/30 s = -0.06666666666666667 s "
            "(within 0.0001 s of a whole step)") in printed
    assert "note: streams.action.duration_s 0.5333 s taken as 16 x 1/30 s = 0.5333333333333333 s" in printed
    resolved = json.loads((out / "manifest.json").read_text())["config"]
    assert (resolved["streams"]["observation_state"]["offset_s"], resolved["streams"]["action"]["steps"],
            resolved["videos"]["observation_images_cam_high"]["offset_s"]) == (-2 / 30, 16, -1 / 30)

    samples = export_members(out)
    table = pq.read_table(g1_parquet(EPISODE))
    state = np.stack(table.column("observation.state").to_numpy(zero_copy_only=False))  # [T, 26] float32
    action = np.stack(table.column("action").to_numpy(zero_copy_only=False))  # [T, 26] float32
    assert len(samples) == len(state) == 343  # one window per frame, as LeRobot has one item per frame
    frames = _frames(g1_video(EPISODE), CAMERA_WINDOWS)  # [40, 480, 640, 3]
    x0, y0 = (640 - CROP[0]) // 2, (480 - CROP[1]) // 2
    for i in range(len(state)):
        sample = samples[f"{EPISODE}_{i:06d}"]
        for field, values, deltas in (("observation_state", state, STATE), ("action", action, ACTION)):
            expected, is_pad = _lerobot_window(values, i, deltas)
            got = npy(sample[f"{field}.npy"])  # [n, 26]
            assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), expected.view(np.uint32)), (field, i)
            np.testing.assert_array_equal(npy(sample[f"{field}_mask.npy"]), ~is_pad, err_msg=f"{field} {i}")
        _, is_pad = _lerobot_window(np.arange(len(state)), i, CAMERA)
        np.testing.assert_array_equal(npy(sample["observation_images_cam_high_mask.npy"]), ~is_pad)
        if i < CAMERA_WINDOWS:
            expected, _ = _lerobot_window(frames, i, CAMERA)
            np.testing.assert_array_equal(npy(sample["observation_images_cam_high.npy"]),
                                          expected[:, y0:y0 + CROP[1], x0:x0 + CROP[0]], err_msg=f"camera {i}")
