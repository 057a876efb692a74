"""The report's pictures (issue 27): sampled windows drawn as `inspect --png` draws them, source samples
over the exported lines (`--store`), and the cameras' rows with a filmstrip.

One tiny export serves all tests: 2 synthetic episodes (~10 s each) with a 32x32 camera, every 20th
frame an anchor, the joints' window starting 0.5 s before the anchor (so windows near an episode's start
are partly padded), split train (ep_0001) / val (ep_0000). The alignment tests check numerically that
the overlay's dots and lines are the store's samples and the exported steps on one time axis.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.errors import UserError
from robowds.export.output.publish import load_finished_manifest
from robowds.export.report.filmstrip import FILM_DPI, THUMB_INCHES, TITLE_INCHES
from robowds.export.report.overlay import anchor_time, load_episodes, stream_overlays
from robowds.export.report.pictures import camera_rows, overlay_figures, window_figures
from robowds.export.report.window_samples import pick_windows, read_windows, sampled_windows
from robowds.export.store.location import StoreLocation, store_location

from videos import camera_store, gradient_frames, write_frames

F32 = float(np.finfo(np.float32).eps)


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> tuple[StoreLocation, StoreLocation, dict]:
    """(out, store, manifest) of the tiny export with a camera."""
    root = tmp_path_factory.mktemp("pictures")
    store = root / "store"
    ids = write_synthetic_store(store, episodes=2, seed=0).episode_ids
    for ep in ids:  # 8.5 s of video: an episode's last windows have padded frames
        write_frames(store / "media" / "cam" / f"{ep}.mp4", gradient_frames(85, 32, 32), rate=10, codec="mpeg4")
    camera_store(store, {ep: f"media/cam/{ep}.mp4" for ep in ids})
    assert main(["export", str(store), str(root / "out"), "--quiet", "--workers", "1", "--set", "stride=20",
                 "--set", "include=[joints,gripper_cmd,task,cam]", "--set", "streams.joints.offset_s=-0.5",
                 "--set", "streams.cam.resize=[32,16]", "--set", "splits.val=[ep_0000]",
                 "--set", "shard.max_samples=2"]) == 0
    out = store_location(root / "out")
    return out, store_location(store), load_finished_manifest(out)


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) of a PNG, decoded whole (a truncated file fails here)."""
    with Image.open(io.BytesIO(png)) as image:
        image.load()
        return image.size


def test_window_figures_draw_every_window_of_a_small_split_in_index_order(export) -> None:
    """A split of one shard (the one holding ep_0000's first window; drawing is ~0.3 s a window, so the
    test keeps the split small): asking for 50 windows draws each of its windows once, in index order."""
    out, _, manifest = export
    val = manifest["splits"]["val"]
    every = read_windows(out, manifest, "val", range(val["samples"]))
    firsts = np.cumsum([0, *(s["samples"] for s in val["shards"])])  # [shards + 1]
    where = [s["__key__"] for s in every].index("ep_0000_000000")
    shard = int(np.searchsorted(firsts, where, side="right")) - 1
    small = {**manifest, "splits": {"val": {**val, "shards": [val["shards"][shard]]}}}
    held = every[firsts[shard]:firsts[shard + 1]]
    figures = window_figures(out, small, "val", 50, seed=3)
    assert [f.title for f in figures] == [f"{s['__key__']} (val)" for s in held]
    for fig in figures:
        width, height = png_size(fig.png)  # inspect's figure (8 frames of 2.4 in, 2 plots) at 72 dpi
        assert (width, height) == (round(72 * 8 * 2.4), round(72 * (2.4 + 2 * 2.2 + 0.8)))
        assert len(fig.png) < 150_000
    (first,) = [f for f in figures if f.title.startswith("ep_0000_000000 ")]
    sample = every[where]  # anchor 0: the joints' first 0.5 s lie before the episode
    assert int(sample["joints_mask"].sum()) == 5
    assert first.alt == (
        f"Window ep_0000_000000 of split val, task: {sample['task']!r}. Camera cam: 10 steps, all real, 8 frames "
        "drawn. Time series over seconds from the anchor (padded steps are gaps, shaded grey): gripper_cmd 1 dim "
        "(closed), 10 steps, all real; joints 7 dims (j0, j1, j2, j3, j4, j5, j6), 10 steps: 5 real, 5 padded.")


