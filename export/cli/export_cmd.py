"""`robowds export STORE OUT`: the export job (also `python -m robowds.export STORE OUT`)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from robowds.export.cli.storage import add_storage_options_argument, storage_options
from robowds.export.errors import UserError

if TYPE_CHECKING:
    from robowds.export.executors.executor import ExecutorChoice
    from robowds.export.job.run import Summary
    from robowds.export.store.location import StoreLocation

EXECUTORS = ("local", "ray")  # export/executors/executor.py: ExecutorChoice.kind


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a store to WebDataset shards + manifest")
    p.add_argument("store", help="episode store: a folder, or an fsspec URL (s3://bucket/store; --storage-options)")
    p.add_argument("out", help="output folder for shards and manifest.json, or an fsspec URL (s3://bucket/prefix: "
                               "each shard uploaded once written, manifest.json last; --storage-options)")
    p.add_argument("--config", type=Path, help="export config YAML (see README)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set streams.joints.rate_hz=50 (repeatable)")
    p.add_argument("--fps", type=float, help="dataset grid rate (config fps)")
    p.add_argument("--stride", type=int, help="anchor every N grid frames (config stride)")
    p.add_argument("--seed", type=int, help="seed for splits and the export shuffle (config seed)")
    p.add_argument("--keep-order", action="store_true", help="do not shuffle windows (config shuffle=false)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="worker processes (default: all cores; 1 = in-process); the output is identical")
    add_executor_arguments(p)
    add_storage_options_argument(p)
    p.add_argument("--work-dir", type=Path, metavar="DIR",
                   help="with OUT at a URL: the local folder for staging and shards before upload (default: "
                        "$XDG_CACHE_HOME/robowds/work; the job uses DIR/<id> and deletes it when done)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the robowds export in OUT by this one (only files robowds wrote are replaced, "
                        "and only once the new export is complete; your own files stay)")
    p.add_argument("--append", action="store_true",
                   help="export only the episodes STORE has and OUT's export does not, into new shards, with "
                        "OUT's config (a --config/--set that differs is refused); old shards stay untouched. "
                        "Refused if an exported episode changed or was removed. OUT a folder or a URL, any --executor")
    p.add_argument("--break-lock", action="store_true",
                   help="with OUT at a URL: first delete the lock object (.robowds-lock) a killed export on "
                        "another machine left; only once you know that export no longer runs")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON document on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(fn=run)


def add_executor_arguments(p: argparse.ArgumentParser) -> None:
    """`--executor` and `--address`, shared with `robowds convert`."""
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="where tasks run: local processes, or Ray tasks (pip install 'robowds[ray]'; a local "
                        "Ray instance of --workers CPUs, or the cluster at --address); the output is identical")
    p.add_argument("--address", metavar="ADDR",
                   help="with --executor ray: the Ray cluster to run on (auto, HOST:PORT or ray://HOST:10001; "
                        "its CPUs replace --workers); the store and the output folder must be on storage "
                        "every node mounts at the same path")


def executor_choice(args: argparse.Namespace) -> ExecutorChoice:
    """The backend the command line picked (imported here: the parser must not load the job)."""
    from robowds.export.executors.executor import ExecutorChoice

    if args.address and args.executor != "ray":
        raise UserError(f"--address {args.address} needs --executor ray", hint="add --executor ray, or drop --address")
    return ExecutorChoice(args.executor, args.address)


def overrides(args: argparse.Namespace) -> list[str | tuple[str, str]]:
    """`--set` pairs plus the shorthand flags, as config overrides (the flags win, being last); a flag's
    override carries the flag as typed, which an error about its value names."""
    extra: list[str | tuple[str, str]] = [(f"{k}={v}", f"--{k} {v:g}") for k, v in
                                          (("fps", args.fps), ("stride", args.stride), ("seed", args.seed))
                                          if v is not None]
    if args.keep_order:
        extra.append(("shuffle=false", "--keep-order"))
    return [*args.overrides, *extra]


def run(args: argparse.Namespace) -> int:
    from robowds.export.job.config import load_config
    from robowds.export.job.run import run_export
    from robowds.export.output.remote_out import is_url
    from robowds.export.store.location import store_location

    if args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}", hint="--workers 1 runs in-process")
    choice = executor_choice(args)
    config = load_config(args.config, overrides(args))
    store = store_location(args.store, storage_options(args))
    out = args.out if is_url(args.out) else Path(args.out)
    if args.work_dir is not None and not is_url(args.out):
        raise UserError(f"--work-dir is for an output URL; {args.out} is a folder (its work folder is "
                        f"{args.out}/.robowds-work)", hint="drop --work-dir")
    if args.append:
        summary = _append(args, store, out, choice)
        print(json.dumps(summary.to_json(), indent=1) if args.json else summary.line())
        return 0
    summary = run_export(store, out, config, workers=args.workers, overwrite=args.overwrite,
                         progress=not (args.quiet or args.json), executor=choice,
                         out_storage_options=storage_options(args), work_dir=args.work_dir,
                         break_lock=args.break_lock)
    print(json.dumps(summary.to_json(), indent=1) if args.json else summary.line())
    return 0


def _append(args: argparse.Namespace, store: "StoreLocation", out: Path | str, choice: "ExecutorChoice") -> "Summary":
    """`--append`: OUT's config, checked against what the user gave (`job/append_config.py`)."""
    from robowds.export.job.append import run_append
    from robowds.export.job.append_config import given_keys
    from robowds.export.job.config import load_config

    if args.overwrite:
        raise UserError("--append and --overwrite exclude each other (an append keeps OUT's export, an overwrite "
                        "replaces it)", hint="drop one of them")
    items = [o if isinstance(o, str) else o[0] for o in overrides(args)]
    given = load_config(args.config, overrides(args))
    keys = given_keys(given, load_config(None), items)
    return run_append(store, out, given, keys, workers=args.workers, progress=not (args.quiet or args.json),
                      executor=choice, out_storage_options=storage_options(args), work_dir=args.work_dir,
                      break_lock=args.break_lock)
