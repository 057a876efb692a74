"""Headless Chromium checks of a self-contained HTML page, for the report's tests (issue 27 item 5).

Why a real browser: the report must open from a file:// URL with no console error and no failed load,
every picture decoded and something drawn at the top; only a browser can say that. Why this shape:
- one `Browser` (one Chromium process, ~0.6-1 s to start: tests/chromium.py) serves many pages: a
  module-scoped fixture starts it once, and each test opens its page in a fresh tab (`Browser.open`),
  so pages share no state and one costs ~0.2-0.5 s;
- any http(s)/ws(s)/ftp request is blocked (it fails at once, so no test waits on a network) and
  reported as a forbidden load: the page must be self-contained;
- every wait is bounded by a deadline; the page's tab is closed and the browser killed whatever happens.

Usage:

    with Browser() as browser, browser.open(Path("report.html")) as page:
        check = page.check(screenshot=Path("top.png"))
        assert check.problems() == []
        assert "fingerprint" in page.text()
        page.click("th[data-sort=duration]")  # a real mouse click at the header's centre
        first = page.evaluate("[...document.querySelectorAll('tbody tr td:first-child')].map(c => c.textContent)")

or, for one page, `check_page(path, screenshot)`. In a test module, one browser for all its tests:

    @pytest.fixture(scope="module")
    def browser() -> Iterator[Browser]:
        with Browser(timeout=20) as started:
            yield started

Chromium missing: ChromiumMissing, saying "install chromium: apt-get install -y chromium" (the tests
fail with it, they never skip: CI installs Chromium in .ci/run).
"""

from __future__ import annotations

import base64
import io
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

import numpy as np
from PIL import Image

from chromium import INSTALL_HINT, BrowserError, BrowserTimeout, Chromium, ChromiumMissing, Connection

__all__ = ["INSTALL_HINT", "Browser", "BrowserError", "BrowserTimeout", "ChromiumMissing", "ConsoleError",
           "FailedLoad", "ImageInfo", "Page", "PageCheck", "SvgInfo", "check_page", "differing_fraction"]

VIEWPORT = (1280, 900)  # width, height of the page and of the screenshot of its top, CSS pixels
# a screenshot is blank when fewer than this fraction of its pixels differ from its most common colour:
# 0.5% of 1280x900 is ~5.8k pixels, about one short line of heading text; a page that drew anything
# real (a table, a picture) differs far more, and a white page with a stray border or caret does not pass
BLANK_FRACTION = 0.005
# what a page may request without a failed load; a file: URL other than the page itself loads, but is
# listed in PageCheck.local_files (a mail attachment would arrive without it)
ALLOWED_SCHEMES = frozenset({"file", "data", "blob", "about"})
# requests to these fail at once (no test waits on a network). URLPattern syntax, matched against the
# whole URL: the older `urls` wildcards match anywhere in it, and "http://*" blocked every inline SVG
# picture (its xmlns holds "http://www.w3.org/...")
BLOCKED_PATTERNS = [f"{scheme}://*:*/*" for scheme in ("http", "https", "ws", "wss", "ftp")]


@dataclass(frozen=True)
class ConsoleError:
    """One error the page's console showed: kind is "console" (console.error or console.assert),
    "exception" (uncaught, also in promises) or "log" (the browser's own error, e.g. a CSP refusal)."""

    kind: str
    text: str
    url: str = ""
    line: int = -1  # 0-based line in `url`, -1 when unknown


@dataclass(frozen=True)
class FailedLoad:
    """A request that failed (file missing, decode error, blocked) or was forbidden (not file:/data:)."""

    url: str  # the first 200 characters
    reason: str


@dataclass(frozen=True)
class ImageInfo:
    """One <img> after the page settled: `src` is the attribute's first 40 characters."""

    src: str
    alt: str | None  # None when the attribute is missing (an empty alt="" marks a decorative picture)
    natural_width: int
    natural_height: int
    complete: bool
    decode: str  # "ok" when HTMLImageElement.decode() resolved, else its error or "timeout"

    @property
    def decoded(self) -> bool:
        """The picture decoded to real pixels (a broken one is `complete` too, with width 0)."""
        return self.complete and self.natural_width > 0 and self.natural_height > 0 and self.decode == "ok"


