"""CLI conventions (issue 13, item 8): --version, help for every option, no traceback on a closed pipe,
--json results a pipeline can parse, progress that moves during `verify --store`, --quiet."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from robowds.export import __version__
from robowds.export.cli.main import COMMANDS, build_parser, main
from robowds.export.cli.synth import write_synthetic_store

ROBOWDS = [str(Path(sys.executable).parent / "robowds")]  # the installed console script


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ROBOWDS, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cli")
    write_synthetic_store(root / "store", episodes=3, seed=0)
    assert main(["export", str(root / "store"), str(root / "out"), "--quiet", "--workers", "1"]) == 0
    return root / "store", root / "out"


def test_version() -> None:
    done = _run("--version")
    assert (done.returncode, done.stdout) == (0, f"robowds {__version__}\n")


def test_every_option_of_every_command_has_help() -> None:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(sub.choices) == ["convert", "synth", "validate", "export", "verify", "inspect", "report", "demo"]
    assert len(COMMANDS) == len(sub.choices)
    for name in sub.choices:
        assert name in parser.description
    missing = [f"{name} {action.dest}" for name, command in _commands(parser) for action in command._actions
               if not (action.help and action.help.strip())]
    assert not missing, missing
    assert {name for name, _ in _commands(parser)} >= {"convert lerobot", "convert hdf5", "convert rlds",
                                                       "convert rosbag", "convert clips"}


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    """(name, parser) of every sub-command, nested ones (`convert lerobot`) included."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                out += [(prefix + name, child), *_commands(child, prefix + name + " ")]
    return out


def test_help_shows_defaults_that_say_something() -> None:
    text = " ".join(_run("verify", "--help").stdout.split())  # unwrapped
    assert "(default: 32)" in text and "(default: 0)" in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_a_closed_pipe_is_no_traceback(exported: tuple[Path, Path]) -> None:
    """`robowds validate STORE -v | head -2`: the reader goes away before robowds writes. The read
    end is closed before the command prints anything, so the write fails for certain (a `head` racing
    a short output into the pipe buffer would not)."""
    store, _ = exported
    proc = subprocess.Popen([*ROBOWDS, "validate", str(store), "-v"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_validate_json(exported: tuple[Path, Path]) -> None:
    store, _ = exported
    done = _run("validate", str(store), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert set(doc) == {"store", "exportable", "episodes", "fields", "durations_s", "problems", "errors", "warnings"}
    assert (doc["exportable"], doc["episodes"], doc["errors"]) == (True, 3, 0)
    assert doc["fields"]["joints"]["kind"] == "timeseries" and len(doc["fields"]["joints"]["rate_hz"]) == 3
    assert doc["fields"]["joints"]["rate_hz"]["ep_0000"] == pytest.approx(50.0, rel=1e-3)
    assert len(doc["durations_s"]) == 3


def test_validate_json_of_a_broken_store_exits_1_with_the_problems(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_synthetic_store(store, episodes=2, seed=0)
    (store / "store.yaml").write_text("fields: [1, 2]\n")
    done = _run("validate", str(store), "--json")
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert doc["exportable"] is False and doc["errors"] >= 1
    assert any(p["severity"] == "error" and "store.yaml" in p["message"] for p in doc["problems"]), doc["problems"]


def test_export_and_verify_json(exported: tuple[Path, Path], tmp_path: Path) -> None:
    store, out = exported
    done = _run("export", str(store), str(tmp_path / "out"), "--json", "--workers", "1")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert set(doc) == {"out", "up_to_date", "episodes", "rejected", "windows", "dropped_min_valid", "shards",
                        "bytes", "seconds", "splits", "warnings"}
    assert (doc["episodes"], doc["rejected"], doc["up_to_date"]) == (3, 0, False)
    assert doc["splits"] == manifest["report"]["splits"] == {"train": {"episodes": 3, "windows": doc["windows"]}}
    assert doc["windows"] == sum(s["samples"] for s in manifest["splits"].values())
    assert doc["shards"] == sum(len(s["shards"]) for s in manifest["splits"].values())
    assert done.stderr == ""  # --json turns the progress bars off
    again = json.loads(_run("export", str(store), str(tmp_path / "out"), "--json").stdout)
    assert again["up_to_date"] is True and (again["windows"], again["splits"]) == (doc["windows"], doc["splits"])

    done = _run("verify", str(out), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result == {"ok": True, "shards": doc["shards"], "samples": doc["windows"], "recomputed": 0,
                      "failures": []}


def test_verify_store_progress_moves_and_quiet_silences_it(exported: tuple[Path, Path]) -> None:
    store, out = exported
    done = _run("verify", str(out), "--store", str(store), "--check-windows", "8")
    assert done.returncode == 0, done.stderr
    assert "recompute" in done.stderr and "8/8" in done.stderr, done.stderr
    quiet = _run("verify", str(out), "--store", str(store), "--check-windows", "8", "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert quiet.stdout == done.stdout


@pytest.mark.parametrize("command", ["convert lerobot", "convert hdf5", "convert rlds", "convert rosbag",
                                     "convert clips", "validate", "export", "verify", "demo"])
def test_every_long_command_has_quiet(command: str) -> None:
    commands = dict(_commands(build_parser()))
    assert "--quiet" in {s for a in commands[command]._actions for s in a.option_strings}
