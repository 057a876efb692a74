"""Reading one of the side files a finished export's manifest lists under `files` (the episodes
table, the statistics state, the per-episode facts), with the checks the manifest makes possible:
the listed path stays inside the export, the file is there, and its bytes have the listed sha256.
The report and `read_episode_facts` read through this one function; `verify` reports the same
problems as failures instead (export/check/)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from robowds.export.errors import UserError
from robowds.reader.manifest import MANIFEST_NAME, ManifestError, safe_relative

if TYPE_CHECKING:
    from robowds.export.store.location import StoreLocation

EXPORT_AGAIN = "export again (a full export of the store into OUT with --overwrite) to write it anew"


def read_listed(out: "StoreLocation", manifest: dict[str, Any], key: str) -> tuple[bytes, str] | None:
    """(bytes, where) of the file `files.<key>` lists, `where` naming it for messages; None when the
    manifest lists no such file (an export made before it). A path outside the export, a missing
    file, an unreadable URL or bytes with another sha256 are one UserError naming the file."""
    from robowds.export.store.location import RemoteStoreError

    entry = manifest.get("files", {}).get(key)
    if entry is None:
        return None
    try:
        rel = safe_relative(entry["path"])
    except (ManifestError, KeyError, TypeError) as exc:
        raise UserError(f"{out.join(MANIFEST_NAME)}: files.{key} is not a file inside the export ({exc})",
                        hint=EXPORT_AGAIN) from exc
    where = out.join(rel)
    try:
        data = out.read_bytes(rel)
    except FileNotFoundError as exc:
        raise UserError(f"{where} is missing: the manifest lists it (files.{key})", hint=EXPORT_AGAIN) from exc
    except RemoteStoreError as exc:  # the export's URL cannot be read (access, network)
        raise UserError(str(exc), hint=exc.hint) from exc
    if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        raise UserError(f"{where} is damaged: its sha256 differs from the manifest's (files.{key})",
                        hint=EXPORT_AGAIN)
    return data, where
