"""A headless Chromium process and its DevTools-protocol pipe (the transport under tests/browser.py).

Chromium started with `--remote-debugging-pipe` reads JSON commands, each ended by a NUL byte, on its
fd 3 and writes replies and events the same way on its fd 4: no websocket library, no port to pick or
leak, no new dependency. The process runs in its own process group, so `close()` kills it with every
child it forked (renderer, GPU, zygote); its profile folder is also its HOME, so crash-report and NSS
folders land there and are removed with it instead of under the real home.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Callable

PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h): the signal this process gets when its parent dies
INSTALL_HINT = "install chromium: apt-get install -y chromium"
EXECUTABLES = ("chromium", "chromium-browser")  # Debian's name first, then Ubuntu's/Fedora's
FLAGS = (
    "--headless",  # the new headless mode (the full browser, no window)
    "--no-sandbox",  # the tests run as root on CI, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-dev-shm-usage",  # a container's /dev/shm is often 64 MB: a big page would crash the tab
    "--disable-background-networking",  # no update checks or safe-browsing lists (no network on CI)
    "--disable-component-update",
    "--disable-sync",
    "--mute-audio",
    "--hide-scrollbars",  # a scrollbar is not the page: keep it out of screenshots
    "--remote-debugging-pipe",
)


class BrowserError(RuntimeError):
    """Chromium failed: it did not start, died, answered a command with an error, or a wait ran out."""


class BrowserTimeout(BrowserError):
    """A command got no reply before its deadline (a hung page, or a machine too loaded)."""


class ChromiumMissing(BrowserError):
    """No Chromium on PATH: the browser tests need it (CI installs it in .ci/run)."""


def find_chromium() -> str:
    """The Chromium executable on PATH, or ChromiumMissing saying how to install it."""
    for name in EXECUTABLES:
        found = shutil.which(name)
        if found:
            return found
    raise ChromiumMissing(f"no Chromium on PATH (looked for {', '.join(EXECUTABLES)}): the browser tests "
                          f"need it; {INSTALL_HINT} (.ci/run does that on CI)")


class Connection:
    """The two pipes to Chromium: commands out, replies and events in. Single-threaded: a reply or an
    event is read only while someone waits (`send`, `pump`), each wait bounded by a deadline. Events are
    kept per session (one per tab) until the page that owns the session takes them."""

    def __init__(self, write_fd: int, read_fd: int, log: Callable[[], str]) -> None:
        self._write_fd, self._read_fd, self._log = write_fd, read_fd, log
        self._buffer = b""  # the start of a message whose NUL has not come yet
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._events: dict[str, list[dict[str, Any]]] = {}  # sessionId ("" = the browser) -> events in order

    def send(self, method: str, params: dict[str, Any] | None = None, session: str = "",
             deadline: float | None = None) -> dict[str, Any]:
        """Run one command and return its result; BrowserError on an error reply, on Chromium's exit or
        at the deadline (default: 30 s from now)."""
        self._next_id += 1
        msg_id = self._next_id
        message: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        try:
            while data:
                data = data[os.write(self._write_fd, data):]
        except OSError as exc:
            raise BrowserError(f"Chromium stopped reading commands ({exc}); its log ends:\n{self._log()}") from exc
        deadline = deadline if deadline is not None else time.monotonic() + 30
        while msg_id not in self._replies:
            if not self.pump(deadline):
                raise BrowserTimeout(f"no reply to {method} before the deadline; Chromium's log ends:\n{self._log()}")
        reply = self._replies.pop(msg_id)
        if "error" in reply:
            raise BrowserError(f"{method} failed: {reply['error'].get('message')} {reply['error'].get('data', '')}")
        return reply.get("result", {})

    def pump(self, deadline: float) -> bool:
        """Read what Chromium sent, waiting at most until the deadline; False when nothing came."""
        ready, _, _ = select.select([self._read_fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return False
        chunk = os.read(self._read_fd, 1 << 20)
        if not chunk:
            raise BrowserError(f"Chromium closed its DevTools pipe (it exited); its log ends:\n{self._log()}")
        *messages, self._buffer = (self._buffer + chunk).split(b"\0")
        for raw in messages:
            message = json.loads(raw)
            if "id" in message:
                self._replies[message["id"]] = message  # a reply to a command that timed out stays unread
            else:
                self._events.setdefault(message.get("sessionId", ""), []).append(message)
        return True

    def take_events(self, session: str) -> list[dict[str, Any]]:
        """The session's events received so far, in order (each is returned once)."""
        return self._events.pop(session, [])