def test_the_same_seed_draws_the_same_windows_for_both_sections(export) -> None:
    out, store, manifest = export
    keys = [s["__key__"] for s in sampled_windows(out, manifest, "train", 3, seed=1)]
    assert keys == [s["__key__"] for s in sampled_windows(out, manifest, "train", 3, seed=1)]
    assert keys != [s["__key__"] for s in sampled_windows(out, manifest, "train", 3, seed=2)]
    total = manifest["splits"]["train"]["samples"]
    order = read_windows(out, manifest, "train", range(total))
    assert keys == [s["__key__"] for s in order if s["__key__"] in keys]  # sample-index order
    # the page pairs each window with its overlay: both sections draw sampled_windows' windows
    picked = [s["__key__"] for s in sampled_windows(out, manifest, "train", 2, seed=1)]
    over = overlay_figures(out, manifest, store, "train", 2, seed=1)
    assert [f.title for f in over] == [f"{k} (train): exported vs source" for k in picked]
    (drawn,) = window_figures(out, manifest, "train", 1, seed=1)  # ~1 s a window figure: one is enough
    assert drawn.title == f"{sampled_windows(out, manifest, 'train', 1, seed=1)[0]['__key__']} (train)"
    for fig in over:
        width, height = png_size(fig.png)
        assert (width, height) == (720, round(72 * (2 * 2.2 + 0.8)))
    assert "joints 7 dims (j0, j1, j2, j3, j4, j5, j6), linear" in over[0].alt
    assert pick_windows(manifest, "train", 0, seed=1) == [] and window_figures(out, manifest, "train", 0, 1) == []


def assert_aligned(manifest: dict, samples: list[dict], episodes: dict) -> int:
    """Every valid exported step of each window equals the source dots interpolated at its time: linear
    fields by linear interpolation, held ones the last dot at or before it. Returns the steps checked."""
    checked = 0
    for sample in samples:
        overlays = {o.name: o for o in stream_overlays(manifest, sample, episodes[sample["meta"]["episode_id"]])}
        assert set(overlays) == {n for n, s in manifest["schema"].items() if s["kind"] == "timeseries"}
        for o in overlays.values():
            # the dots: the samples in the window's range and at most one either side
            assert (o.source_times < o.step_times[0]).sum() <= 1 and (o.source_times > o.step_times[-1]).sum() <= 1
            steps = o.step_times[o.mask]  # [v]
            if not len(steps):
                continue
            assert o.source_times[0] <= steps[0] and steps[-1] <= o.source_times[-1]  # they bracket the line
            for d in range(o.values.shape[1]):
                got = o.values[o.mask, d]  # [v]
                if o.interpolation == "linear":
                    want = np.interp(steps, o.source_times, o.source_values[:, d])
                else:  # hold: the last sample at or before the step (1e-9 s: the anchor's rounding in meta `t`)
                    want = o.source_values[np.searchsorted(o.source_times, steps + 1e-9, side="right") - 1, d]
                np.testing.assert_allclose(got, want, rtol=F32, atol=F32 * np.abs(want).max())
                checked += got.size
    return checked


def test_overlay_dots_are_the_samples_the_exported_steps_interpolate(export) -> None:
    """Over every window of the export: the alignment the overlay draws is exact to float32 rounding."""
    out, store, manifest = export
    samples = [s for split in ("train", "val")
               for s in read_windows(out, manifest, split, range(manifest["splits"][split]["samples"]))]
    episodes = load_episodes(store, manifest, ["ep_0000", "ep_0001"])
    assert assert_aligned(manifest, samples, episodes) > 500
    # the check has teeth: the same windows a tenth of a second off do not interpolate the dots
    shifted = [{**s, "meta": {**s["meta"], "t": s["meta"]["t"] + 0.1}} for s in samples]
    with pytest.raises(AssertionError):
        assert_aligned(manifest, shifted, episodes)


