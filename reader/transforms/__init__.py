"""Transforms from window to training batch: normalisation by the manifest's statistics, relative
actions, camera augmentation and tokenisation (issue 24).

Every transform is a small picklable object with one protocol:

- `t(sample, rng) -> sample`: one decoded sample (numpy arrays), with the sample's generator
  (`ShardDataset(transform=t)` passes the one seeded by (seed, epoch, key), so a resumed or re-sharded
  run draws exactly what the uninterrupted run drew). Runs in DataLoader workers.
- `t.batch(batch, generator=None) -> batch`: a collated batch of torch tensors on any device (e.g. the
  GPU after the batch lands), one draw per window from `generator`.

Importing this package costs nothing: each name loads its module on first use (PEP 562), and none of
them imports torch until a batch method runs.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Normalize", "RelativeActions", "RandomResizedCrop", "RandomShift", "Resize", "ColorJitter",
           "RandomChoice", "Compose", "Tokenize"]

# public name -> the module that defines it (no module is named like a public name: see reader/__init__.py)
_LAZY = {"Normalize": "normalize", "RelativeActions": "relative",
         "RandomResizedCrop": "geometry", "RandomShift": "geometry", "Resize": "geometry",
         "ColorJitter": "color", "RandomChoice": "compose", "Compose": "compose", "Tokenize": "tokenize"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'robowds.reader.transforms' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later accesses skip this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