@dataclass(frozen=True)
class SvgInfo:
    """One outermost inline <svg>: its drawn size in CSS pixels (0 x 0 when not rendered, e.g. inside a
    closed <details>) and its number of descendant elements."""

    width: float
    height: float
    elements: int


@dataclass(frozen=True)
class PageCheck:
    """What a person opening the page would meet: errors, failed loads, pictures, the top of the page."""

    url: str
    title: str
    console_errors: tuple[ConsoleError, ...]
    failed_loads: tuple[FailedLoad, ...]
    local_files: tuple[str, ...]  # file: URLs the page requested besides itself (first 200 characters)
    images: tuple[ImageInfo, ...]
    svgs: tuple[SvgInfo, ...]
    screenshot_png: bytes = field(repr=False)  # the viewport (VIEWPORT) at the top of the page
    differing_fraction: float  # of the screenshot's pixels that differ from its most common colour
    blank: bool  # differing_fraction < BLANK_FRACTION

    def problems(self) -> list[str]:
        """One line per thing that is wrong for a self-contained page; [] when it is clean, so a test
        writes `assert check.problems() == []` and a failure lists them all."""
        found = [f"console {e.kind}: {e.text} ({e.url}:{e.line})" for e in self.console_errors]
        found += [f"failed load {f.url}: {f.reason}" for f in self.failed_loads]
        found += [f"not self-contained: loads {url} (a copy of the page alone, e.g. a mail attachment, would "
                  "lack it)" for url in self.local_files]
        found += [f"image {i} (src {im.src!r}, alt {im.alt!r}) not decoded: naturalWidth {im.natural_width}, "
                  f"complete {im.complete}, decode {im.decode}" for i, im in enumerate(self.images) if not im.decoded]
        if self.blank:
            found.append(f"screenshot blank: {self.differing_fraction:.4%} of its pixels differ from the most "
                         f"common colour (< {BLANK_FRACTION:.1%})")
        return found


def differing_fraction(png: bytes) -> float:
    """The fraction of the image's pixels whose colour differs from its most common colour."""
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.uint32)  # [H, W, 3]
    packed = (rgb[..., 0] << 16 | rgb[..., 1] << 8 | rgb[..., 2]).ravel()  # [H * W] one int per colour
    _, counts = np.unique(packed, return_counts=True)
    return float(1.0 - counts.max() / packed.size)


