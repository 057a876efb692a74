"""Export memory does not grow with episode length, measured from outside: the kernel's peak RSS of a
real `python -m robowds.export` process (the CLI), not the exporter's own `frames_held_max` counter.

Why the kernel's figure through a launcher: `wait4` gives a child's exact peak RSS (no sampling to miss
a spike), but a child forked from this test process starts its count with this process's RSS (the
pages it shared before exec), and pytest with numpy frames in hand is hundreds of MiB. A small
launcher interpreter forks the export instead, so the figure is the export's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from videos import camera_store, gradient_frames, write_frames

WIDTH, HEIGHT, FPS = 256, 192, 30  # source frames: 147,456 bytes each decoded as rgb24
FRAME_BYTES = WIDTH * HEIGHT * 3
SHORT_S, LONG_S = 20, 80  # episode lengths L and 4L
MIB = 2**20
# the launcher: runs the export as its child and prints its exit status and ru_maxrss (KiB on Linux);
# wait4's figure covers the child and the descendants it reaped (one process here: --workers 1)
LAUNCH = ("import os, subprocess, sys; p = subprocess.Popen(sys.argv[1:]); _, status, usage = os.wait4(p.pid, 0); "
          "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)")


def _store(root: Path, seconds: int) -> Path:
    """One episode: a `seconds` long 30 fps video of known frames (mpeg4 in mp4, decoded by PyAV)."""
    write_frames(root / "media" / "cam.mp4", gradient_frames(FPS * seconds, WIDTH, HEIGHT), rate=FPS, codec="mpeg4")
    return camera_store(root, {"ep0": "media/cam.mp4"}, fps=float(FPS))


def _export_peak_rss(store: Path, out: Path, *sets: str) -> tuple[int, dict]:
    """(peak RSS bytes of the export process, its manifest). Windows of 3 consecutive frames (0.1 s at
    30 Hz) every 0.1 s: every frame of the video is used by exactly one window, and so decoded,
    converted at full size and held for some time."""
    cmd = [sys.executable, "-m", "robowds.export", str(store), str(out), "--quiet", "--workers", "1", "--fps", "10",
           "--set", f"streams.cam.rate_hz={FPS}", "--set", "streams.cam.duration_s=0.1",
           "--set", "streams.cam.encoding=jpg"]
    for item in sets:
        cmd += ["--set", item]
    done = subprocess.run([sys.executable, "-c", LAUNCH, *cmd], env=dict(os.environ),
                          capture_output=True, text=True, check=True)
    status, kib = map(int, done.stdout.split()[-2:])
    assert status == 0, done.stderr
    return kib * 1024, json.loads((out / "manifest.json").read_text())


@pytest.mark.slow
def test_peak_rss_does_not_grow_with_episode_length(tmp_path: Path) -> None:
    """A 4x longer episode (2400 instead of 600 frames) exports in the same peak RSS.

    Holding the long episode's decoded frames would cost 2400 x 147 KB = 338 MiB (the 1800 extra
    frames alone 253 MiB); the bound on the growth is 16 MiB. Measured on the 2-core development
    machine: 201.5 MiB for L, 201.7 MiB for 4L (+0.3 MiB)."""
    short_rss, short = _export_peak_rss(_store(tmp_path / "short", SHORT_S), tmp_path / "short_out")
    long_store = _store(tmp_path / "long", LONG_S)
    long_rss, long = _export_peak_rss(long_store, tmp_path / "long_out")
    assert (short["report"]["windows"]["emitted"], long["report"]["windows"]["emitted"]) == (200, 800)
    would_hold = FPS * LONG_S * FRAME_BYTES  # every decoded frame of the long episode
    print(f"peak RSS: L {short_rss / MIB:.1f} MiB, 4L {long_rss / MIB:.1f} MiB "
          f"(holding 4L's frames: {would_hold / MIB:.0f} MiB)")
    assert would_hold > 300 * MIB  # holding them would be unmistakable
    assert long_rss - short_rss < 16 * MIB, (short_rss, long_rss)

    # frames held: the counter is the same for both lengths, and the external figure backs it: the same
    # long export with frames stored at 16x12 (held frames of ~0.6 KB) peaks lower by at least the
    # counted frames' bytes, and by no more than a chunk's frames held three times (the held frames,
    # the chunk's stacked [W, n, H, W, 3] array and its copy of the kept windows)
    held = long["report"]["video"]["cam"]["frames_held_max"]
    assert held == short["report"]["video"]["cam"]["frames_held_max"]
    assert held <= 64 * 3 + 3  # one chunk of 64 windows of 3 frames, plus one window
    tiny_rss, tiny = _export_peak_rss(long_store, tmp_path / "tiny_out", "streams.cam.resize=[16,12]")
    assert tiny["report"]["video"]["cam"]["frames_held_max"] == held
    print(f"frames held {held} ({held * FRAME_BYTES / MIB:.1f} MiB); peak RSS at 16x12 {tiny_rss / MIB:.1f} MiB")
    assert held * FRAME_BYTES <= long_rss - tiny_rss <= 4 * held * FRAME_BYTES, (held, long_rss, tiny_rss)
