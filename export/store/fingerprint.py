"""The store's fingerprint: what an export records of its store, so `verify` can tell a store that
changed since (tables and declarations by content, media files by path and size).
"""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath

from robowds.export.errors import UserError
from robowds.export.store.declarations import EXPORT_YAML, STORE_YAML
from robowds.export.store.location import RemoteStoreError, StoreLocation, store_location


def fingerprint(root: Path | StoreLocation) -> str:
    """sha256 over the tables and declarations (content) and the media files (path and size), linked
    ones included; not the top-level `export.yaml` (a config, not data). The same files give the same
    fingerprint in a folder and in object storage."""
    location = store_location(root)
    digest = hashlib.sha256()
    try:
        for rel, size in location.files():
            if rel == EXPORT_YAML:
                continue
            digest.update(rel.encode() + b"\0")
            name = PurePosixPath(rel)
            if name.suffix == ".parquet" or name.name == STORE_YAML:
                table = hashlib.sha256()
                for chunk in location.iter_chunks(rel):  # streamed: tables can be larger than memory
                    table.update(chunk)
                digest.update(table.digest())
            else:
                digest.update(str(size).encode())
    except RemoteStoreError as exc:
        raise UserError(f"store {exc}", hint=getattr(exc, "hint", None)) from exc
    return digest.hexdigest()
