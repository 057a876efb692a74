"""Progress bars that suit where they are written: every robowds command's bars come from `progress_bar`.

Why: tqdm redraws a bar with carriage returns. On a terminal that is one line updating in place; in a
log file, a CI console or `kubectl logs` (stderr not a terminal) every redraw lands on the same line:
at 5k episodes an export wrote two lines of 14 KB each. Off a terminal a bar here prints one plain
line (no bar glyphs, no carriage return) at most every `LOG_INTERVAL_S` seconds, the first when it
starts and the last when it ends, so a log shows the job moving and how it ended, in a few lines.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, TextIO

from tqdm import tqdm

LOG_INTERVAL_S = 5.0  # off a terminal: seconds between two lines of one bar
LOG_FORMAT = "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]"


class _Lines:
    """A stream for tqdm that writes each redraw as one line, and a redraw equal to the last one
    (tqdm redraws the final state when the bar closes) not at all."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._last = ""

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line and line != self._last:
            self._stream.write(line + "\n")
            self._last = line

    def flush(self) -> None:
        self._stream.flush()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_bar(iterable: Iterable[Any] | None = None, *, total: int | None = None, desc: str, unit: str,
                 disable: bool = False, file: TextIO | None = None) -> tqdm:
    """A tqdm bar on `file` (stderr by default, looked up at the call so a redirected stderr counts):
    tqdm's own on a terminal, plain lines every `LOG_INTERVAL_S` seconds elsewhere."""
    stream = sys.stderr if file is None else file
    if disable or _is_terminal(stream):
        return tqdm(iterable, total=total, desc=desc, unit=unit, disable=disable, file=stream)
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=_Lines(stream), bar_format=LOG_FORMAT,
                mininterval=LOG_INTERVAL_S, maxinterval=max(LOG_INTERVAL_S, 10.0))
