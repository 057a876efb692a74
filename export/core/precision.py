"""Does storing a field as float32 lose what its values vary by? Pure numpy, O(values).

float32 keeps 24 significant bits: UTM northings near 5e6 m are stored to 0.5 m, so a trajectory that
moves by centimetres is erased without any error. The check runs on the values the export (and
validate) already hold in memory, one column at a time: a column is flagged when the float32 round
trip moves some value by more than `FLOAT32_LOSS_FRACTION` of the column's spread (max - min) in the
episode. A constant column has nothing to resolve and is never flagged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FLOAT32_LOSS_FRACTION = 1e-3  # flagged when max |x - float32(x)| > this x (max - min), per column


@dataclass(frozen=True)
class PrecisionLoss:
    """The worst column of one field in one episode."""

    column: int  # 0-based value column (time excluded)
    max_error: float  # max |x - float32(x)| in that column
    spread: float  # max - min of that column

    def as_dict(self) -> dict[str, float | int]:
        return {"column": self.column, "max_error": self.max_error, "spread": self.spread}


def float32_loss(values: np.ndarray) -> PrecisionLoss | None:
    """The column of `values` ([T, N], finite) whose float32 round trip loses the largest share of its
    spread, if that share exceeds `FLOAT32_LOSS_FRACTION`; None when float32 keeps every column."""
    if values.size == 0 or values.dtype == np.float32 or values.dtype.kind == "b":
        return None
    exact = values.astype(np.float64)  # [T, N]; int64 beyond 2**53 rounds here, float32 loses far more
    error = np.abs(exact - exact.astype(np.float32).astype(np.float64)).max(axis=0)  # [N]
    spread = exact.max(axis=0) - exact.min(axis=0)  # [N]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(spread > 0, error / spread, 0.0)  # [N]
    worst = int(np.argmax(share))
    if share[worst] <= FLOAT32_LOSS_FRACTION:
        return None
    return PrecisionLoss(worst, float(error[worst]), float(spread[worst]))


def loss_text(loss: PrecisionLoss, episode: str, episodes: int) -> str:
    """What is lost, for validate's warning and the export's: the worst episode, and how many lose."""
    return (f"its values change by up to {loss.max_error:.3g}, "
            f"{100 * loss.max_error / loss.spread:.3g}% of the spread {loss.spread:.3g} of value column "
            f"{loss.column} in episode {episode!r} ({episodes} episode(s) over the limit of "
            f"{100 * FLOAT32_LOSS_FRACTION:g}%)")


def loss_fix(field: str) -> str:
    """The two ways to keep the precision."""
    return f"set float_dtype: float64 in the export config, or streams.{field}.dtype: float64 for this field alone"


def worst(a: tuple[str, PrecisionLoss] | None, b: tuple[str, PrecisionLoss]) -> tuple[str, PrecisionLoss]:
    """Of two (episode, loss), the one losing the larger share of its spread (the first on a tie)."""
    if a is None or b[1].max_error / b[1].spread > a[1].max_error / a[1].spread:
        return b
    return a
