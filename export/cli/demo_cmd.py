"""`robowds demo`: synth -> validate -> export -> verify -> read back, in one go."""

from __future__ import annotations

import argparse
from pathlib import Path

from robowds.export.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="synth -> validate -> export -> verify -> read back, in one go")
    p.add_argument("--dir", type=Path, default=Path("demo-out"),
                   help="folder for the demo's store/ and out/ (replaced only if a previous demo wrote it)")
    p.add_argument("--episodes", type=int, default=24, help="episodes in the synthetic store")
    p.add_argument("--workers", type=int, default=2, help="export workers and DataLoader workers")
    p.add_argument("--quiet", action="store_true", help="no progress bars (the step lines still print)")
    p.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from robowds.export.cli.demo import run_demo

    if args.episodes < 1 or args.workers < 1:
        raise UserError(f"--episodes and --workers must be >= 1, got {args.episodes} and {args.workers}",
                        hint="e.g. robowds demo --episodes 24 --workers 2")
    return run_demo(args.dir, episodes=args.episodes, workers=args.workers, progress=not args.quiet)
