"""Publish a finished export into OUT: the only step of the job that changes files outside its work folder.

Why a separate step with a journal: replacing an export is many renames and deletions, and a user's own
files (notes, `.nv-meta/` from `energon prepare`, anything unknown) may sit next to it. Reduce therefore
writes every new shard under `OUT/.robowds-work/ready/`, so the old export stays intact and readable
until the new one is complete. Publish then decides everything up front (which files are ours to
replace or remove; whether a file we did not write is in the way), writes that decision to
`publish.json` in the work folder, and only then changes OUT. Every step it journals checks whether it
is already done, so a run killed at any moment is finished by the next run into the same folder and
ends byte-identical to an uninterrupted one.

What robowds owns in OUT: the files its manifest lists (shards and, from manifest version 2, their
offset indexes `<shard>.idx`; the side files under `files`), `manifest.json`, `<split>.wids.json` of
the manifest's splits, and the work folder, and `.nv-meta/{dataset.yaml,split.yaml,.info.json}` (Megatron-Energon's metadata,
`energon.py`) where their bytes are what robowds wrote for the old manifest. Nothing else is ever
replaced or deleted, with one exception: `<shard>.idx` next to a shard of the export being replaced is
replaced by the new index (`energon prepare` writes such indexes for version 1 exports; an index
describes a shard that is being replaced, so it would be stale); where the new export has no such
shard, the index is left alone like any file the old manifest does not list. A `.nv-meta/` file
robowds did not write (edited, or from `energon prepare`, `index.sqlite` included) stays as it is,
with a warning.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from robowds.export.errors import UserError
from robowds.export.output.energon import FILES as ENERGON_FILES
from robowds.export.output.energon import NV_META, energon_files
from robowds.export.output.fsio import fsync_dir, fsync_write
from robowds.reader.manifest import (MANIFEST_NAME, ManifestError, dump_manifest, parse_manifest, safe_relative,
                                     shards_of)

if TYPE_CHECKING:
    from robowds.export.store.location import StoreLocation

WORK_DIR = ".robowds-work"  # in OUT (and under an output URL): a job's work folder
READY = "ready"  # in the work folder: the new export's files, at their paths relative to OUT
JOURNAL = "publish.json"  # in the work folder: {"place": [path, ...], "remove": [path, ...]}
JOB_FILE = "job.json"  # in the work folder: {"job_id"}; its staging is valid only while this file exists


def read_manifest(out: Path) -> dict[str, Any] | None:
    """The manifest of the export in OUT, None if OUT holds none; a manifest we cannot read is refused."""
    path = out / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        return parse_manifest(path.read_bytes(), str(path))
    except (ManifestError, OSError, ValueError) as exc:  # ValueError: bytes that are not UTF-8 text
        reason = exc if isinstance(exc, (ManifestError, OSError)) else f"{path} is not a robowds manifest ({exc})"
        raise UserError(f"{reason}: robowds replaces only an export it wrote and can read",
                        hint=f"choose another output folder, or move {path} away if it is not a robowds export"
                        ) from exc


def load_finished_manifest(out: "Path | str | StoreLocation") -> dict[str, Any]:
    """The manifest of a finished export in `out` (a folder, or an fsspec URL as a `StoreLocation`), for
    the commands that read one (verify, inspect): a missing, damaged or foreign manifest, or an export
    in object storage that cannot be read, is one UserError with the fix."""
    from robowds.export.store.location import RemoteStoreError, store_location

    location = store_location(out)
    path = location.join(MANIFEST_NAME)
    try:
        if not location.is_file(MANIFEST_NAME):
            if location.is_file(f"{WORK_DIR}/{JOURNAL}"):  # killed between the old manifest and the new one
                raise UserError(f"{out} has no {MANIFEST_NAME}: the export or append into it was stopped while it "
                                f"published its files (its journal {WORK_DIR}/{JOURNAL} is there); nothing is lost",
                                hint="run the same `robowds export` command again: it finishes the publish first")
            raise UserError(f"{out} has no {MANIFEST_NAME}", hint="pass the output folder of a finished export")
        data = location.read_bytes(MANIFEST_NAME)
    except RemoteStoreError as exc:
        raise UserError(str(exc), hint=exc.hint) from exc
    try:
        return parse_manifest(data, path)
    except ManifestError as exc:
        raise UserError(str(exc), hint="the manifest is not as robowds wrote it (edited or damaged): "
                        "export again into a new folder") from exc
    except ValueError as exc:  # bytes that are not UTF-8 text
        raise UserError(f"{path} is not a robowds manifest: {exc}",
                        hint="pass the output folder of a finished robowds export (if its manifest is "
                             "damaged, export again into a new folder)") from exc


def owned_files(manifest: dict[str, Any]) -> list[str]:
    """The files (POSIX paths relative to OUT) a finished export wrote: manifest, the side files it
    lists under `files` (`job/side_files.py`; exports before them have none), wids indexes, shards and
    their offset indexes (version 2; every shard's index right after it).

    Scales with the number of shards (one or two strings each), never with samples.
    """
    files = [MANIFEST_NAME, *(safe_relative(entry["path"]) for _, entry in sorted(manifest.get("files", {}).items()))]
    for split in sorted(manifest.get("splits", {})):
        files.append(safe_relative(f"{split}.wids.json"))
        for shard in shards_of(manifest, split):
            files.append(shard.path)
            if shard.index_sha256 is not None:
                files.append(shard.index_path)
    return files


def shard_indexes(manifest: dict[str, Any]) -> set[str]:
    """`<shard>.idx` of every shard the manifest lists, whether it wrote them (version 2) or not
    (version 1: an `energon prepare` may have): replaceable, since they index shards being replaced."""
    return {shard.index_path for split in manifest.get("splits", {}) for shard in shards_of(manifest, split)}


def wids_index(split: str, entry: dict[str, Any]) -> bytes:
    """`<split>.wids.json`: the split's shards as a wids shard index (for `wids.ShardListDataset`)."""
    doc = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": split,
           "shardlist": [{"url": s["path"], "nsamples": s["samples"], "filesize": s["bytes"]}
                         for s in entry["shards"]]}
    return json.dumps(doc, sort_keys=True, indent=1).encode()


