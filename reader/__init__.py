"""robowds reader: the shard format and manifest schema, and the training-time PyTorch reader."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ShardDataset", "ShardIndex", "ShardLoader", "Mixture", "collate", "Collate", "RetryPolicy", "Remote",
           "wds_decoder", "wids_transform", "decode_members", "hf_transform"]

# public name -> the submodule that defines it. Imported on first access (PEP 562), because `export`
# imports `robowds.reader.format` / `robowds.reader.manifest` and must not pull in torch. No submodule may be named
# like a public name: the import system binds a submodule as an attribute of the package when it is
# imported, which would shadow the public name (reader/collate.py did, until it became collation.py).
_LAZY = {"ShardDataset": "robowds.reader.dataset", "ShardIndex": "robowds.reader.index",
         "ShardLoader": "robowds.reader.loader",
         "Mixture": "robowds.reader.mixture", "collate": "robowds.reader.collation",
         "Collate": "robowds.reader.collation", "RetryPolicy": "robowds.reader.remote",
         "Remote": "robowds.reader.remote_options",
         "wds_decoder": "robowds.reader.interop", "wids_transform": "robowds.reader.interop",
         "decode_members": "robowds.reader.interop", "hf_transform": "robowds.reader.interop"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'reader' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later accesses skip this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