class Chromium:
    """One headless Chromium process (a context manager: on exit, whatever happened, its process group
    is killed and its temporary profile removed). `new_tab` opens a tab and attaches to it."""

    def __init__(self, timeout: float = 30) -> None:
        self.timeout = timeout  # seconds for starting, and the default for each page
        self._proc: subprocess.Popen[bytes] | None = None
        self._profile = ""
        self._fds: list[int] = []
        self.connection: Connection | None = None
        self.version = ""
        self.start_seconds = 0.0  # from spawning to its first reply

    def __enter__(self) -> Chromium:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def log(self) -> str:
        """The end of Chromium's stderr, without the dbus lines every container prints (no system bus)."""
        try:
            lines = (Path(self._profile) / "chromium.log").read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(line for line in lines if "dbus" not in line)[-3000:]

    def start(self) -> None:
        """Spawn Chromium with the DevTools pipe on its fds 3 (commands in) and 4 (replies out)."""
        executable = find_chromium()
        started = time.monotonic()
        self._profile = tempfile.mkdtemp(prefix="robowds-chromium-")
        commands_r, commands_w = os.pipe()  # we write commands, Chromium reads them on its fd 3
        replies_r, replies_w = os.pipe()  # Chromium writes on its fd 4, we read
        self._fds = [commands_r, commands_w, replies_r, replies_w]
        # copies at fds >= 10, so moving them onto 3 and 4 in the child never overwrites one with the other
        child_in = fcntl.fcntl(commands_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(replies_w, fcntl.F_DUPFD_CLOEXEC, 10)
        self._fds += [child_in, child_out]

        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, only called after it

        def in_child() -> None:  # between fork and exec: three system calls, nothing else
            os.dup2(child_in, 3)
            os.dup2(child_out, 4)
            # Chromium outlives a closed DevTools pipe: if this process is killed (SIGKILL, an xdist
            # worker lost) the kernel kills Chromium too; its children exit with it
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

        home = Path(self._profile) / "home"
        env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
               "XDG_CACHE_HOME": str(home / ".cache")}
        with open(Path(self._profile) / "chromium.log", "wb") as log:
            self._proc = subprocess.Popen(
                [executable, *FLAGS, f"--user-data-dir={Path(self._profile) / 'profile'}", "about:blank"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, pass_fds=(3, 4),
                preexec_fn=in_child, start_new_session=True)  # its own group: close() kills it whole
        for fd in (commands_r, replies_w, child_in, child_out):  # the child's ends: only the child keeps them
            os.close(fd)
            self._fds.remove(fd)
        self.connection = Connection(commands_w, replies_r, self.log)
        self.version = self.connection.send("Browser.getVersion", deadline=started + self.timeout)["product"]
        self.start_seconds = time.monotonic() - started

    def new_tab(self, deadline: float) -> tuple[str, str]:
        """(targetId, sessionId) of a new blank tab, attached in flat mode: its commands and events carry
        the sessionId on the one pipe."""
        assert self.connection is not None, "Chromium is not started"
        target = self.connection.send("Target.createTarget", {"url": "about:blank"}, deadline=deadline)["targetId"]
        session = self.connection.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                       deadline=deadline)["sessionId"]
        return target, session

    def _leftovers(self) -> list[int]:
        """Pids of the processes that still run with this browser's HOME: crashpad's two handlers start
        their own sessions, so killing the process group misses them (they exit once the browser is gone)."""
        marker = f"\0HOME={Path(self._profile) / 'home'}\0".encode()
        found = []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if marker in b"\0" + (proc / "environ").read_bytes():
                    found.append(int(proc.name))
            except OSError:  # ended meanwhile, or another user's
                continue
        return found

    def _end_leftovers(self, grace: float = 3.0) -> None:
        """Kill, by pid, what still runs with this browser's HOME (crashpad's handlers would exit on
        their own, a moment after the browser) and wait until none is left (bounded), so nothing writes
        into the profile while or after it is removed."""
        for pid in self._leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while self._leftovers() and time.monotonic() < deadline:
            time.sleep(0.02)

    def close(self) -> None:
        """Kill Chromium's whole process group, close the pipes, remove the profile. Idempotent."""
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)  # the group start() made: Chromium and its children
            except ProcessLookupError:
                pass
            self._proc.wait()
            self._proc = None
            self._end_leftovers()
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self.connection = None
        if self._profile:
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = ""
