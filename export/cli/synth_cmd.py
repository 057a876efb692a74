"""`robowds synth STORE`: write a realistic synthetic episode store (to try the tool, and for tests)."""

from __future__ import annotations

import argparse
from pathlib import Path

from robowds.export.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synth", help="write a realistic synthetic episode store")
    p.add_argument("store", type=Path, help="new folder to write the store into")
    p.add_argument("--episodes", type=int, default=8, help="number of episodes (4-12 s each)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated signals")
    p.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from robowds.export.cli.synth import write_synthetic_store

    try:
        summary = write_synthetic_store(args.store, episodes=args.episodes, seed=args.seed)
    except (FileExistsError, ValueError) as exc:
        raise UserError(str(exc), hint="choose a new folder and --episodes >= 1") from exc
    print(f"wrote a synthetic store of {summary.episodes} episodes ({summary.total_seconds:.1f} s) to {summary.root}")
    return 0
