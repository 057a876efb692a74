"""Per-episode facts the report shows (duration, rejection reason, warnings, and per field the
source rate, gaps and masked steps), kept as columns: what `robowds report` reads instead of the
shards.

Scale: O(episodes x fields) numbers, ~8 bytes each plus the ids and the (rare) warning texts:
~2 MB at 20k episodes x 10 fields.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EpisodeFacts:
    """Columns in episode-id order, one row per episode the export considered (exported or rejected);
    `fields` are the exported time-series and video fields, in schema order."""

    episode_id: list[str]  # [E]
    split: list[str]  # [E]
    exported: np.ndarray  # [E] bool: False = rejected
    windows: np.ndarray  # [E] int64, windows emitted (0 when rejected)
    duration_s: np.ndarray  # [E] float64 extent of the episode; NaN when it could not be loaded
    reason: list[str | None]  # [E] why it was rejected ("field: message"), None when exported
    warnings: list[list[str]]  # [E] e.g. repairs of its timestamps, a stream it lacks, a camera fps mismatch
    fields: list[str]  # [F]
    rate_hz: np.ndarray  # [E, F] float64 median source rate (1 / median period); NaN: stream missing or rejected
    gaps: np.ndarray  # [E, F] int64 source intervals longer than the field's max gap
    missing: np.ndarray  # [E, F] bool: the episode lacks the stream (its steps are all padding)
    masked_steps: np.ndarray  # [E, F] int64 padded steps over the episode's windows
    steps: np.ndarray  # [E, F] int64 steps over the episode's windows
