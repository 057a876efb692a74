"""`Compose` (transforms in order) and `RandomChoice` (one of them, drawn per sample / per batch element),
generic over any transform of the package protocol: `t(sample, rng) -> sample` in workers and
`t.batch(batch, generator=None) -> batch` on collated torch batches."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from robowds.reader.transforms._images import numpy_rng


def _checked(transforms: Sequence[Callable[..., Any]], name: str) -> list[Callable[..., Any]]:
    items = list(transforms)
    if not items or not all(callable(t) for t in items):
        raise ValueError(f"{name} takes a non-empty list of transforms (callables t(sample, rng)), got {transforms!r}")
    return items


def _batch_method(t: Any) -> Callable[..., Any]:
    method = getattr(t, "batch", None)
    if method is None:
        raise TypeError(f"{t!r} has no batch(batch, generator) method: it runs only on samples in workers "
                        f"(use it in ShardDataset(transform=...))")
    return method


class Compose:
    """The transforms one after another, each given the same generator (so they draw in turn from
    the sample's stream, or from `generator` in `batch`)."""

    def __init__(self, transforms: Sequence[Callable[..., Any]]) -> None:
        self.transforms = _checked(transforms, "Compose")

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        for t in self.transforms:
            sample = t(sample, rng)
        return sample

    def batch(self, batch: dict[str, Any], generator: Any = None) -> dict[str, Any]:
        for t in self.transforms:
            batch = _batch_method(t)(batch, generator)
        return batch

    def __repr__(self) -> str:
        return f"Compose({self.transforms!r})"


def _take(value: Any, index: Any, count: int) -> Any:
    """Rows `index` of a batch value: a tensor [B, ...], a list of B items, or a dict of such (what
    torch's default_collate makes of a dict field)."""
    import torch

    if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == count:
        return value[index.to(value.device)]
    if isinstance(value, (list, tuple)) and len(value) == count:
        return [value[i] for i in index.tolist()]
    if isinstance(value, dict):
        return {k: _take(v, index, count) for k, v in value.items()}
    raise TypeError(f"RandomChoice.batch needs every batch value to be a tensor [B, ...], a list of B items "
                    f"or a dict of them (B = {count}), got {type(value).__name__}")


class RandomChoice:
    """One of `transforms`, with probabilities `p` (default uniform): drawn from the sample's `rng`
    in workers, and once per batch element from `generator` in `batch` (each transform then runs on
    the elements that drew it; their outputs must agree in fields and shapes, e.g. end every choice
    with the same Resize)."""

    def __init__(self, transforms: Sequence[Callable[..., Any]], p: Sequence[float] | None = None) -> None:
        self.transforms = _checked(transforms, "RandomChoice")
        if p is not None:
            p = [float(v) for v in p]
            if len(p) != len(self.transforms) or min(p) < 0 or abs(sum(p) - 1.0) > 1e-6:
                raise ValueError(f"p must give one probability >= 0 per transform ({len(self.transforms)}), "
                                 f"summing to 1, got {p!r}")
        self.p = p

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        return self.transforms[int(rng.choice(len(self.transforms), p=self.p))](sample, rng)

    def batch(self, batch: dict[str, Any], generator: Any = None) -> dict[str, Any]:
        import torch

        count = next(len(v) for v in batch.values() if isinstance(v, (torch.Tensor, list, tuple)))
        choice = numpy_rng(generator).choice(len(self.transforms), size=count, p=self.p)  # [B]
        parts = []  # (element indices, transformed sub-batch)
        for i, t in enumerate(self.transforms):
            index = torch.from_numpy(np.flatnonzero(choice == i))
            if len(index):
                sub = {k: _take(v, index, count) for k, v in batch.items()}
                parts.append((index, _batch_method(t)(sub, generator)))
        return _scatter(parts, count)

    def __repr__(self) -> str:
        return f"RandomChoice({self.transforms!r}, p={self.p!r})"


def _scatter(parts: list[tuple[Any, dict[str, Any]]], count: int) -> dict[str, Any]:
    """The sub-batches put back at their elements' places."""
    return {key: _merge(key, [(index, sub.get(key)) for index, sub in parts], count) for key in parts[0][1]}


def _merge(key: str, pieces: list[tuple[Any, Any]], count: int) -> Any:
    """One field's pieces (element indices, value for them) as one batch value of `count` elements."""
    import torch

    value = pieces[0][1]
    if isinstance(value, dict):
        return {k: _merge(f"{key}.{k}", [(i, p.get(k) if isinstance(p, dict) else None) for i, p in pieces], count)
                for k in value}
    if isinstance(value, torch.Tensor):
        shapes = {tuple(p.shape[1:]) for _, p in pieces if isinstance(p, torch.Tensor)}
        if len(shapes) != 1 or any(not isinstance(p, torch.Tensor) for _, p in pieces):
            raise ValueError(f"RandomChoice: the transforms give field {key!r} different shapes "
                             f"{sorted(shapes)}: make them agree (e.g. end each with the same Resize)")
        merged = value.new_empty((count, *value.shape[1:]))
        for index, piece in pieces:
            merged[index.to(merged.device)] = piece
        return merged
    items: list[Any] = [None] * count
    for index, piece in pieces:
        for i, item in zip(index.tolist(), piece):
            items[i] = item
    return items
