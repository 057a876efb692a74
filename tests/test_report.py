"""`robowds report OUT`: the page's content on a real export (synthetic, the vendored Husky bag and the
G1 LeRobot set with its camera), loaded in headless Chromium (tests/browser.py: no console error, no
failed or outside load, every picture decodes, a non-blank top, sorting and filtering by a real click),
the model's per-episode facts path, the pictures' rendering, and the command's locations and errors."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from typing import Any, Iterator
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.job.episode_facts import EpisodeFacts, read_episode_facts
from robowds.export.report.html import num
from robowds.export.report.model import FIRST_ROWS, build_model
from robowds.export.report.page import SECTIONS, render
from robowds.export.report.parts import CameraRow, Figure
from robowds.export.report.pictures import window_figures
from robowds.export.store.location import store_location

from browser import Browser
from old_exports import without_episode_facts
from realdata import real_path

SETTINGS = ["--quiet", "--workers", "1", "--stride", "8", "--set", "shard.min_shards=1",
            "--set", "on_bad_episode=skip", "--set", "splits.val=[ep_0002]"]
BROKEN = "ep_0001"  # its image file is removed: rejected


class Page(HTMLParser):
    """The parts of a page the tests look at: headings in order, every tag's attributes, tables as
    (caption, rows of cell texts), and the text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.headings: list[tuple[str, str]] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.tables: list[tuple[str, list[list[str]]]] = []
        self.text: list[str] = []
        self._heading: str | None = None
        self._cell: list[str] | None = None
        self._caption: list[str] | None = None
        self._in_svg = 0
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag in ("h1", "h2", "h3", "h4"):
            self._heading = tag
            self.headings.append((tag, ""))
        elif tag == "table":
            self.tables.append(("", []))
        elif tag == "caption":
            self._caption = []
        elif tag == "tr" and self.tables:
            self.tables[-1][1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "svg":
            self._in_svg += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("h1", "h2", "h3", "h4"):
            self._heading = None
        elif tag == "caption" and self._caption is not None:
            self.tables[-1] = ("".join(self._caption), self.tables[-1][1])
            self._caption = None
        elif tag in ("td", "th") and self._cell is not None:
            self.tables[-1][1][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "svg":
            self._in_svg -= 1

    def handle_data(self, data: str) -> None:
        if self._in_svg:
            return
        self.text.append(data)
        if self._heading:
            tag, text = self.headings[-1]
            self.headings[-1] = (tag, text + data)
        if self._caption is not None:
            self._caption.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def table(self, caption: str) -> list[list[str]]:
        [rows] = [rows for cap, rows in self.tables if cap == caption]
        return rows


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, err
    return rc, out, err


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(store, out): 3 synthetic episodes, one rejected (its image is gone), two splits."""
    root = tmp_path_factory.mktemp("report")
    write_synthetic_store(root / "store", episodes=3, seed=0)
    (root / "store" / "media" / "overview" / f"{BROKEN}.png").unlink()
    assert main(["export", str(root / "store"), str(root / "out"), *SETTINGS]) == 0
    return root / "store", root / "out"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with Browser(timeout=30) as started:
        yield started


@contextlib.contextmanager
def in_browser(browser: Browser, page: Path, pictures: int, screenshot: Path | None = None) -> Iterator[tuple[Any, Any]]:
    """Load the page from a file:// URL: no problem at all, `pictures` images all decoded, the top of
    the page drawn; yields the open page (for more checks) and its check."""
    with browser.open(page) as opened:
        check = opened.check(screenshot=screenshot)
        assert check.problems() == [], check.problems()
        assert len(check.images) == pictures and all(i.decoded and i.natural_width > 100 for i in check.images)
        assert not check.blank and check.title.startswith("robowds report: ")
        yield opened, check


def manifest_of(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def assert_self_contained(text: str, page: Page) -> None:
    """No resource the browser would fetch: only data: images and in-page links; valid HTML5 head."""
    assert text.startswith("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">")
    assert "http://" not in text and "https://" not in text and "url(" not in text and "@import" not in text
    for tag, attrs in page.tags:
        assert "src" not in attrs or attrs["src"].startswith("data:image/png;base64,"), (tag, attrs)
        assert "href" not in attrs or attrs["href"].startswith("#"), (tag, attrs)
        assert tag not in ("link", "iframe", "object", "embed") and not (tag == "script" and "src" in attrs)
        if tag == "img":
            assert attrs.get("alt"), attrs
    ids = [attrs["id"] for _, attrs in page.tags if "id" in attrs]
    assert len(ids) == len(set(ids)), "duplicate ids"
    levels = [int(tag[1]) for tag, _ in page.headings]
    assert levels[0] == 1 and all(b - a <= 1 for a, b in zip(levels, levels[1:]))  # no skipped level


def test_page_of_a_synthetic_export(export: tuple[Path, Path], browser: Browser,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    _, out = export
    rc, stdout, _ = run(["report", str(out), "--windows", "2"], capsys)
    text = (out / "report.html").read_text(encoding="utf-8")
    assert rc == 0 and stdout == f"wrote {out / 'report.html'} ({len(text.encode()):,} bytes)\n"
    page = Page(text)
    assert_self_contained(text, page)
    manifest = manifest_of(out)
    assert [h for h in page.headings if h[0] == "h2"] == [("h2", name) for _, name in SECTIONS]
    fields = [name for name, s in manifest["schema"].items() if s["kind"] != "meta"]
    assert [h for t, h in page.headings if t == "h3"] == fields
    summary = {row[0]: row[1] for row in page.tables[0][1]}  # the first table: labels and values
    assert summary["episodes"] == "3 considered, 2 exported, 1 rejected"
    windows = manifest["report"]["windows"]
    assert summary["windows"] == f"{windows['emitted']:,} emitted of {windows['candidates']:,} candidates"
    assert summary["store fingerprint"] == manifest["source"]["fingerprint"]
    assert summary["tool version"] == manifest["tool_version"]
    assert page.table("splits") == [["split", "episodes", "windows", "shards", "bytes"],
                                    *[[name, "1", num(s["samples"]), num(len(s["shards"])), _size(s["bytes"])]
                                      for name, s in manifest["splits"].items()]]
    [rejected] = manifest["report"]["episodes"]["rejected"]
    assert page.table("rejected episodes")[1] == [BROKEN, "overview", rejected["message"], rejected["hint"]]
    assert "cannot be read" in rejected["message"]
    assert '&quot;on_bad_episode&quot;: &quot;skip&quot;' in text  # the config, in its <details>
    for key, stats in manifest["stats"]["train"].items():  # the first split's statistics, value for value
        names = manifest["schema"][key]["names"]
        rows = page.table(f"statistics of {key} over valid steps")
        assert rows[0] == ["dimension", "count", "mean", "std", "min", "max", "q01", "q99", "histogram"]
        assert rows[1:] == [[names[d], f"{stats['count']:,}", *(f"{stats[c][d]:.6g}" for c in
                             ("mean", "std", "min", "max", "q01", "q99")), ""] for d in range(len(names))]
    dims = sum(len(s["mean"]) for s in manifest["stats"]["train"].values())
    assert text.count('<svg class="h" role="img" aria-label="histogram of ') == dims
    episodes = page.table("episodes, in id order (the column headers sort when scripts run)")
    assert [r[:4] for r in episodes[1:]] == [["ep_0000", "train", "exported", num(_windows(out, "ep_0000"))],
                                             [BROKEN, "train", "rejected", "0"],
                                             ["ep_0002", "val", "exported", num(_windows(out, "ep_0002"))]]
    assert episodes[2][5] == f"overview: {rejected['message']}"
    facts = read_episode_facts(out, manifest)
    assert facts.episode_id == ["ep_0000", BROKEN, "ep_0002"] and np.isnan(facts.duration_s[1])  # never loaded
    assert [r[4] for r in episodes[1:]] == [num(float(d), 4) for d in facts.duration_s]
    assert "Not recorded by this export" not in text
    assert "Run robowds report OUT --store STORE to draw" in "".join(page.text)
    assert [a["title"] for t, a in page.tags if t == "img"] == [f.title for f in window_figures(
        store_location(out), manifest, "train", 2, 0)]

    with in_browser(browser, out / "report.html", pictures=2) as (opened, check):
        assert len(check.svgs) == dims  # the histograms, drawn
        rows = "[...document.querySelectorAll('#episode-table tbody tr')].filter(r => !r.hidden).map(r => r.cells[0].textContent)"
        assert opened.evaluate(rows) == ["ep_0000", BROKEN, "ep_0002"]
        opened.click("#episode-table thead th:nth-child(4) button")  # windows, ascending
        by_windows = sorted([("ep_0000", _windows(out, "ep_0000")), (BROKEN, 0), ("ep_0002", _windows(out, "ep_0002"))],
                            key=lambda kv: kv[1])
        assert opened.evaluate(rows) == [k for k, _ in by_windows]
        opened.evaluate("(() => { const f = document.getElementById('ep-filter'); f.value = 'image';"
                        " f.dispatchEvent(new Event('input')); return 0; })()")
        assert opened.evaluate(rows) == [BROKEN]  # the reason names the overview image
        assert opened.evaluate("document.getElementById('ep-count').textContent") == "1 of 3 rows shown"


def test_a_page_of_an_export_made_before_the_facts_file(export: tuple[Path, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """An export without episode-facts.msgpack (robowds before it): the page says which columns it lacks."""
    _, out = export
    old = tmp_path / "old"
    without_episode_facts(out, old)
    assert run(["report", str(old), "--windows", "0"], capsys)[0] == 0
    text = (old / "report.html").read_text()
    assert "Not recorded by this export" in text and "episode duration, warnings, source rate, gaps" in text
    episodes = Page(text).table("episodes, in id order (the column headers sort when scripts run)")
    assert [r[:4] for r in episodes[1:]] == [["ep_0000", "train", "exported", num(_windows(out, "ep_0000"))],
                                             [BROKEN, "train", "rejected", "0"],
                                             ["ep_0002", "val", "exported", num(_windows(out, "ep_0002"))]]


def _size(n: int) -> str:
    from robowds.export.report.html import size

    return size(n)


def _windows(out: Path, episode: str) -> int:
    from robowds.export.job.side_files import decode_episodes

    return decode_episodes((out / "episodes.msgpack").read_bytes())[episode].windows


def _facts(n: int, flagged: dict[int, str]) -> EpisodeFacts:
    """n episodes over 2 fields; `flagged`: index -> "rejected" or "warned"."""
    ids = [f"ep_{i:05d}" for i in range(n)]
    exported = np.array([flagged.get(i) != "rejected" for i in range(n)])
    rate = np.tile([[10.0, 30.0]], (n, 1))  # [E, F]
    rate[:, 0] += np.arange(n) % 3  # 10, 11, 12
    missing = np.zeros((n, 2), bool)
    missing[2, 1] = True
    rate[2, 1] = np.nan
    rate[~exported] = np.nan
    gaps = np.zeros((n, 2), np.int64)
    gaps[1, 0] = 4
    gaps[3, 0] = 1
    return EpisodeFacts(ids, ["train"] * n, exported, np.where(exported, 30, 0).astype(np.int64),
                        np.where(exported, np.arange(n) + 2.0, np.nan),
                        ["joints: bad <row>" if flagged.get(i) == "rejected" else None for i in range(n)],
                        [["clock repaired & <kept>"] if flagged.get(i) == "warned" else [] for i in range(n)],
                        ["joints", "imu"], rate, gaps, missing, np.zeros((n, 2), np.int64), np.full((n, 2), 300))


def test_facts_give_rates_gaps_missing_and_a_bounded_table(export: tuple[Path, Path]) -> None:
    _, out = export
    manifest = manifest_of(out)
    n = 2500
    facts = _facts(n, {1500: "rejected", 2400: "warned", 5: "warned"})
    model = build_model(manifest, "train", out="OUT", stats_state=None, episodes=None, facts=facts)
    joints = next(f for f in model.fields if f.name == "joints")
    imu = next(f for f in model.fields if f.name == "imu")
    assert (joints.source_rate.min, joints.source_rate.median, joints.source_rate.max) == (10.0, 11.0, 12.0)
    assert joints.source_rate.episodes == n - 1 and (joints.gaps, joints.episodes_with_gaps) == (5, 2)
    assert (imu.missing, imu.missing_ids, imu.source_rate.episodes) == (1, ["ep_00002"], n - 2)
    t = model.episodes
    assert len(t.rows) == FIRST_ROWS + 2 and t.omitted == n - FIRST_ROWS - 2
    assert [r.episode_id for r in t.rows[-2:]] == ["ep_01500", "ep_02400"]
    assert (t.total, t.exported, t.rejected, t.warned, t.unrecorded) == (n, n - 1, 1, 2, [])
    assert t.omitted_windows == 30 * (n - FIRST_ROWS - 2)
    assert t.durations["min"] == 2.0 and t.durations["max"] == n + 1.0
    assert [h.histogram for h in joints.stats[0].dims] == [None] * 7  # no statistics state: no histograms
    text = render(model, [], None, [])
    page = Page(text)
    assert_self_contained(text, page)
    assert "The table lists 1,002 of the 2,500 episodes" in text
    assert "10 / 11 / 12 Hz over 2,499 episodes" in text
    assert "5 intervals longer than the max gap, in 2 episodes" in text
    rows = page.table("episodes, in id order (the column headers sort when scripts run)")
    assert rows[-2] == ["ep_01500", "train", "rejected", "0", "\u2013", "joints: bad <row>"]
    assert rows[-1] == ["ep_02400", "train", "exported", "30", "2402", "clock repaired & <kept>"]
    assert "joints: bad &lt;row&gt;" in text and "clock repaired &amp; &lt;kept&gt;" in text  # escaped
    assert '<tr data-status="exported warned">' in text and '<tr data-status="rejected">' in text


def _png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), 200, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_figures_and_cameras_are_inline_pngs_with_alt(export: tuple[Path, Path]) -> None:
    import base64

    _, out = export
    manifest = manifest_of(out)
    model = build_model(manifest, "train", out="OUT", stats_state=None, episodes=None, facts=None)
    png = _png(4, 3)
    window = Figure("ep_0000_000008 (train)", "joints over 1 s, 2 padded steps <marked>", png)
    overlay = Figure("overlay ep_0000", "source samples as dots", png)
    strip = Figure("overview filmstrip", "8 frames of ep_0000", png)
    cameras = [CameraRow("cam_high", "mp4", "64 x 48", 30.0, 41.234, 12, strip), CameraRow("wrist", "raw", "source",
                                                                                            15.0, None, 0, None)]
    text = render(model, [window], [overlay], cameras)
    page = Page(text)
    assert_self_contained(text, page)
    imgs = [attrs for tag, attrs in page.tags if tag == "img"]
    data = "data:image/png;base64," + base64.b64encode(png).decode()
    assert [(i["src"], i["alt"], i["title"]) for i in imgs] == [
        (data, window.alt, window.title), (data, overlay.alt, overlay.title), (data, strip.alt, strip.title)]
    assert 'alt="joints over 1 s, 2 padded steps &lt;marked&gt;"' in text
    rows = page.table("cameras")
    assert rows[1][:5] == ["cam_high", "mp4", "64 x 48", "30 Hz", "41.23 dB worst over 12 frames"]
    assert rows[2] == ["wrist", "raw", "source", "15 Hz", "not measured", "no window in split train"]
    assert "Run robowds report OUT --store" not in text


def test_html_option_and_errors(export: tuple[Path, Path], tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    store, out = export
    target = tmp_path / "page.html"
    before = (out / "report.html").exists()
    rc, stdout, _ = run(["report", str(out), "--html", str(target), "--split", "val", "--windows", "0"], capsys)
    assert rc == 0 and stdout.startswith(f"wrote {target} (") and target.is_file()
    assert (out / "report.html").exists() == before  # --html writes only there
    assert "<td>val</td>" in target.read_text()

    cases = [(["report", str(tmp_path)], f"robowds report: error: {tmp_path} has no manifest.json",
              "fix: pass the output folder of a finished export"),
             (["report", str(out), "--split", "test"], "has no split 'test' (it has: train, val)",
              "fix: pass --split with one of: train, val"),
             (["report", str(out), "--windows", "-1"], "--windows must be >= 0, got -1", "fix: e.g. --windows 6"),
             (["report", str(out), "--store", str(tmp_path / "nope")], "is not a folder",
              "fix: pass the store the export was made from")]
    for argv, what, fix in cases:
        rc, stdout, err = run(argv, capsys)
        assert rc == 2 and stdout == "" and what in err and fix in err, err
    other = tmp_path / "other"
    shutil.copytree(store, other)
    (other / "media" / "overview" / "ep_0000.png").write_bytes(_png(2, 2))  # another size: another store
    rc, _, err = run(["report", str(out), "--store", str(other)], capsys)
    assert rc == 2 and f"--store {other} is not the store this export was made from" in err
    assert "fix: pass the store the export was made from, unchanged since, or leave --store out" in err
    rc, _, _ = run(["report", str(out), "--store", str(store), "--html", str(target), "--windows", "1"], capsys)
    assert rc == 0 and "Run robowds report OUT --store" not in target.read_text()


def test_a_damaged_side_file_is_refused_naming_it(export: tuple[Path, Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The side files are read as the manifest lists them (job/listed_file.py): bytes whose sha256 is
    not the listed one are refused, not drawn from."""
    _, out = export
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    state = copy / "stats-state.msgpack"
    data = bytearray(state.read_bytes())
    data[-1] ^= 0xFF
    state.write_bytes(bytes(data))
    rc, stdout, err = run(["report", str(copy), "--windows", "0"], capsys)
    assert rc == 2 and stdout == ""
    assert (f"robowds report: error: {state} is damaged: its sha256 differs from the manifest's "
            "(files.stats_state)") in err and "fix: export again" in err


def test_verify_reexport_and_append_leave_the_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """report.html is robowds's but not the export's: verify ignores it, a re-run, an append and an
    overwrite keep it."""
    write_synthetic_store(tmp_path / "small", episodes=1, seed=3)
    write_synthetic_store(tmp_path / "grown", episodes=2, seed=3)  # the same first episode, one more
    out = tmp_path / "out"
    options = ["--quiet", "--workers", "1", "--stride", "16", "--set", "shard.min_shards=1",
               "--set", "exclude=[overview]"]
    assert main(["export", str(tmp_path / "small"), str(out), *options]) == 0
    assert run(["report", str(out), "--windows", "0"], capsys)[0] == 0
    page = (out / "report.html").read_bytes()
    assert run(["verify", str(out), "--quiet"], capsys)[0] == 0
    rc, stdout, _ = run(["export", str(tmp_path / "small"), str(out), *options], capsys)
    assert rc == 0 and "up to date" in stdout
    assert run(["export", str(tmp_path / "grown"), str(out), *options, "--append"], capsys)[0] == 0
    assert manifest_of(out)["report"]["episodes"]["exported"] == 2
    assert (out / "report.html").read_bytes() == page
    assert run(["verify", str(out), "--quiet"], capsys)[0] == 0
    assert run(["export", str(tmp_path / "grown"), str(out), *options, "--stride", "32", "--overwrite"], capsys)[0] == 0
    assert (out / "report.html").read_bytes() == page  # not the export's: an overwrite keeps it too


def test_page_of_the_husky_bag(tmp_path: Path, browser: Browser, capsys: pytest.CaptureFixture[str]) -> None:
    """Real data: the Clearpath Husky ROS 1 bag (IMU, odometry, GPS), converted and exported."""
    bag = real_path("rosbag1_real_clearpath_imu_odom_gps", "original", "test1.bag")
    assert main(["convert", "rosbag", str(bag), str(tmp_path / "store"), "--quiet", "--workers", "1"]) == 0
    out = tmp_path / "out"
    assert main(["export", str(tmp_path / "store"), str(out), "--quiet", "--workers", "1", "--stride", "50",
                 "--set", "shard.min_shards=1"]) == 0
    assert run(["report", str(out), "--windows", "1"], capsys)[0] == 0
    text = (out / "report.html").read_text()
    page = Page(text)
    assert_self_contained(text, page)
    manifest = manifest_of(out)
    [split] = manifest["splits"]
    assert [h for t, h in page.headings if t == "h3"] == [n for n, s in manifest["schema"].items()
                                                         if s["kind"] != "meta"]
    for key, stats in manifest["stats"][split].items():
        rows = page.table(f"statistics of {key} over valid steps")
        assert [r[3] for r in rows[1:]] == [f"{v:.6g}" for v in stats["std"]]
    imu = next(k for k in manifest["stats"][split] if k.startswith("imu"))
    assert f"{manifest['stats'][split][imu]['count']:,}" in text
    assert "1 considered, 1 exported, 0 rejected" in text
    with in_browser(browser, out / "report.html", pictures=1) as (_, check):
        assert len(check.svgs) == sum(len(s["mean"]) for s in manifest["stats"][split].values())


def test_page_of_the_g1_lerobot_set_with_its_camera(tmp_path: Path, browser: Browser,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Real data: the Unitree G1 LeRobot v2.1 episodes with their AV1 camera, converted as a user would,
    the report drawn with --store: a window, its source overlay and the camera's filmstrip decode in
    the browser, and the camera row says what the manifest says."""
    store, out = tmp_path / "store", tmp_path / "out"
    assert main(["convert", "lerobot", str(real_path("unitree_g1_lerobot_v2.1_real")), str(store), "--quiet"]) == 0
    cam = "observation_images_cam_high"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--fps", "10", "--stride", "20",
                 "--set", f"streams.{cam}.resize=[64,48]", "--set", f"streams.{cam}.duration_s=0.5",
                 "--set", "shard.min_shards=1"]) == 0
    assert run(["report", str(out), "--store", str(store), "--windows", "1"], capsys)[0] == 0
    manifest = manifest_of(out)
    text = (out / "report.html").read_text()
    page = Page(text)
    assert_self_contained(text, page)
    video = manifest["report"]["video"][cam]
    [row] = page.table("cameras")[1:]
    assert row[:5] == [cam, manifest["schema"][cam]["encoding"], "64 x 48", "10 Hz",
                       f"{video['psnr_db_min']:.2f} dB worst over {video['psnr_frames']} frames"]
    assert "2 considered, 2 exported, 0 rejected" in text and "30 / 30 / 30 Hz over 2 episodes" in text
    with in_browser(browser, out / "report.html", pictures=3) as (opened, check):
        assert check.images[2].alt.startswith(f"Camera {cam}")  # the filmstrip, last
        assert "kLeftShoulderPitch" in opened.text()


def test_report_of_an_export_in_s3(export: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """OUT at s3:// (a real moto server): read through the StoreLocation, the page PUT next to the manifest."""
    pytest.importorskip("moto")
    from fault_proxy import moto_client, s3_behind_proxy

    _, out = export
    with s3_behind_proxy({"out": out}) as (proxy, options):
        moto_client(proxy).delete_object(Bucket="robots", Key="out/report.html")  # only the export's own files
        rc, stdout, _ = run(["report", "s3://robots/out", "--storage-options", json.dumps(options),
                                   "--windows", "1"], capsys)
        data = moto_client(proxy).get_object(Bucket="robots", Key="out/report.html")["Body"].read()
    assert rc == 0 and stdout == f"wrote s3://robots/out/report.html ({len(data):,} bytes)\n"
    text = data.decode()
    page = Page(text)
    assert_self_contained(text, page)
    summary = {row[0]: row[1] for row in page.tables[0][1]}
    assert summary["output"] == "s3://robots/out" and summary["written"].endswith(" UTC")
    assert summary["episodes"] == "3 considered, 2 exported, 1 rejected"
