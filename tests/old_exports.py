"""Exports as an older robowds wrote them, made from a current one (for the paths that must still
read them)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any


def without_episode_facts(src: Path, dst: Path) -> dict[str, Any]:
    """A copy of export `src` at `dst` as robowds wrote it before `episode-facts.msgpack` (no file, no
    `files.episode_facts`); returns its manifest."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_bytes())
    (dst / manifest["files"].pop("episode_facts")["path"]).unlink()
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return manifest
