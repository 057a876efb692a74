"""What `ShardDataset` and `Mixture` both take: the rank and world size (explicit, or from the process
group or torchrun), the per-sample augmentation generator, and checked batching arguments. One module,
so the two readers agree on each; no state, no I/O.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Callable

import numpy as np
import torch

from robowds.reader.remote_options import whole_number


def resolve_topology(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit arguments, else the initialised process group, else torchrun's environment, else 1 rank."""
    if (rank is None) != (world_size is None):
        raise ValueError("pass both rank and world_size, or neither (then torch.distributed or torchrun decide)")
    if rank is not None and world_size is not None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        return int(rank), int(world_size)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def sample_rng(seed: int, epoch: int, key: str) -> np.random.Generator:
    """The per-sample generator for augmentations: a function of (seed, epoch, key) only, so a resumed
    or re-sharded run augments every sample exactly as the uninterrupted run did."""
    digest = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    return np.random.default_rng([seed, epoch, digest])


def checked_batching(batch_size: int, drop_last: bool, collate_fn: Callable[[list[dict[str, Any]]], Any] | None
                     ) -> tuple[int, bool, Callable[[list[dict[str, Any]]], Any] | None]:
    """`set_batching`'s arguments, checked (ShardDataset's and Mixture's)."""
    if whole_number(batch_size) is None or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    return int(batch_size), bool(drop_last), collate_fn
