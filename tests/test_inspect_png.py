"""`robowds inspect --png` (issue 13, item 9): padded steps are gaps, never values; lines carry the
manifest's names; wide streams come in groups; frames are large; `--out-dir` draws N random windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from robowds.export.cli.inspect_window import load_window
from robowds.export.report.window_figure import FRAME_INCHES, GROUP, figure
from robowds.export.report.window_samples import random_windows
from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.output.publish import load_finished_manifest


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic export whose IMU window has 0.5 s of history: windows near an episode start are
    partly padded (imu pads with zeros, which a plot must not show as data)."""
    root = tmp_path_factory.mktemp("inspect")
    write_synthetic_store(root / "store", episodes=2, seed=0)
    assert main(["export", str(root / "store"), str(root / "out"), "--quiet", "--workers", "1",
                 "--set", "streams.imu.rate_hz=100", "--set", "streams.imu.duration_s=0.5",
                 "--set", "streams.imu.offset_s=-0.5"]) == 0
    return root / "out"


def _axis(fig, label: str):
    (ax,) = [a for a in fig.axes if a.get_ylabel().startswith(label)]
    return ax


def test_padded_steps_are_gaps_and_real_steps_are_the_values(out: Path) -> None:
    manifest, sample = load_window(out, "train", "ep_0000_000002", None)
    mask, values = sample["imu_mask"], sample["imu"]  # [50], [50, 6]
    assert 0 < mask.sum() < mask.size  # the premise: a partly padded window
    fig = figure(manifest, sample)
    ax = _axis(fig, "imu")
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == manifest["schema"]["imu"]["names"]
    for d, line in enumerate(lines):
        y = np.asarray(line.get_ydata(), dtype=np.float64)
        assert np.isnan(y[~mask]).all()  # never the padding's zeros
        np.testing.assert_array_equal(y[mask], values[mask, d].astype(np.float64))
    np.testing.assert_allclose(lines[0].get_xdata(), -0.5 + np.arange(50) / 100)  # seconds from the anchor
    assert ax.get_ylabel() == f"imu\n{int(mask.sum())}/50 real"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == manifest["schema"]["imu"]["names"]


def test_wide_streams_are_drawn_in_labelled_groups(out: Path) -> None:
    manifest, sample = load_window(out, "train", None, 0)
    wide = np.concatenate([sample["joints"]] * 3, axis=1)  # [T, 21]: more lines than one axis can show
    manifest = {**manifest, "schema": {**manifest["schema"],
                                       "joints": {**manifest["schema"]["joints"], "names": None}}}
    fig = figure(manifest, {**sample, "joints": wide})
    axes = [a for a in fig.axes if a.get_ylabel().startswith("joints")]
    assert [a.get_ylabel().split("\n")[0] for a in axes] == ["joints [0:8]", "joints [8:16]", "joints [16:21]"]
    assert [len(a.get_lines()) for a in axes] == [GROUP, GROUP, 5]
    assert axes[2].get_lines()[0].get_label() == "joints[16]"


def test_png_size_and_out_dir(out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "one.png"
    assert main(["inspect", str(out), "--key", "ep_0000_000002", "--png", str(png)]) == 0
    manifest, sample = load_window(out, "train", "ep_0000_000002", None)
    width, height = figure(manifest, sample).get_size_inches() * 100
    assert Image.open(png).size == (round(width), round(height))
    assert main(["inspect", str(out), "--out-dir", str(tmp_path / "many"), "--count", "3", "--seed", "5"]) == 0
    drawn = sorted(p.name for p in (tmp_path / "many").iterdir())
    keys = []
    for index in random_windows(load_finished_manifest(out), "train", 3, 5):
        keys.append(load_window(out, "train", None, index)[1]["__key__"])
    assert drawn == sorted(f"{k}.png" for k in keys) and len(set(keys)) == 3
    assert all(Image.open(tmp_path / "many" / name).size[0] >= 1000 for name in drawn)


def test_camera_frames_are_large(tmp_path: Path) -> None:
    """Frames are drawn FRAME_INCHES wide (240 px at 100 dpi), at most 8 of a window, titled in seconds."""
    from videos import camera_store, gradient_frames, write_frames

    store = tmp_path / "store"
    (store / "media").mkdir(parents=True)
    write_frames(store / "media" / "cam.mp4", gradient_frames(40, 64, 48), rate=10, codec="mpeg4")
    camera_store(store, {"ep0": "media/cam.mp4"})
    assert main(["export", str(store), str(tmp_path / "out"), "--quiet", "--workers", "1",
                 "--set", "streams.cam.duration_s=2.0", "--set", "streams.cam.encoding=raw"]) == 0
    manifest, sample = load_window(tmp_path / "out", "train", None, 0)
    assert sample["cam"].shape[0] == 20
    fig = figure(manifest, sample)
    frames = [a for a in fig.axes if a.get_images()]
    assert len(frames) == 8
    assert [a.get_title() for a in frames][:2] == ["cam +0.00 s", "+0.30 s"]
    width_px = frames[0].get_position().width * fig.get_size_inches()[0] * 100
    assert width_px >= 0.6 * FRAME_INCHES * 100