def remove_work(work: Path) -> None:
    """Delete the work folder; its job file goes first, so a half-deleted folder is never resumed from."""
    (work / JOB_FILE).unlink(missing_ok=True)
    shutil.rmtree(work, ignore_errors=True)


def _in_the_way(out: Path, rel: str, replaceable: bool) -> bool:
    """Whether placing `rel` would replace or shadow something that is not ours to replace."""
    target = out / rel
    for parent in target.relative_to(out).parents:
        if str(parent) != "." and (out / parent).exists() and not (out / parent).is_dir():
            return True  # a file where the split's folder must go
    if target.is_symlink() or target.exists():
        return not replaceable or target.is_dir()
    return False


@contextmanager
def _as_user_error(out: Path) -> Iterator[None]:
    """A file system error while publishing (permissions, disk full) is one message, not a traceback."""
    try:
        yield
    except OSError as exc:
        raise UserError(f"cannot publish the export into {out}: {exc}",
                        hint="fix the cause and re-run the same command: it finishes the publish where it stopped"
                        ) from exc


def _ours_in_nv_meta(out: Path, old: dict[str, Any] | None) -> set[str]:
    """The `.nv-meta/` files in OUT that robowds wrote for the old export: bytes equal to what it writes
    for the old manifest (a pure function of it), so an edit or `energon prepare` makes a file the user's."""
    if old is None:
        return set()
    return {rel for rel, data in energon_files(old).items()
            if (out / rel).is_file() and not (out / rel).is_symlink() and (out / rel).read_bytes() == data}


def nv_meta_warnings(out: Path | str, kept: list[str], others: list[str]) -> list[str]:
    """What the user must know about `.nv-meta/` files robowds did not write, all kept as they are:
    `kept` where robowds' own would go, `others` (e.g. `index.sqlite`) describing the replaced export."""
    notes = [f"{rel} in {out} was not written by robowds (edited, or from `energon prepare`): kept as it is, "
             f"and Energon reads it instead of robowds' (move it away and re-run the export to get that)"
             for rel in kept]
    if others:
        notes.append(f"{', '.join(others)} in {out} describe the previous export and were kept: re-run "
                     f"`energon prepare {out} --tar-index-only` if you use them (index.sqlite: Energon's "
                     f"random access by key and joins; get_train_dataset does not need it)")
    return notes


def _nv_meta_others(out: Path, replacing: bool) -> list[str]:
    """`.nv-meta/` files in OUT other than robowds' own, when an export is being replaced."""
    folder = out / NV_META
    if not (replacing and folder.is_dir()):
        return []
    return sorted(rel for rel in (p.relative_to(out).as_posix() for p in folder.iterdir())
                  if rel not in ENERGON_FILES)