def test_overlay_of_an_ns_store_uses_the_anchor_in_the_stores_own_clock(tmp_path: Path) -> None:
    """A `time_unit: ns` store whose clock stream (not exported, but loaded by the export) starts 5 ms
    before the joints: the export's stream time 0 is the clock's first sample, the overlay loads only the
    joints (time 0 = their first sample), so meta `t` would be 5 ms off; `t_ns` is exact."""
    t0 = 1_700_000_000_123_456_789
    times = t0 + np.arange(60, dtype=np.int64) * 20_000_000  # 50 Hz, 1.18 s
    joints = np.column_stack([times, (np.arange(60, dtype=np.int64) - 30) ** 2])  # [T, 2]: a parabola
    clock = np.column_stack([t0 - 5_000_000 + np.arange(130, dtype=np.int64) * 10_000_000, np.zeros(130, np.int64)])
    store = tmp_path / "store"
    store.mkdir()
    pq.write_table(pa.Table.from_pylist([{"episode_id": "ep0", "joints": joints.tolist(), "tick": clock.tolist()}]),
                   store / "t.parquet")
    (store / "store.yaml").write_text(yaml.safe_dump({"version": 1, "clock": "tick", "fields": {
        "joints": {"time_unit": "ns", "interpolation": "linear"}, "tick": {"time_unit": "ns"}}}))
    assert main(["export", str(store), str(tmp_path / "out"), "--quiet", "--workers", "1",
                 "--set", "include=[joints]", "--set", "streams.joints.rate_hz=50"]) == 0
    out = store_location(tmp_path / "out")
    manifest = load_finished_manifest(out)
    samples = read_windows(out, manifest, "train", range(manifest["splits"]["train"]["samples"]))
    episodes = load_episodes(store_location(store), manifest, ["ep0"])
    assert episodes["ep0"].time_origin_ns == t0  # only the joints loaded: not the export's origin
    meta = samples[0]["meta"]
    assert meta["t_ns"] == t0 - 5_000_000 + round(meta["t"] * 1e9)  # the export's origin: the clock's first
    assert anchor_time(meta, episodes["ep0"]) == pytest.approx(meta["t"] - 0.005, abs=1e-12)
    assert assert_aligned(manifest, samples, episodes) > 100


def test_camera_rows_are_the_manifests_values_with_a_filmstrip(export) -> None:
    out, _, manifest = export
    (row,) = camera_rows(out, manifest, "val", seed=0)
    video = manifest["report"]["video"]["cam"]
    assert (row.name, row.encoding, row.resolution, row.rate_hz) == ("cam", "jpg", "32 x 16", 10.0)
    assert (row.psnr_db_min, row.psnr_frames) == (video["psnr_db_min"], video["psnr_frames"])
    assert row.psnr_db_min > 20 and row.psnr_frames > 0
    (index,) = pick_windows(manifest, "val", 1, seed=0)
    (sample,) = read_windows(out, manifest, "val", [index])
    width, height = png_size(row.filmstrip.png)
    assert (width, height) == (round(FILM_DPI * 8 * THUMB_INCHES), round(FILM_DPI * (THUMB_INCHES / 2 + TITLE_INCHES)))
    assert row.filmstrip.title == f"cam: {sample['__key__']} (val)"
    assert row.filmstrip.alt.startswith(f"Camera cam: 8 of the 10 frames of window {sample['__key__']} (split val), "
                                        "32 x 16 px, from +0.00 s to +0.90 s after the anchor")