class Page:
    """One tab showing one page; created by `Browser.open`, which also loads the page."""

    def __init__(self, connection: Connection, target: str, session: str, url: str, timeout: float) -> None:
        self._conn, self._target, self.session, self.url, self.timeout = connection, target, session, url, timeout
        self._requests: dict[str, str] = {}  # requestId -> url, of requests not finished yet
        self._failed: dict[str, FailedLoad] = {}  # url -> why, one entry per url
        self._local: dict[str, None] = {}  # file: URLs other than the page, in request order
        self._errors: list[ConsoleError] = []
        self._lifecycle: list[tuple[str, str]] = []  # (loaderId, name) of the lifecycle events seen

    def _send(self, method: str, params: dict[str, Any] | None = None,
              timeout: float | None = None) -> dict[str, Any]:
        seconds = self.timeout if timeout is None else timeout
        result = self._conn.send(method, params, self.session, time.monotonic() + seconds)
        self._absorb()
        return result

    def _absorb(self) -> None:
        """Fold the session's new events into the requests, failures and errors seen so far."""
        for event in self._conn.take_events(self.session):
            method, params = event["method"], event.get("params", {})
            if method == "Network.requestWillBeSent":
                url = params["request"]["url"]
                self._requests[params["requestId"]] = url
                scheme = urlsplit(url).scheme
                if scheme == "file" and url.split("#")[0] != self.url:
                    self._local[url[:200]] = None
                if scheme not in ALLOWED_SCHEMES:
                    self._fail(url, "forbidden: not a file: or data: URL (the page must be self-contained)")
            elif method == "Network.webSocketCreated":
                self._fail(params["url"], "forbidden: a websocket (the page must be self-contained)")
            elif method == "Network.loadingFinished":
                self._requests.pop(params["requestId"], None)
            elif method == "Network.responseReceived" and params["response"].get("status", 0) >= 400:
                self._fail(params["response"]["url"], f"status {params['response']['status']}")
            elif method == "Network.loadingFailed":
                url = self._requests.pop(params["requestId"], "?")
                if not params.get("canceled"):  # a blocked request never reached a network: "blocked (inspector)"
                    blocked = params.get("blockedReason")
                    self._fail(url, f"blocked ({blocked})" if blocked else params.get("errorText") or "failed")
            elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                frame = (params.get("stackTrace", {}).get("callFrames") or [{}])[0]
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                self._errors.append(ConsoleError("console", text or params["type"], frame.get("url", ""),
                                                 frame.get("lineNumber", -1)))
            elif method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                text = details.get("exception", {}).get("description") or details.get("text", "")
                self._errors.append(ConsoleError("exception", f"{details.get('text', '')} {text}".strip(),
                                                 details.get("url", ""), details.get("lineNumber", -1)))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                entry = params["entry"]
                # network errors are failed loads already; javascript ones are exceptions already
                if entry.get("source") not in ("network", "javascript"):
                    self._errors.append(ConsoleError("log", entry["text"], entry.get("url", ""),
                                                     entry.get("lineNumber", -1)))
            elif method == "Page.lifecycleEvent":
                self._lifecycle.append((params["loaderId"], params["name"]))

    def _fail(self, url: str, reason: str) -> None:
        """Note a failed load; a second reason for the same URL (forbidden, then blocked) is appended."""
        url = url[:200]
        known = self._failed.get(url)
        if known is None:
            self._failed[url] = FailedLoad(url, reason)
        elif reason not in known.reason:
            self._failed[url] = FailedLoad(url, f"{known.reason}; {reason}")

    def _wait(self, done: Callable[[], bool], deadline: float) -> bool:
        """Pump events until done() holds (True) or the deadline passes (False)."""
        self._absorb()
        while not done():
            if not self._conn.pump(deadline) and time.monotonic() >= deadline:
                self._absorb()
                return done()
            self._absorb()
        return True

    def load(self) -> None:
        """Navigate to the page and wait for its load event (the page and its pictures fetched), all
        within the page's timeout; BrowserError naming the page (and what was pending) past it."""
        deadline = time.monotonic() + self.timeout
        width, height = VIEWPORT
        setup = [*((f"{domain}.enable", {}) for domain in ("Runtime", "Log", "Network", "Page")),
                 ("Page.setLifecycleEventsEnabled", {"enabled": True}),
                 ("Network.setBlockedURLs",
                  {"urlPatterns": [{"urlPattern": pattern, "block": True} for pattern in BLOCKED_PATTERNS]}),
                 ("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})]
        try:
            for method, params in setup:
                self._send(method, params, max(0.0, deadline - time.monotonic()))
            nav = self._send("Page.navigate", {"url": self.url}, max(0.0, deadline - time.monotonic()))
            if nav.get("errorText"):
                raise BrowserError(f"Chromium could not open {self.url}: {nav['errorText']}")
            loaded = self._wait(lambda: (nav["loaderId"], "load") in self._lifecycle, deadline)
        except BrowserTimeout:
            loaded = False
        if not loaded:
            raise BrowserError(f"{self.url} did not finish loading in {self.timeout:g} s; requests still "
                               f"pending: {sorted(self._requests.values())[:5]}")

    def evaluate(self, expression: str, timeout: float | None = None) -> Any:
        """The JSON value of a JavaScript expression in the page; a promise is awaited (so
        `(async () => {...})()` works), a thrown error raises BrowserError with its message. Runs as a
        user gesture, so what only a click may do (open a <details>, focus) works too."""
        result = self._send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                 "awaitPromise": True, "userGesture": True}, timeout)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text", "")
            raise BrowserError(f"evaluating {expression[:80]!r} threw: {text}")
        return result["result"].get("value")

    def text(self) -> str:
        """document.body.innerText: the text a person sees, laid out (a closed <details>' body is not
        rendered, so not in it; `evaluate("document.body.textContent")` has everything)."""
        return self.evaluate("document.body ? document.body.innerText : ''")

    def click(self, selector: str) -> None:
        """A real mouse click (pressed and released) at the centre of the first element matching the CSS
        selector, after scrolling it into view: what a person's click does, so an element hidden under
        another one gets nothing. BrowserError when nothing matches or it has no size."""
        box = self.evaluate(f"""(() => {{
            const el = document.querySelector({json.dumps(selector)});
            if (!el) return null;
            el.scrollIntoView({{block: 'center'}});
            const r = el.getBoundingClientRect();
            return [r.left + r.width / 2, r.top + r.height / 2, r.width * r.height];
        }})()""")
        if box is None or box[2] <= 0:
            raise BrowserError(f"click: no visible element matches {selector!r} in {self.url}")
        for kind in ("mousePressed", "mouseReleased"):
            self._send("Input.dispatchMouseEvent",
                       {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1})

    def check(self, screenshot: Path | None = None) -> PageCheck:
        """Settle the pictures (lazy ones loaded, each decoded or failed, bounded by the page timeout),
        then report errors, failed loads, pictures, inline SVGs, title and the top of the page (written
        to `screenshot` as PNG when given)."""
        budget_ms = int(self.timeout * 1000 * 0.8)  # decoding waits in the page; leave time for the reply
        images = self.evaluate(f"""(async () => {{
            const imgs = Array.from(document.images);
            for (const img of imgs) if (img.loading === 'lazy') img.loading = 'eager';
            const late = new Promise(done => setTimeout(() => done('timeout'), {budget_ms}));
            const decoded = await Promise.all(imgs.map(img => Promise.race(
                [img.decode().then(() => 'ok', e => String(e)), late])));
            return imgs.map((img, i) => ({{src: (img.getAttribute('src') || '').slice(0, 40),
                alt: img.getAttribute('alt'), w: img.naturalWidth, h: img.naturalHeight,
                complete: img.complete, decode: decoded[i]}}));
        }})()""")
        # requests the page started after its load event (script, lazy pictures) end or fail too
        self._wait(lambda: not self._requests, time.monotonic() + self.timeout * 0.2)
        for url in self._requests.values():
            self._fail(url, "still pending when the check ended")
        svgs = self.evaluate("""Array.from(document.querySelectorAll('svg'))
            .filter(s => !(s.parentElement && s.parentElement.closest('svg')))
            .map(s => { const r = s.getBoundingClientRect();
                        return [r.width, r.height, s.querySelectorAll('*').length]; })""")
        title = self.evaluate("document.title")
        self._send("Page.bringToFront")
        png = base64.b64decode(self._send("Page.captureScreenshot", {"format": "png"})["data"])
        if screenshot is not None:
            screenshot.write_bytes(png)
        fraction = differing_fraction(png)
        self._absorb()
        return PageCheck(
            url=self.url, title=title, console_errors=tuple(self._errors),
            failed_loads=tuple(self._failed.values()), local_files=tuple(self._local),
            images=tuple(ImageInfo(i["src"], i["alt"], i["w"], i["h"], i["complete"], i["decode"]) for i in images),
            svgs=tuple(SvgInfo(w, h, n) for w, h, n in svgs),
            screenshot_png=png, differing_fraction=fraction, blank=bool(fraction < BLANK_FRACTION))

    def close(self) -> None:
        """Close the tab and drop its events. A browser that died has no tab left to close: that error
        is not raised here, so it does not hide the one that says why the test failed."""
        try:
            self._conn.send("Target.closeTarget", {"targetId": self._target}, deadline=time.monotonic() + 5)
        except BrowserError:
            pass
        finally:
            self._conn.take_events(self.session)


class Browser(Chromium):
    """One headless Chromium for many pages (a context manager: killed, its profile removed, on exit)."""

    @contextmanager
    def open(self, path: Path, timeout: float | None = None) -> Iterator[Page]:
        """A `Page` with `path` loaded from its file:// URL in a new tab, closed on exit; BrowserError
        when it does not load within `timeout` seconds (default: the browser's)."""
        timeout = timeout or self.timeout
        assert self.connection is not None, "the browser is not started: use `with Browser() as browser`"
        target, session = self.new_tab(time.monotonic() + self.timeout)  # a tab is not the page: the browser's time
        page = Page(self.connection, target, session, Path(path).resolve().as_uri(), timeout)
        try:
            page.load()
            yield page
        finally:
            page.close()

    def check_page(self, path: Path, screenshot: Path | None = None, timeout: float | None = None) -> PageCheck:
        """Open, check and close one page (see Page.check)."""
        with self.open(path, timeout) as page:
            return page.check(screenshot)


def check_page(path: Path, screenshot: Path | None = None, timeout: float = 30) -> PageCheck:
    """Start Chromium, check one page (Page.check), stop Chromium. For many pages, use one `Browser`."""
    with Browser(timeout) as browser:
        return browser.check_page(path, screenshot, timeout)
