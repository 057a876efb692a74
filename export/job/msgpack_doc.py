"""The one check every side file's reader makes first: the bytes are a msgpack map of the expected
`format` and `version`, else one ValueError naming the file."""

from __future__ import annotations

from typing import Any

import msgpack


def checked_doc(data: bytes, fmt: str, version: int, where: str) -> dict[str, Any]:
    """The decoded map (no pickle: msgpack holds only plain values)."""
    try:
        doc = msgpack.unpackb(data, raw=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ValueError(f"{where} is not msgpack: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != fmt or doc.get("version") != version:
        raise ValueError(f"{where} is not a {fmt} version {version} file")
    return doc
