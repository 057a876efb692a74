"""The browser check the report's tests rely on (tests/browser.py, issue 27 item 5), on handmade pages.

Each page is a few lines of HTML in tmp_path with a known defect (or none), so every field of the check
is asserted exactly: a checker that missed a broken picture or a network request would let a broken
report pass. One Chromium serves the whole module (a start costs ~1 s, a page ~0.3 s).
"""

from __future__ import annotations

import base64
import io
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from PIL import Image

from browser import (BLANK_FRACTION, INSTALL_HINT, VIEWPORT, Browser, BrowserError, ChromiumMissing, ConsoleError,
                     FailedLoad, ImageInfo, SvgInfo, check_page)

TEAL = (0, 128, 128)
INSTALL_CHROMIUM = Path(__file__).resolve().parents[1] / ".ci" / "install-chromium"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium for the module (ChromiumMissing, with the install command, if there is none)."""
    with Browser(timeout=20) as started:
        yield started


def page(tmp_path: Path, body: str, title: str = "page", name: str = "page.html") -> Path:
    """A page whose <body> is `body`, one body line per source line from line 2 (0-based) on."""
    path = tmp_path / name
    path.write_text(f'<!doctype html><html><head><meta charset="utf-8"><title>{title}</title></head>\n<body>\n'
                    f"{body}\n</body></html>\n")
    return path


def png_data_url(pixels: np.ndarray) -> str:
    """A data: URL of the PNG of `pixels` [H, W, 3] uint8."""
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def red_blue() -> np.ndarray:
    """[6, 8, 3]: red on the left half, blue on the right, so a drawn copy shows which way round it is."""
    pixels = np.zeros((6, 8, 3), dtype=np.uint8)
    pixels[:, :4, 0] = 255
    pixels[:, 4:, 2] = 255
    return pixels


def test_clean_page_has_no_problem_and_draws_its_pictures(browser: Browser, tmp_path: Path) -> None:
    """An inline PNG and an inline SVG at known places: no error, no failed load, the picture decoded
    at its own size, the SVG counted with its drawn size, and the screenshot shows both, pixel exact."""
    src = png_data_url(red_blue())
    path = page(tmp_path, title="Clean page", body=(
        f'<img alt="red and blue" src="{src}" width="160" height="120" '
        'style="position:absolute; left:0; top:0; image-rendering:pixelated">\n'
        '<svg width="300" height="150" style="position:absolute; left:400px; top:300px">'
        '<rect width="300" height="150" fill="rgb(0,128,128)"/><title>teal</title></svg>'))
    shot = tmp_path / "top.png"
    check = browser.check_page(path, screenshot=shot)
    assert check.problems() == []
    assert (check.title, check.console_errors, check.failed_loads, check.local_files) == ("Clean page", (), (), ())
    assert check.images == (ImageInfo(src[:40], "red and blue", 8, 6, True, "ok"),)
    assert check.images[0].decoded
    assert check.svgs == (SvgInfo(300, 150, 2),)
    assert shot.read_bytes() == check.screenshot_png
    pixels = np.asarray(Image.open(shot).convert("RGB"))  # [900, 1280, 3]
    assert pixels.shape == (VIEWPORT[1], VIEWPORT[0], 3)
    assert tuple(pixels[60, 40]) == (255, 0, 0) and tuple(pixels[60, 120]) == (0, 0, 255)  # not mirrored
    assert tuple(pixels[375, 550]) == TEAL and tuple(pixels[0, 1279]) == (255, 255, 255)
    drawn = 160 * 120 + 300 * 150  # pixels that are not white
    assert check.differing_fraction == pytest.approx(drawn / (VIEWPORT[0] * VIEWPORT[1]))
    assert check.blank is False


def test_corrupt_png_is_reported_undecoded(browser: Browser, tmp_path: Path) -> None:
    """A data: PNG cut after its header loads (no failed request) but decodes to nothing: naturalWidth 0,
    reported with its src prefix and alt; the good picture beside it is not."""
    good = png_data_url(red_blue())
    cut = b"\x89PNG\r\n\x1a\n" + b"\0\0\0\rIHDR" + b"\x07" * 9  # the signature, then half a header chunk
    corrupt = "data:image/png;base64," + base64.b64encode(cut).decode()
    path = page(tmp_path, f'<img alt="good" src="{good}">\n<img alt="cut" src="{corrupt}">\n<p>text</p>')
    check = browser.check_page(path)
    assert check.failed_loads == () and check.console_errors == ()
    assert [(im.alt, im.natural_width, im.natural_height, im.complete, im.decoded) for im in check.images] == [
        ("good", 8, 6, True, True), ("cut", 0, 0, True, False)]
    assert check.images[1].decode == "EncodingError: The source image cannot be decoded."
    assert check.problems() == [
        f"image 1 (src {corrupt[:40]!r}, alt 'cut') not decoded: naturalWidth 0, complete True, "
        "decode EncodingError: The source image cannot be decoded.",
        f"screenshot blank: {check.differing_fraction:.4%} of its pixels differ from the most common colour (< 0.5%)"]


def test_console_error_is_reported_with_its_text_and_place(browser: Browser, tmp_path: Path) -> None:
    """console.error('x') and a failed console.assert, each with the page and 0-based line it came from."""
    path = page(tmp_path, "<h1>console</h1>\n<script>console.error('x');\nconsole.assert(1 === 2, 'not equal', 2);"
                          "\nconsole.log('fine'); console.warn('only a warning')</script>")
    check = browser.check_page(path)
    url = path.resolve().as_uri()
    assert check.console_errors == (ConsoleError("console", "x", url, 3),
                                    ConsoleError("console", "not equal 2", url, 4))
    assert check.failed_loads == ()
    assert check.problems()[:2] == [f"console console: x ({url}:3)", f"console console: not equal 2 ({url}:4)"]


def test_uncaught_exceptions_are_reported_with_their_message(browser: Browser, tmp_path: Path) -> None:
    """A thrown error and a rejected promise nobody handles, each with its message (and stack)."""
    path = page(tmp_path, "<h1>throws</h1>\n<script>Promise.reject(new Error('later'));\n"
                          "throw new TypeError('boom');</script>")
    check = browser.check_page(path)
    url = path.resolve().as_uri()
    assert [(e.kind, e.text.splitlines()[0], e.url, e.line) for e in check.console_errors] == [
        ("exception", "Uncaught TypeError: boom", url, 4),
        ("exception", "Uncaught (in promise) Error: later", url, 3)]
    assert f"at {url}:5:7" in check.console_errors[0].text  # the stack names the page, 1-based line:column


def test_network_and_missing_loads_are_reported_without_waiting(browser: Browser, tmp_path: Path) -> None:
    """Pictures, a stylesheet and a script from http(s) are forbidden and fail at once (blocked by the
    DevTools protocol, never sent: no test waits on a network, none is "still pending"); a missing local
    file is a failed load with Chromium's reason; a local picture that loads is still not self-contained."""
    Image.fromarray(red_blue()).save(tmp_path / "beside.png")
    path = page(tmp_path, '<link rel="stylesheet" href="https://example.invalid/style.css">\n'
                          '<script src="http://example.invalid/app.js"></script>\n'
                          '<img alt="net" src="http://example.invalid/x.png">\n<img alt="gone" src="./nope.png">\n'
                          '<img alt="beside" src="beside.png">\n<p>text</p>')
    check = browser.check_page(path)
    forbidden = "forbidden: not a file: or data: URL (the page must be self-contained); blocked (inspector)"
    assert sorted(check.failed_loads, key=lambda failed: failed.url) == [
        FailedLoad((tmp_path / "nope.png").as_uri(), "net::ERR_FILE_NOT_FOUND"),
        FailedLoad("http://example.invalid/app.js", forbidden), FailedLoad("http://example.invalid/x.png", forbidden),
        FailedLoad("https://example.invalid/style.css", forbidden)]
    assert check.local_files == ((tmp_path / "nope.png").as_uri(), (tmp_path / "beside.png").as_uri())
    assert [(im.src, im.natural_width, im.decoded) for im in check.images] == [
        ("http://example.invalid/x.png", 0, False), ("./nope.png", 0, False), ("beside.png", 8, True)]
    assert check.console_errors == ()  # the browser's own "failed to load" lines are failed loads, not twice
    assert f"not self-contained: loads {(tmp_path / 'beside.png').as_uri()} (a copy of the page alone, e.g. a " \
           "mail attachment, would lack it)" in check.problems()