def publish(out: Path, work: Path, manifest: dict[str, Any], side: dict[str, bytes] | None = None) -> list[str]:
    """Replace the export in OUT (if any) by the finished one whose shards wait in `work/ready/`;
    returns warnings (`.nv-meta/` files of the user's, kept). `side`: the side files the manifest lists
    under `files` (path -> bytes, `job/side_files.py`), written into `ready/` and placed like the shards.

    Order of changes to OUT: old manifest removed (nothing stale stays listed), new shards, wids
    indexes and `.nv-meta/` files renamed into place, old listed files the new export does not have
    removed, new manifest renamed into place last, work folder removed.
    """
    ready = work / READY
    meta = energon_files(manifest)
    with _as_user_error(out):
        for split, entry in manifest["splits"].items():
            fsync_write(ready / f"{split}.wids.json", wids_index(split, entry))
        for rel, data in (side or {}).items():  # after a wids index: the SIGKILL test reads phases from ready/
            fsync_write(ready / rel, data)
        for rel, data in meta.items():  # after the wids indexes: the SIGKILL test reads phases from ready/
            (ready / rel).parent.mkdir(exist_ok=True)
            fsync_write(ready / rel, data)
        fsync_write(ready / MANIFEST_NAME, dump_manifest(manifest))
    new = owned_files(manifest)
    old = read_manifest(out)
    ours_meta = _ours_in_nv_meta(out, old)
    kept = [rel for rel in meta if _in_the_way(out, rel, rel in ours_meta)]  # the user's: never replaced
    warnings = nv_meta_warnings(out, kept, _nv_meta_others(out, old is not None))
    owned = set(owned_files(old)) if old is not None else set()  # removed where the new export lacks them
    replaceable = owned | (shard_indexes(old) if old is not None else set())
    blocked = [rel for rel in new if _in_the_way(out, rel, rel in replaceable)]
    if blocked:
        shown = ", ".join(blocked[:5]) + (f" and {len(blocked) - 5} more" if len(blocked) > 5 else "")
        raise UserError(f"{len(blocked)} path(s) in {out} are in the way of the new export and no robowds "
                        f"manifest lists them: {shown}",
                        hint=f"robowds never replaces files it did not write: move them out of {out} and re-run "
                             f"the same command (the finished shards wait in {work})")
    placed = [rel for rel in new if rel != MANIFEST_NAME] + [rel for rel in meta if rel not in kept]
    journal = {"place": placed, "remove": sorted(owned - set(new))}
    with _as_user_error(out):
        fsync_write(work / JOURNAL, json.dumps(journal).encode())  # the commit point
    finish_publish(out, work)
    return warnings


def finish_publish(out: Path, work: Path) -> bool:
    """Carry out the journaled publish in `work`, if there is one; returns whether there was.

    Idempotent: a file still in `ready/` has not been moved yet, one no longer there has; removals
    tolerate missing files. So re-running it after SIGKILL at any point completes the same publish.
    """
    journal = work / JOURNAL
    if not journal.is_file():
        return False
    with _as_user_error(out):
        _carry_out(out, work, json.loads(journal.read_bytes()))
    return True


def _carry_out(out: Path, work: Path, doc: dict[str, list[str]]) -> None:
    """The steps of `finish_publish`, in order; each is skipped or harmless when already done."""
    ready = work / READY
    staged_manifest = ready / MANIFEST_NAME
    if staged_manifest.exists():  # else the new manifest is already in place: leave it
        (out / MANIFEST_NAME).unlink(missing_ok=True)
    touched = {out}
    for rel in doc["place"]:
        src, dst = ready / rel, out / rel
        if src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
            touched.add(dst.parent)
    for rel in doc["remove"]:
        target = out / rel
        target.unlink(missing_ok=True)
        for parent in target.relative_to(out).parents:  # a split folder we emptied; never a user's
            if str(parent) == "." or not (out / parent).is_dir() or any((out / parent).iterdir()):
                break
            (out / parent).rmdir()
    for folder in sorted(touched):
        fsync_dir(folder)  # the renames reach the disk before the manifest lists them
    if staged_manifest.exists():
        os.replace(staged_manifest, out / MANIFEST_NAME)
        fsync_dir(out)
    remove_work(work)
