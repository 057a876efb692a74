"""Shared test set-up: a synthetic store exported with given options (real files, real export job)."""

from __future__ import annotations

from pathlib import Path

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store


def export_synthetic(root: Path, episodes: int, seed: int, *options: str) -> Path:
    """Write a synthetic store under `root` and export it in-process; returns the output folder."""
    write_synthetic_store(root / "store", episodes=episodes, seed=seed)
    assert main(["export", str(root / "store"), str(root / "out"), "--quiet", "--workers", "1", *options]) == 0
    return root / "out"