def test_blank_means_almost_one_colour(browser: Browser, tmp_path: Path) -> None:
    """An empty white page is blank (0 differing pixels); with a 10x10 black square (100 of 1,152,000
    pixels) it still is; with a 100x100 one (0.87%) it is not: the line is BLANK_FRACTION of the pixels.
    One page, checked again after each change (a check can be repeated on an open page)."""
    total = VIEWPORT[0] * VIEWPORT[1]
    with browser.open(page(tmp_path, "")) as opened:
        white = opened.check()
        assert (white.differing_fraction, white.blank) == (0.0, True)
        assert white.problems() == ["screenshot blank: 0.0000% of its pixels differ from the most common colour "
                                    "(< 0.5%)"]
        for side, blank in ((10, True), (100, False)):
            opened.evaluate(f"document.body.innerHTML = '<div style=\"position:absolute; left:50px; top:50px; "
                            f"width:{side}px; height:{side}px; background:#000\"></div>'")
            square = opened.check()
            assert (square.differing_fraction, square.blank) == (pytest.approx(side * side / total), blank)
    assert 100 / total < BLANK_FRACTION < 10_000 / total


def test_text_evaluate_and_click_in_one_page(browser: Browser, tmp_path: Path) -> None:
    """innerText as a person sees it, an awaited JSON value, a real click on a sort header that reorders
    the rows, and a thrown error or a missing element named in BrowserError."""
    path = page(tmp_path, """<h1>Episodes</h1>
<table><thead><tr><th id="by-name">name</th></tr></thead><tbody><tr><td>b</td></tr><tr><td>c</td></tr>
<tr><td>a</td></tr></tbody></table>
<details><summary>config</summary>hidden text</details>
<script>document.getElementById('by-name').addEventListener('click', () => {
  const body = document.querySelector('tbody');
  [...body.rows].sort((x, y) => x.textContent.localeCompare(y.textContent)).forEach(r => body.appendChild(r));
});</script>""")
    rows = "[...document.querySelectorAll('tbody td')].map(c => c.textContent)"
    with browser.open(path) as opened:
        assert opened.text() == "Episodes\nname\nb\nc\na\nconfig"  # a closed <details> shows its summary only
        assert opened.evaluate("(async () => { await new Promise(r => setTimeout(r, 10)); "
                               "return [1, 'a', {b: null, c: 2.5}]; })()") == [1, "a", {"b": None, "c": 2.5}]
        assert opened.evaluate(rows) == ["b", "c", "a"]
        opened.click("#by-name")
        assert opened.evaluate(rows) == ["a", "b", "c"]
        with pytest.raises(BrowserError, match="threw: Error: nope"):
            opened.evaluate("(() => { throw new Error('nope'); })()")
        with pytest.raises(BrowserError, match=r"click: no visible element matches '#absent'"):
            opened.click("#absent")
        after = opened.check()  # the error thrown above was evaluate's, not the page's
        assert (after.console_errors, after.failed_loads) == ((), ())