def test_a_filmstrip_crosses_out_padded_frames_and_says_so(export) -> None:
    """The window at anchor 80 of ep_0000 reaches past the 8.5 s of video: its last frames are padded."""
    out, _, manifest = export
    from robowds.export.report.filmstrip import filmstrip

    total = manifest["splits"]["val"]["samples"]
    (sample,) = [s for s in read_windows(out, manifest, "val", range(total)) if s["__key__"] == "ep_0000_000080"]
    mask = sample["cam_mask"]
    assert mask[:5].all() and not mask[5:].any()
    strip = filmstrip(manifest, "val", sample, "cam")
    assert strip.alt.endswith("; padded (crossed out): +0.50 s, +0.60 s, +0.80 s, +0.90 s.")
    # a crossed-out thumbnail holds the red of its cross; a real one (blue <= 10 x 95) does not
    pixels = np.asarray(Image.open(io.BytesIO(strip.png)).convert("RGB")).astype(int)  # [H, W, 3]
    columns = np.array_split(np.arange(pixels.shape[1]), 8)
    red = [bool(((pixels[:, c, 0] > 200) & (pixels[:, c, 1] < 60) & (pixels[:, c, 2] < 60)).any()) for c in columns]
    assert red == [False, False, False, False, True, True, True, True]


def test_a_split_without_windows_has_no_pictures(export) -> None:
    out, store, manifest = export
    empty = {**manifest, "splits": {**manifest["splits"], "test": {**manifest["splits"]["val"], "shards": []}}}
    assert window_figures(out, empty, "test", 4, 0) == [] and overlay_figures(out, empty, store, "test", 4, 0) == []
    (row,) = camera_rows(out, empty, "test", 0)
    assert row.filmstrip is None and row.resolution == "32 x 16"



def test_a_cut_shard_is_refused_as_inspect_refuses_it(export, tmp_path: Path) -> None:
    """The pictures read only their windows' bytes, yet a shard shorter than the manifest says is named
    with the sample it cuts, before anything is drawn."""
    out, _, manifest = export
    copy = tmp_path / "out"
    shutil.copytree(out.path, copy)
    shard = manifest["splits"]["train"]["shards"][0]
    data = (copy / shard["path"]).read_bytes()
    (copy / shard["path"]).write_bytes(data[:len(data) - 2048])  # the end-of-archive blocks and a bit more
    with pytest.raises(UserError) as caught:
        window_figures(store_location(copy), manifest, "train", 50, seed=0)
    assert caught.value.message.startswith(f"shard {shard['path']} is cut short ({len(data) - 2048} of {len(data)} "
                                        "bytes): sample ")
    assert caught.value.hint == f"`robowds verify {copy}` checks every shard; export again to repair it"


def test_a_window_with_more_plots_than_the_bound_draws_whole_fields_and_names_the_rest() -> None:
    """A window of 14 one-dimensional streams: the report's picture draws the first MAX_PLOTS (12) whole
    fields, its height is that of 12 plots, and its caption and alt text name the two left out."""
    from PIL import Image

    from robowds.export.report.pictures import WINDOW_DPI, window_figure
    from robowds.export.report.window_figure import MAX_PLOTS

    names = [f"s{i:02d}" for i in range(MAX_PLOTS + 2)]
    manifest = {"schema": {n: {"kind": "timeseries", "rate_hz": 10.0, "offset_s": 0.0, "names": [n]} for n in names}}
    sample = {"__key__": "ep_0000_000003", **{n: np.full((10, 1), i, np.float32) for i, n in enumerate(names)},
              **{f"{n}_mask": np.ones(10, bool) for n in names}}
    picture = window_figure(manifest, "train", sample)
    assert picture.title == ("ep_0000_000003 (train); not drawn here: s12, s13 (`robowds inspect OUT --key KEY "
                             "--png FILE` draws every field)")
    assert picture.alt.endswith(" Not drawn here: s12, s13.") and "s11 " in picture.alt and "s12 " not in picture.alt
    height = Image.open(io.BytesIO(picture.png)).size[1]
    assert height == round((2.2 * MAX_PLOTS + 0.8) * WINDOW_DPI)
