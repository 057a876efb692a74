"""`Remote`: how a `ShardDataset` reads an export at a URL, as one value.

The five options below only matter for remote sources (fsspec URLs), and they travel together:
a training config names one `Remote(...)` per store rather than five keywords on every dataset, and
`ShardDataset`'s constructor keeps to what decides *which* samples are read (split, order, topology,
fields). The defaults are those the reader always had, so `Remote()` (the default) changes nothing.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from robowds.reader.fetch import MAX_REQUEST_BYTES
from robowds.reader.remote import RetryPolicy


def whole_number(value: Any) -> int | None:
    """`value` as an int if it is an integer (numpy's too, not a bool or a float), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


@dataclass(frozen=True)
class Remote:
    """Remote-read options of a `ShardDataset` (ignored for a local export, except `storage_options`
    for a manifest read through fsspec).

    `storage_options`: keyword arguments for the fsspec filesystem (s3fs: key, secret, endpoint...).
    `retry`: attempts and backoff of each ranged read (`reader/remote.py`).
    `max_request_bytes`: bound of one coalesced ranged GET (`reader/fetch.py`); 0: one request per sample.
    `cache_dir`: a node-local folder holding whole downloaded shards (`reader/shard_cache.py`), shared by
    every process of the node; None: no cache. `cache_limit_bytes`: LRU-evicted above it (None: no limit).
    """

    storage_options: Mapping[str, Any] | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_request_bytes: int = MAX_REQUEST_BYTES
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit_bytes: int | None = None

    def __post_init__(self) -> None:
        """One ValueError naming the field, at construction (not at the first read in a worker)."""
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise ValueError(f"Remote.storage_options must be a dict or None, got {type(self.storage_options).__name__}")
        if not isinstance(self.retry, RetryPolicy):
            raise ValueError(f"Remote.retry must be a RetryPolicy, got {type(self.retry).__name__}")
        if whole_number(self.max_request_bytes) is None or self.max_request_bytes < 0:
            raise ValueError("Remote.max_request_bytes must be >= 0 (an int; 0: one request per sample), "
                             f"got {self.max_request_bytes!r}")
        object.__setattr__(self, "max_request_bytes", int(self.max_request_bytes))  # numpy ints too
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise ValueError(f"Remote.cache_dir must be a path or None, got {type(self.cache_dir).__name__}")
        if self.cache_limit_bytes is not None and (whole_number(self.cache_limit_bytes) is None
                                                   or self.cache_limit_bytes < 0):
            raise ValueError(f"Remote.cache_limit_bytes must be >= 0 or None (an int), got {self.cache_limit_bytes!r}")
        if self.cache_limit_bytes is not None and self.cache_dir is None:
            raise ValueError("Remote.cache_limit_bytes needs cache_dir (the folder it bounds)")

    @property
    def options(self) -> dict[str, Any] | None:
        """`storage_options` as the plain dict fsspec takes (None stays None)."""
        return None if self.storage_options is None else dict(self.storage_options)
