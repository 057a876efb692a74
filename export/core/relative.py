"""Relative actions: an action chunk expressed against the state at the window's anchor time. Pure numpy.

Why: policies that predict actions as offsets from the current state (LeRobot's relative actions,
GR00T's and openpi's delta actions) normalise them by statistics of those offsets, which differ
from the absolute action's (a joint target near 1.5 rad moves by a few hundredths per step). The
export computes them over exactly the steps the absolute statistics count, from the same float64
values, so they are exact and mergeable like every other entry (`export/core/stats.py`); the reader
transform `robowds.reader.transforms.RelativeActions` applies the same difference to each sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from robowds.export.core.stats import FieldStats, StatsError
from robowds.export.core.windows import StreamWindow
from robowds.export.errors import EpisodeError


@dataclass(frozen=True)
class RelativeSpec:
    """`action[t, dims[i]] - state[anchor, state_dims[i]]` for every step t of the action window."""

    action: str
    state: str
    dims: tuple[int, ...]  # action dimensions taken relative (the others stay absolute)
    state_dims: tuple[int, ...]  # the state dimension each of `dims` is taken against
    anchor: int  # the state window's step at the anchor time (offset 0)
    key: str  # the statistics entry's name, `<action>.relative` (the reader's RELATIVE_SUFFIX: job/stats_config.py)

    def relative_to(self) -> dict[str, Any]:
        """What the manifest records with the entry, so a reader applies the same difference."""
        return {"state": self.state, "dims": list(self.dims), "state_dims": list(self.state_dims),
                "anchor": self.anchor}


def anchor_step(window: StreamWindow) -> int | None:
    """The step j of `window` sampled at the anchor time (`offset_s + j / rate_hz == 0`), or None when
    no step is. Offsets within 1e-4 s of whole steps were already snapped to `k / rate_hz` exactly
    (`snap_to_step`), so the sum is 0 there; 1 ns of slack covers the division's rounding."""
    j = round(-window.offset_s * window.rate_hz)
    if 0 <= j < window.steps and abs(window.offset_s + j / window.rate_hz) <= 1e-9:
        return int(j)
    return None


def relative_steps(spec: RelativeSpec, action: np.ndarray, action_mask: np.ndarray, state: np.ndarray,
                   state_mask: np.ndarray) -> np.ndarray:
    """The relative action at every valid step of a chunk of windows, as float64 [M, N].

    action [W, n, N], action_mask [W, n], state [W, m, S], state_mask [W, m]. A step counts when the
    action step is real and so is the state at the anchor (a padded anchor would subtract padding).
    Dimensions outside `spec.dims` are the absolute action's values, so the result has the action's
    full width and normalises the transform's output as it is."""
    out = action.astype(np.float64)  # [W, n, N], a copy
    anchor = state[:, spec.anchor, list(spec.state_dims)].astype(np.float64)  # [W, k]
    out[:, :, list(spec.dims)] -= anchor[:, None, :]
    valid = action_mask & state_mask[:, spec.anchor][:, None]  # [W, n]
    return out[valid]  # [M, N]


def relative_stats(episode_id: str, specs: tuple[RelativeSpec, ...],
                   resampled: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, FieldStats | None]:
    """Each entry's statistics over one chunk of windows, from the same float64 values (before
    padding and the output cast) and valid steps as the fields' own: `resampled` is field ->
    (values [W, n, N], mask [W, n]). An episode that did not record the action or the state has no
    valid step of it: nothing to count."""
    out: dict[str, FieldStats | None] = {}
    for spec in specs:
        if spec.action not in resampled or spec.state not in resampled:
            continue
        (action, action_mask), (state, state_mask) = resampled[spec.action], resampled[spec.state]
        for name, width, dims in ((spec.action, action.shape[2], spec.dims), (spec.state, state.shape[2],
                                                                                spec.state_dims)):
            if max(dims) >= width:
                raise EpisodeError(episode_id, name, f"has {width} dimensions in this episode, but "
                                   f"stats.relative.{spec.action} takes its dimension {max(dims)}",
                                   hint="record every episode of a field with the same width, or change the dims")
        try:
            out[spec.key] = FieldStats.of(relative_steps(spec, action, action_mask, state, state_mask))
        except StatsError as exc:
            raise EpisodeError(episode_id, spec.action, f"relative to {spec.state!r}: {exc}",
                               hint="scale the stream's values in the store, or leave it out with exclude") from exc
    return out
