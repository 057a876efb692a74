"""What `--quiet` and `--json` print ends with one newline, and nothing else goes to the terminal.

The bytes are captured at the file descriptors (`capfdbinary`), so output written below Python's
`sys.stdout` (a C library's banner or log line) counts too. Each command runs in-process (`main`),
on one small synthetic store, its export, and the vendored clip (whose labels.json has 3 segments
outside the video: `--skip-bad` skips them, and the summary says so on its second line).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store

from realdata import real_path

CLIP = "webm_vp9_real_clip_physicsworks"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("newlines")
    store = write_synthetic_store(root / "store", episodes=1, seed=0).root
    assert main(["export", str(store), str(root / "out"), "--quiet", "--workers", "1"]) == 0
    return store, root / "out"


def run(argv: list[str], capfdbinary: pytest.CaptureFixture[bytes]) -> bytes:
    """stdout of the command, checked: exit 0, nothing on stderr, one final newline."""
    capfdbinary.readouterr()  # what the fixtures printed
    assert main(argv) == 0
    out, err = capfdbinary.readouterr()
    assert err == b"", err
    assert out.endswith(b"\n") and not out.endswith(b"\n\n"), out[-200:]
    return out


def test_convert_quiet_summary_with_skipped_episodes_ends_with_a_newline(
        tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    out = run(["convert", "clips", str(real_path(CLIP)), str(tmp_path / "store"), "--skip-bad", "--quiet",
               "--workers", "1"], capfdbinary)
    first, second, last = out.split(b"\n")
    assert first == f"converted 1 episodes of labelled clips (labels.json) (5 fields) -> {tmp_path / 'store'}".encode()
    assert second.startswith(b"skipped 3 (all listed in convert_report.json): episode 'physicsworks_001': ")
    assert second.endswith(b"(551 frames), and holds no frame") and last == b""


def test_convert_json_ends_with_a_newline(tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    out = run(["convert", "clips", str(real_path(CLIP)), str(tmp_path / "store"), "--skip-bad", "--json",
               "--workers", "1"], capfdbinary)
    assert out.endswith(b"}\n") and len(json.loads(out)["skipped"]) == 3


@pytest.mark.parametrize("command", ["synth", "validate --quiet", "validate --json", "export --quiet", "export --json",
                                     "verify --quiet", "verify --json"])
def test_every_quiet_and_json_output_ends_with_a_newline(command: str, exported: tuple[Path, Path], tmp_path: Path,
                                                         capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    store, out = exported
    name, *flags = command.split()
    target = {"synth": [str(tmp_path / "new"), "--episodes", "1"], "validate": [str(store)],
              "export": [str(store), str(out), "--workers", "1"], "verify": [str(out)]}[name]
    text = run([name, *target, *flags], capfdbinary)
    if "--json" in flags:
        assert text.endswith(b"}\n") and isinstance(json.loads(text), dict)
    else:
        assert text.count(b"\n") >= 1 and b"\r" not in text  # lines, no progress bar redraws
