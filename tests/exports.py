"""Shared test set-up: a synthetic store exported with given options (real files, real export job)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store


def export_synthetic(root: Path, episodes: int, seed: int, *options: str) -> Path:
    """Write a synthetic store under `root` and export it in-process; returns the output folder."""
    write_synthetic_store(root / "store", episodes=episodes, seed=seed)
    assert main(["export", str(root / "store"), str(root / "out"), "--quiet", "--workers", "1", *options]) == 0
    return root / "out"


def export_members(out: Path) -> dict[str, dict[str, bytes]]:
    """Every sample of every split of an export: key -> member suffix -> bytes, read with the format's
    own tar walk (no decoding, so tests compare exact bytes)."""
    import json

    from robowds.reader.format import group_samples, iter_members

    manifest = json.loads((out / "manifest.json").read_text())
    found = {}
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            data = (out / shard["path"]).read_bytes()
            found.update({k: {n: bytes(v) for n, v in m.items()} for k, _, m in group_samples(iter_members(data))})
    return found


def npy(blob: bytes) -> np.ndarray:
    """A `.npy` member's array (never unpickled)."""
    import io

    return np.load(io.BytesIO(blob), allow_pickle=False)