def test_a_page_that_never_loads_fails_in_bounded_time(browser: Browser, tmp_path: Path) -> None:
    """A script that never returns holds the load event: BrowserError after the page timeout, and the
    browser still serves the next page; a page that is not there is named with Chromium's reason."""
    path = page(tmp_path, "<script>while (true) {}</script>", name="hang.html")
    started = time.monotonic()
    with pytest.raises(BrowserError, match=r"hang.html did not finish loading in 0.5 s"):
        with browser.open(path, timeout=0.5):
            pass
    assert time.monotonic() - started < 10  # not the browser's 20 s: the page's own 0.5 s, then closing its tab
    assert browser.check_page(page(tmp_path, "<h1>next</h1>" * 20, name="next.html")).problems() == []
    with pytest.raises(BrowserError, match=r"could not open file://.*/absent.html: net::ERR_FILE_NOT_FOUND"):
        browser.check_page(tmp_path / "absent.html")


def test_one_shot_check_leaves_no_process_or_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """check_page starts its own Chromium and, on return, its processes (found by the HOME it gave them)
    are gone with its temporary profile."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    check = check_page(page(tmp_path, "<h1>one shot</h1>" * 20))
    assert check.problems() == [] and check.title == "page"
    assert list((tmp_path / "tmp").iterdir()) == []
    marker = f"HOME={tmp_path / 'tmp'}".encode()
    left = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if marker in (proc / "environ").read_bytes():
                left.append(proc.name)
        except OSError:  # gone meanwhile, or not ours to read
            continue
    assert left == []


def test_missing_chromium_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Chromium on PATH: ChromiumMissing with the install command (the tests fail with it, never skip)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ChromiumMissing, match="install chromium: apt-get install -y chromium") as raised:
        Browser().__enter__()
    assert INSTALL_HINT in str(raised.value) and os.environ["PATH"] == str(tmp_path)


def run_install_chromium(tmp_path: Path, apt_get: str, chromium: bool = False) -> tuple[list[str], list[str]]:
    """Run .ci/install-chromium with a PATH holding only the shell tools it uses, an `apt-get` whose body
    is `apt_get` (bash; $BIN is its folder) after logging its call, and a `chromium` when asked; returns
    (the lines it printed, the apt-get calls as "$DEBIAN_FRONTEND args")."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "mktemp", "tail", "rm", "chmod"):  # the script's, and chmod for the fake apt-get
        (bin_dir / tool).symlink_to(shutil.which(tool) or tool)
    scripts = {"apt-get": f'BIN={bin_dir}\necho "$DEBIAN_FRONTEND $*" >> {tmp_path}/calls\n{apt_get}'}
    if chromium:
        scripts["chromium"] = 'echo "Chromium 1.2.3"'
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!{shutil.which('bash')}\n{body}\n")
        (bin_dir / name).chmod(0o755)
    done = subprocess.run([str(INSTALL_CHROMIUM)], env={"PATH": str(bin_dir)}, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0 and done.stderr == "", done
    calls = tmp_path / "calls"
    return done.stdout.splitlines(), calls.read_text().splitlines() if calls.exists() else []


# what a successful `apt-get install` leaves: a chromium on PATH
PUT_CHROMIUM = """printf '#!/bin/sh\\necho "Chromium 1.2.3"\\n' > $BIN/chromium; chmod +x $BIN/chromium"""
MISSING = "ci: chromium is missing: apt-get install -y chromium (for the browser tests)"
INSTALLED = "ci: chromium installed: Chromium 1.2.3"
INSTALL = "noninteractive install -y -q chromium"


def test_ci_installs_chromium_only_when_missing(tmp_path: Path) -> None:
    """.ci/run's installer does nothing when chromium is on PATH."""
    assert run_install_chromium(tmp_path, "exit 1", chromium=True) == ([], [])


def test_ci_updates_package_lists_only_when_the_install_needs_it(tmp_path: Path) -> None:
    """A fresh image has no package lists: install fails, update, install again (non-interactive); with
    lists already there, one install and no update."""
    lists = tmp_path / "updated"
    apt_get = (f'case "$1" in\n  update) : > {lists} ;;\n'
               f'  install) [ -e {lists} ] || {{ echo "E: Unable to locate package chromium"; exit 100; }}; '
               f'{PUT_CHROMIUM} ;;\nesac')
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert run_install_chromium(fresh, apt_get) == ([MISSING, INSTALLED],
                                                    [INSTALL, "noninteractive update -q", INSTALL])
    warm = tmp_path / "warm"
    warm.mkdir()
    assert run_install_chromium(warm, apt_get) == ([MISSING, INSTALLED], [INSTALL])


def test_ci_says_in_one_line_when_chromium_cannot_be_installed(tmp_path: Path) -> None:
    """No network: apt-get's own errors, then one line saying the browser tests will fail; exit 0, so
    `make test` still runs and reports everything else."""
    printed, calls = run_install_chromium(tmp_path, 'echo "E: Unable to locate package chromium"; exit 100')
    assert calls == [INSTALL, "noninteractive update -q"]
    assert printed == [MISSING, "E: Unable to locate package chromium", "E: Unable to locate package chromium",
                       "ci: error: could not install chromium (apt-get install -y chromium failed, its output "
                       "above); the browser tests will fail"]
