"""Reading what the report is built from: the export's side files (`episodes.msgpack`,
`stats-state.msgpack`) through its `StoreLocation`, so a local folder and an `s3://` export read
alike. An export made before a side file existed has no entry for it in the manifest's `files`:
that is None here, and the page says what it could not show. A listed file that is outside the
export, missing, damaged (its sha256) or does not decode is a UserError (`job/listed_file.py`).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable, TypeVar

from robowds.export.errors import UserError
from robowds.export.job.listed_file import EXPORT_AGAIN, read_listed
from robowds.export.job.side_files import (EPISODES, STATS_STATE, EpisodeEntry, decode_episodes,
                                           load_stats_state)
from robowds.reader.manifest import MANIFEST_NAME
from robowds.export.store.location import RemoteStoreError, StoreLocation

T = TypeVar("T")


def _decoded(out: StoreLocation, manifest: dict[str, Any], key: str, decode: Callable[[bytes, str], T]) -> T | None:
    """A side file's decoded content; None for an export made before the file; a damaged one is a
    UserError naming it."""
    found = read_listed(out, manifest, key)
    if found is None:
        return None
    try:
        return decode(*found)
    except ValueError as exc:
        raise UserError(str(exc), hint=EXPORT_AGAIN) from exc


def read_stats_state(out: StoreLocation, manifest: dict[str, Any]) -> dict[str, dict[str, dict]] | None:
    """split -> statistics key -> merged state; None for an export made before the file."""
    return _decoded(out, manifest, STATS_STATE, load_stats_state)


def read_episodes(out: StoreLocation, manifest: dict[str, Any]) -> dict[str, EpisodeEntry] | None:
    """episode id -> its row of `episodes.msgpack`; None for an export made before the file."""
    return _decoded(out, manifest, EPISODES, decode_episodes)


def written_at(out: StoreLocation) -> str | None:
    """When the manifest was written (its modification time, UTC, to the second); None when the
    storage does not say. The manifest itself records no time: its bytes depend only on the data."""
    try:
        if out.local:
            stamp = datetime.fromtimestamp(out.path.joinpath(MANIFEST_NAME).stat().st_mtime, timezone.utc)
        else:
            info = out._remote(lambda: out.fs().info(out._key(MANIFEST_NAME)), MANIFEST_NAME)
            stamp = info.get("LastModified") or info.get("mtime") or info.get("updated")
            if isinstance(stamp, str):
                stamp = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            elif isinstance(stamp, (int, float)):
                stamp = datetime.fromtimestamp(stamp, timezone.utc)
            if not isinstance(stamp, datetime):
                return None
        return stamp.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OSError, RemoteStoreError, ValueError, AttributeError):
        return None
