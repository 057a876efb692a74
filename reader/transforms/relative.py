"""`RelativeActions`: an action chunk as offsets from the state at the window's anchor time, and back.

Why: many policies predict actions relative to the current state (LeRobot's relative actions,
openpi's and GR00T's delta actions), which generalise across start poses. The difference itself is
one subtraction; what goes wrong is the rest: which state step is "now" (a state window with
history has it in the middle), normalising the offsets by the absolute action's statistics, padded
steps, and the inverse at inference. So the export computes the offsets' own statistics with the
option `stats: {relative: {<action>: <state>}}` and records what they are relative to; the
documented path is `RelativeActions.from_stats(ds.stats)`, which takes the state, dimensions and
anchor step from that record, so reader and export cannot disagree.

`action[t, dims[i]] - state[anchor, state_dims[i]]` for every step t; other dimensions stay
absolute, and padded action steps (`<action>_mask` False) keep their exported value, bit for bit.
The state value at the anchor is subtracted whatever its mask (the export's statistics skip windows
whose anchor state is padding; with `pad: edge` it is the nearest real state). The same operation
in the same dtype runs on numpy (one sample, in DataLoader workers) and torch (a collated batch on
any device), so both give the same bits. Cost: one gather and one subtraction per sample, O(T x D).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from robowds.reader.format import MASK_SUFFIX  # `<field>_mask` bool [T] (True = a real step)

RELATIVE_SUFFIX = ".relative"  # manifest["stats"][split]["<action>.relative"]: no field name has a dot
OPTION = "stats: {relative: {<action>: <state>}}"  # the export option that writes the entry


class RelativeActions:
    """`sample[action][:, dims] -= sample[state][anchor, state_dims]` on samples and batches, with its
    inverse. `dims=None`: every action dimension; `state_dims=None`: the same indices as `dims`.
    `anchor`: the state window's step at the anchor time (offset 0), which only the schema knows:
    build the transform with `RelativeActions.from_stats(ds.stats, action=...)` to take it (and the
    rest) from the export. Picklable; imports torch only when a tensor arrives."""

    def __init__(self, action: str = "action", state: str = "observation_state",
                 dims: Sequence[int] | None = None, state_dims: Sequence[int] | None = None,
                 anchor: int | None = None) -> None:
        if anchor is None:
            raise ValueError("RelativeActions: anchor (the state window's step at the anchor time) is needed: build "
                             "it from the export's statistics, RelativeActions.from_stats(ds.stats, "
                             f"action={action!r}), or pass anchor=0 for a state window without history")
        if not isinstance(anchor, (int, np.integer)) or isinstance(anchor, bool) or anchor < 0:
            raise ValueError(f"RelativeActions: anchor must be a step index >= 0, got {anchor!r}")
        if state_dims is not None and dims is None:
            raise ValueError("RelativeActions: state_dims without dims; name the action dimensions too")
        self.action, self.state, self.anchor = action, state, int(anchor)
        self.dims = None if dims is None else _indices("dims", dims)
        self.state_dims = self.dims if state_dims is None else _indices("state_dims", state_dims)
        if self.dims is not None and len(self.dims) != len(self.state_dims):
            raise ValueError(f"RelativeActions: dims {list(self.dims)} and state_dims {list(self.state_dims)} differ "
                             "in length; each action dimension needs the state dimension it is taken against")

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any], action: str = "action") -> "RelativeActions":
        """The transform the export computed statistics for: `stats` is one split's statistics
        (`manifest["stats"][split]`, `ds.stats`), whose `<action>.relative` entry records the state,
        dimensions and anchor step (`relative_to`)."""
        relative_to = _entry(stats, action).get("relative_to")
        if not isinstance(relative_to, Mapping):
            raise ValueError(f"RelativeActions: statistics {action + RELATIVE_SUFFIX!r} have no 'relative_to' record; "
                             "pass the statistics of an export made with the option " + OPTION)
        return cls(action=action, state=relative_to["state"], dims=relative_to["dims"],
                   state_dims=relative_to["state_dims"], anchor=relative_to["anchor"])

    def __repr__(self) -> str:
        return (f"RelativeActions(action={self.action!r}, state={self.state!r}, dims={self._list(self.dims)}, "
                f"state_dims={self._list(self.state_dims)}, anchor={self.anchor})")

    @staticmethod
    def _list(dims: tuple[int, ...] | None) -> list[int] | None:
        return None if dims is None else list(dims)

    def stats(self, stats: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of `stats` whose action entry is the relative one, so `Normalize(rel.stats(ds.stats))`
        normalises the relative actions by their own statistics. Refused when the export recorded a
        different relative action (statistics of other offsets would normalise silently wrong)."""
        entry = _entry(stats, self.action)
        recorded = entry.get("relative_to") or {}
        width = len(entry.get("mean", ()))
        mine = {"state": self.state, "dims": list(self.dims if self.dims is not None else range(width)),
                "state_dims": list(self.state_dims if self.state_dims is not None else range(width)),
                "anchor": self.anchor}
        theirs = {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in recorded.items()}
        if theirs != mine:
            raise ValueError(f"RelativeActions: the statistics {self.action + RELATIVE_SUFFIX!r} are relative to "
                             f"{theirs}, this transform to {mine}; build it with RelativeActions.from_stats(stats, "
                             f"action={self.action!r})")
        return {**stats, self.action: entry}

    # -- numpy: one sample, in a DataLoader worker ------------------------------------------------
    def __call__(self, sample: dict[str, Any], rng: np.random.Generator | None = None) -> dict[str, Any]:
        """A new sample dict whose action is relative (a new array: the input, possibly a read-only
        view of a mapped shard, is not written). `rng` is unused (the protocol's)."""
        action, state = self._fields(sample)
        out = dict(sample)
        out[self.action] = self._numpy(action, state, sample.get(self.action + MASK_SUFFIX), -1)
        return out

    def _numpy(self, action: Any, state: Any, mask: Any, sign: int) -> np.ndarray:
        """action [..., T, D] +/- state [..., S_T, S][..., anchor, state_dims], padded steps as they are."""
        action, state = np.asarray(action), np.asarray(state)
        dims, state_dims = self._dims(action.shape[-1]), self._dims(state.shape[-1], state=True)
        self._check(action.shape, state.shape, dims, state_dims)
        anchor = state[..., self.anchor, :][..., list(state_dims)][..., None, :]  # [..., 1, k]
        part = action[..., list(dims)]  # [..., T, k] (a copy)
        moved = (part - anchor if sign < 0 else part + anchor).astype(action.dtype)
        if mask is not None:
            moved = np.where(np.asarray(mask)[..., None], moved, part)  # padded steps: the exported value
        out = action.copy()
        out[..., list(dims)] = moved
        return out

    # -- torch: a collated batch on any device -----------------------------------------------------
    def batch(self, batch: dict[str, Any], generator: Any = None) -> dict[str, Any]:
        """A new batch dict with the action ([B, T, D] tensor on any device; state [B, S_T, S]; mask
        `<action>_mask` [B, T]) made relative by the same operations as `__call__`: the same numbers.
        numpy values go through the numpy path. `generator` is unused (the protocol's)."""
        action, state = self._fields(batch)
        out = dict(batch)
        out[self.action] = self._apply(action, state, batch.get(self.action + MASK_SUFFIX), -1)
        return out

    def inverse(self, actions: Any, state: Any, mask: Any = None) -> Any:
        """Absolute actions from relative ones ([T, D] or [B, T, D], numpy or torch) and the state
        window they were taken against ([S_T, S] or [B, S_T, S]): e.g. a policy's predicted chunk at
        inference. `mask` ([T] / [B, T], optional): steps where it is False are left as they are, as
        the forward transform left them. `(a - s) + s` is `a` exactly when the subtraction was exact
        (Sterbenz: a and s of one sign within a factor of two, the usual case for a target near the
        current pose), else within one rounding of max(|a|, |s|) in the arrays' dtype."""
        return self._apply(actions, state, mask, +1)

    def _apply(self, action: Any, state: Any, mask: Any, sign: int) -> Any:
        if isinstance(action, np.ndarray) or not hasattr(action, "device"):
            return self._numpy(action, state, mask, sign)
        import torch

        dims, state_dims = self._dims(action.shape[-1]), self._dims(state.shape[-1], state=True)
        self._check(tuple(action.shape), tuple(state.shape), dims, state_dims)
        index = torch.as_tensor(dims, device=action.device)
        anchor = state[..., self.anchor, :][..., torch.as_tensor(state_dims, device=state.device)]  # [..., k]
        anchor = anchor.to(action.device)[..., None, :]  # [..., 1, k]
        part = action[..., index]  # [..., T, k]
        moved = (part - anchor if sign < 0 else part + anchor).to(action.dtype)
        if mask is not None:
            moved = torch.where(mask.to(action.device)[..., None], moved, part)
        out = action.clone()
        out[..., index] = moved
        return out

    # -- checks -------------------------------------------------------------------------------------
    def _fields(self, data: Mapping[str, Any]) -> tuple[Any, Any]:
        missing = [f for f in (self.action, self.state) if f not in data]
        if missing:
            raise ValueError(f"RelativeActions: field(s) {missing} are not in the sample (it has "
                             f"{sorted(k for k in data if not k.startswith('__'))}); decode them (ShardDataset "
                             "fields=) or name the right fields")
        return data[self.action], data[self.state]

    def _dims(self, width: int, state: bool = False) -> tuple[int, ...]:
        dims = self.state_dims if state else self.dims
        return tuple(range(width)) if dims is None else dims

    def _check(self, action_shape: tuple[int, ...], state_shape: tuple[int, ...], dims: tuple[int, ...],
               state_dims: tuple[int, ...]) -> None:
        if len(action_shape) < 2 or len(state_shape) < 2:
            raise ValueError(f"RelativeActions: {self.action!r} {list(action_shape)} and {self.state!r} "
                             f"{list(state_shape)} must be windows [T, D] (or batches [B, T, D])")
        if self.dims is None and action_shape[-1] != state_shape[-1]:
            raise ValueError(f"RelativeActions: {self.action!r} has {action_shape[-1]} dimensions and {self.state!r} "
                             f"{state_shape[-1]}; name the dimensions that correspond with dims= / state_dims=")
        for name, shape, listed in ((self.action, action_shape, dims), (self.state, state_shape, state_dims)):
            if max(listed, default=-1) >= shape[-1]:
                raise ValueError(f"RelativeActions: dimension {max(listed)} of {name!r} does not exist (it has "
                                 f"{shape[-1]})")
        if self.anchor >= state_shape[-2]:
            raise ValueError(f"RelativeActions: anchor step {self.anchor} is outside {self.state!r}'s window of "
                             f"{state_shape[-2]} steps; build the transform with RelativeActions.from_stats")


def _indices(name: str, dims: Sequence[int]) -> tuple[int, ...]:
    out = tuple(int(d) for d in dims)
    if not out or any(d < 0 for d in out) or len(set(out)) != len(out):
        raise ValueError(f"RelativeActions: {name} must be distinct dimension indices >= 0, got {list(dims)}")
    return out


def _entry(stats: Mapping[str, Any], action: str) -> Mapping[str, Any]:
    """The `<action>.relative` statistics entry, or an error naming the export option."""
    key = action + RELATIVE_SUFFIX
    entry = stats.get(key) if isinstance(stats, Mapping) else None
    if not isinstance(entry, Mapping):
        have = sorted(k for k in stats if k.endswith(RELATIVE_SUFFIX)) if isinstance(stats, Mapping) else []
        raise ValueError(f"RelativeActions: the statistics have no entry {key!r} (relative entries: "
                         f"{', '.join(have) or 'none'}); export with the option "
                         f"stats: {{relative: {{{action}: <state field>}}}} (docs/export-config.md)")
    return entry
