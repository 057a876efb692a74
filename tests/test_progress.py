"""Progress bars on a terminal and off one (issue 26, item 9): off a terminal (a log file, CI, `kubectl
logs`) tqdm's carriage-return redraws joined into lines of 14 KB; robowds' bars print plain lines."""

from __future__ import annotations

import io
import os
import select
import subprocess
import sys
from pathlib import Path

from robowds.export.cli.synth import write_synthetic_store
from robowds.export.progress import LOG_INTERVAL_S, progress_bar


def test_off_a_terminal_a_bar_is_a_few_plain_lines() -> None:
    """1,000 quick updates: the first state and the last, each its own line, no carriage return."""
    log = io.StringIO()
    with progress_bar(total=1000, desc="episodes", unit="ep", file=log) as bar:
        for _ in range(1000):
            bar.update(1)
    lines = log.getvalue().splitlines(keepends=True)
    assert "\r" not in log.getvalue() and all(line.endswith("\n") for line in lines)
    assert len(lines) == 2, lines  # all within LOG_INTERVAL_S: the start and the end
    assert lines[0].startswith("episodes:   0% 0/1000 [") and lines[-1].startswith("episodes: 100% 1000/1000 [")
    assert LOG_INTERVAL_S >= 1


def test_on_a_terminal_the_bar_redraws_in_place() -> None:
    """A real pseudo-terminal: tqdm's own bar, carriage returns and all."""
    leader, follower = os.openpty()
    with os.fdopen(follower, "w", encoding="utf-8") as tty:
        with progress_bar(total=3, desc="shards", unit="shard", file=tty) as bar:
            bar.update(3)
        tty.flush()
        written = b""
        while select.select([leader], [], [], 0.5)[0]:  # all that was written (a pty hands it in pieces)
            written += os.read(leader, 65536)
    os.close(leader)
    written = written.decode()
    assert "\r" in written and "shards: 100%|" in written


def test_an_export_logged_to_a_file_writes_short_lines(tmp_path: Path) -> None:
    """The CLI with stderr redirected to a file, as a job scheduler does it."""
    store = write_synthetic_store(tmp_path / "store", episodes=3).root
    log = tmp_path / "export.log"
    with open(log, "w") as err:
        done = subprocess.run([sys.executable, "-m", "robowds.export", str(store), str(tmp_path / "out"),
                               "--workers", "1"], stderr=err, stdout=subprocess.PIPE, timeout=120)
    assert done.returncode == 0
    text = log.read_text()
    assert "\r" not in text
    lines = text.splitlines()
    assert any(line.startswith("episodes: 100% 3/3 [") for line in lines), lines
    assert any(line.startswith("shards: 100% ") for line in lines), lines
    assert max(map(len, lines)) < 120
