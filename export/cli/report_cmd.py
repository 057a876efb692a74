"""`robowds report OUT [--store STORE] [--html FILE]`: one self-contained HTML page describing an
export (summary, fields, episodes, sampled windows, source overlays with --store, cameras).

The page goes to OUT/report.html by default, written through the export's StoreLocation (so an
`s3://` export gets it next to its manifest). robowds lists it nowhere: `verify` checks only the
files the manifest lists, and a re-export or `--append` leaves it in place (it may then describe
the previous generation: run `report` again)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robowds.export.cli.storage import add_storage_options_argument, storage_options
from robowds.export.errors import UserError

if TYPE_CHECKING:
    from robowds.export.store.location import StoreLocation

REPORT_NAME = "report.html"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write one self-contained HTML page describing an export")
    p.add_argument("out", help="export folder or fsspec URL, e.g. s3://bucket/out (holds manifest.json)")
    p.add_argument("--store", help="the store the export was made from (folder or URL): adds the source "
                                   "samples of a few windows over their exported lines")
    p.add_argument("--html", help=f"where to write the page (a local path; default: OUT/{REPORT_NAME})")
    p.add_argument("--windows", type=int, default=6, help="sampled windows to draw")
    p.add_argument("--seed", type=int, default=0, help="which windows are drawn")
    p.add_argument("--split", help="split the statistics, windows and cameras are of (default: the first split)")
    add_storage_options_argument(p)
    p.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from robowds.export.job.episode_facts import read_episode_facts
    from robowds.export.output.fsio import fsync_write
    from robowds.export.output.publish import load_finished_manifest
    from robowds.export.report import inputs, pictures
    from robowds.export.report.model import build_model
    from robowds.export.report.page import render
    from robowds.export.output.remote_out import RemoteOut
    from robowds.export.store.location import store_location

    if args.windows < 0:
        raise UserError(f"--windows must be >= 0, got {args.windows}", hint="e.g. --windows 6 (0 draws none)")
    options = storage_options(args)
    out = store_location(args.out, options)
    manifest = load_finished_manifest(out)
    splits = list(manifest.get("splits", {}))
    split = args.split if args.split is not None else (splits[0] if splits else None)
    if split not in splits:
        raise UserError(f"{args.out} has no split {split!r} (it has: {', '.join(splits) or 'none'})",
                        hint=f"pass --split with one of: {', '.join(splits)}" if splits else
                        "export the store again: this export has no split")
    store = None
    if args.store is not None:
        store = store_location(args.store, options)
        _check_store(store, args.store, manifest)
    facts = read_episode_facts(out, manifest)  # None: an export made before the facts file
    model = build_model(manifest, split, out=_shown(out), stats_state=inputs.read_stats_state(out, manifest),
                        episodes=inputs.read_episodes(out, manifest), facts=facts,
                        store=None if store is None else _shown(store), written_at=inputs.written_at(out))
    windows = pictures.window_figures(out, manifest, split, args.windows, args.seed)
    overlays = None if store is None else pictures.overlay_figures(out, manifest, store, split, args.windows, args.seed)
    cameras = pictures.camera_rows(out, manifest, split, args.seed)
    data = render(model, windows, overlays, cameras).encode("utf-8")
    if args.html is not None:
        target = Path(args.html)
        if target.is_dir():
            raise UserError(f"--html {args.html} is a folder", hint=f"give a file name, e.g. {target / REPORT_NAME}")
        fsync_write(target, data)
        where = str(target)
    else:
        if out.local:
            fsync_write(out.path / REPORT_NAME, data)
        else:  # one PUT, retried on transient faults; a lasting one is a UserError naming the URL
            RemoteOut(out.url, options).put(REPORT_NAME, data)
        where = out.join(REPORT_NAME)
    print(f"wrote {where} ({len(data):,} bytes)")
    return 0


def _shown(location: StoreLocation) -> str:
    """A local folder as an absolute path (the page is read later, elsewhere), a URL as given."""
    return str(location.path.resolve()) if location.local else str(location)


def _check_store(store: StoreLocation, given: str, manifest: dict[str, Any]) -> None:
    """Refuse a --store that is not the one the export was made from (its fingerprint differs):
    overlays drawn from another store would show samples the windows were never made from."""
    from robowds.export.store.fingerprint import fingerprint

    if store.local and not store.path.is_dir():
        raise UserError(f"--store {given} is not a folder", hint="pass the store the export was made from")
    expected = manifest.get("source", {}).get("fingerprint")
    found = fingerprint(store)
    if found != expected:
        raise UserError(f"--store {given} is not the store this export was made from (its fingerprint "
                        f"{found[:12]}... differs from the manifest's {str(expected)[:12]}...)",
                        hint="pass the store the export was made from, unchanged since, or leave --store out")
