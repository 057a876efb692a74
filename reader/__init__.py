"""robowds reader: the shard format and manifest schema, and the training-time PyTorch reader."""

from __future__ import annotations

from typing import Any

__all__ = ["ShardDataset", "ShardLoader", "collate", "Collate"]


def __getattr__(name: str) -> Any:
    """Lazy: `export` imports `reader.format`/`reader.manifest` without pulling in torch."""
    if name == "ShardDataset":
        from reader.dataset import ShardDataset
        return ShardDataset
    if name == "ShardLoader":
        from reader.loader import ShardLoader
        return ShardLoader
    if name in ("collate", "Collate"):
        from reader import collation as module
        return getattr(module, name)
    raise AttributeError(name)
