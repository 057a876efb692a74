"""The `robowds` command: synth, validate, export, verify, demo.

User errors print one message (what, where, how to fix) and exit non-zero; tracebacks are for bugs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from robowds.export.errors import UserError


def _add_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", type=Path, help="episode store folder")
    p.add_argument("out", type=Path, help="output folder for shards and manifest.json")
    p.add_argument("--config", type=Path, help="export config YAML (see README)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set streams.joints.rate_hz=50 (repeatable)")
    p.add_argument("--fps", type=float, help="dataset grid rate (config fps)")
    p.add_argument("--stride", type=int, help="anchor every N grid frames (config stride)")
    p.add_argument("--seed", type=int, help="seed for splits and the export shuffle (config seed)")
    p.add_argument("--keep-order", action="store_true", help="do not shuffle windows (config shuffle=false)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="worker processes (default: all cores; 1 = in-process); the output is identical")
    p.add_argument("--overwrite", action="store_true", help="replace the robowds export in OUT by this one (only files robowds wrote are replaced, and only once the new export is complete; your own files stay)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _export_overrides(args: argparse.Namespace) -> list[str]:
    extra = [f"{k}={v}" for k, v in (("fps", args.fps), ("stride", args.stride), ("seed", args.seed))
             if v is not None]
    if args.keep_order:
        extra.append("shuffle=false")
    return [*args.overrides, *extra]


def cmd_export(args: argparse.Namespace) -> int:
    from robowds.export.job.config import load_config
    from robowds.export.job.run import run_export

    if args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}", hint="--workers 1 runs in-process")
    config = load_config(args.config, _export_overrides(args))
    summary = run_export(args.store, args.out, config, workers=args.workers, overwrite=args.overwrite,
                         progress=not args.quiet)
    print(summary.line())
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    from robowds.export.cli.synth import write_synthetic_store

    try:
        summary = write_synthetic_store(args.store, episodes=args.episodes, seed=args.seed)
    except (FileExistsError, ValueError) as exc:
        raise UserError(str(exc), hint="choose a new folder and --episodes >= 1") from exc
    print(f"wrote a synthetic store of {summary.episodes} episodes ({summary.total_seconds:.1f} s) to {summary.root}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from robowds.export.store.validate import validate_store

    if not args.max_episode_s > 0:
        raise UserError(f"--max-episode-s must be a positive number of seconds, got {args.max_episode_s:g}")
    report = validate_store(args.store, progress=sys.stderr.isatty(), max_episode_s=args.max_episode_s)
    print(report.render(verbose=args.verbose))
    return 0 if report.exportable else 1


def cmd_verify(args: argparse.Namespace) -> int:
    from robowds.export.check.verify import verify_export

    if args.check_windows < 0:
        raise UserError(f"--check-windows must be >= 0, got {args.check_windows}",
                        hint="how many windows to recompute from the store, e.g. --check-windows 32")
    if args.store is not None and not args.store.is_dir():
        raise UserError(f"store {args.store} is not a folder", hint="pass the store the export was made from")
    result = verify_export(args.out, store=args.store, check_windows=args.check_windows, seed=args.seed,
                           progress=not args.quiet)
    print(result.render())
    return 0 if result.ok else 1


def cmd_inspect(args: argparse.Namespace) -> int:
    from robowds.export.cli.inspect_window import load_window, render_png, summary

    if args.key is None and args.index is None:
        args.index = 0
    manifest, sample = load_window(args.out, args.split, args.key, args.index)
    print(summary(manifest, sample))
    if args.png is not None:
        render_png(manifest, sample, args.png)
        print(f"wrote {args.png}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from robowds.export.cli.demo import run_demo

    if args.episodes < 1 or args.workers < 1:
        raise UserError(f"--episodes and --workers must be >= 1, got {args.episodes} and {args.workers}",
                        hint="e.g. robowds demo --episodes 24 --workers 2")
    return run_demo(args.dir, episodes=args.episodes, workers=args.workers)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="robowds", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("synth", help="write a realistic synthetic episode store")
    p.add_argument("store", type=Path)
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=cmd_synth)
    p = sub.add_parser("validate", help="sanity-check an episode store before export")
    p.add_argument("store", type=Path)
    p.add_argument("-v", "--verbose", action="store_true", help="list every episode's durations")
    p.add_argument("--max-episode-s", type=float, default=86400.0, metavar="SECONDS",
                   help="longer episodes are errors (default 86400 = 24 h; export config max_episode_s)")
    p.set_defaults(fn=cmd_validate)
    p = sub.add_parser("export", help="export a store to WebDataset shards + manifest")
    _add_export_args(p)
    p.set_defaults(fn=cmd_export)
    p = sub.add_parser("verify", help="check shards against the manifest (and windows against the store)")
    p.add_argument("out", type=Path)
    p.add_argument("--store", type=Path, help="recompute a random subset of windows from this store")
    p.add_argument("--check-windows", type=int, default=32, help="how many windows to recompute (with --store)")
    p.add_argument("--seed", type=int, default=0, help="which random windows to recompute")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=cmd_verify)
    p = sub.add_parser("inspect", help="print one window, or draw it (--png)")
    p.add_argument("out", type=Path)
    p.add_argument("--split", default="train")
    p.add_argument("--key", help="sample key, e.g. ep_0003_000042")
    p.add_argument("--index", type=int, help="the N-th sample of the split in shard order (default 0)")
    p.add_argument("--png", type=Path, help="draw the window into this PNG file")
    p.set_defaults(fn=cmd_inspect)
    p = sub.add_parser("demo", help="synth -> validate -> export -> verify -> read back, in one go")
    p.add_argument("--dir", type=Path, default=Path("demo-out"))
    p.add_argument("--episodes", type=int, default=24)
    p.add_argument("--workers", type=int, default=2)
    p.set_defaults(fn=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except UserError as exc:
        print(f"robowds {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a path the user gave: missing, a folder, read-only, disk full (export wraps its own)
        from robowds.export.job.oserrors import os_error

        error = os_error(exc, args.command)
        print(f"robowds {args.command}: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"robowds {args.command}: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
