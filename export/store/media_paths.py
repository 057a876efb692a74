"""Media paths a table names: where they may resolve (the store, or a declared media root) and the
fixes to offer when one cannot be found or opened.
"""

from __future__ import annotations

import re
from pathlib import Path

from robowds.export.store.declarations import STORE_YAML, FieldSpec


def text_hint(spec: FieldSpec) -> str:
    """A string column is taken for a media path when its first value ends in a media extension, so a
    text column whose first value happens to ("draw the logo.png") needs `kind: text`: say so."""
    if spec.kind in ("image", "video") and spec.arrow_type in ("string", "large_string"):
        return (f"; if {spec.name!r} is text, not a path (its first value ends like a file name), declare "
                f"`kind: text` for it under fields in {STORE_YAML}")
    return ""


def media_hint(spec: FieldSpec) -> str:
    """The fix for a media file that cannot be found or read from a path column."""
    return "fix the path (relative to the store folder) or add the file" + text_hint(spec)


class MediaPathError(ValueError):
    """A media path a table names that robowds may not open; `hint` says how to allow or fix it."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def safe_media_path(root: Path, rel: str, media_roots: tuple[Path, ...] = ()) -> Path:
    """Resolve a media path from a table, refusing anything that leaves the store, unless it resolves
    into one of the store's declared `media_roots` (store.yaml; opt-in, none by default).

    `..` and URLs are refused always; an absolute path only with media roots. A symlink inside the
    store is followed, and its target must lie in the store or a media root: the error names both the
    link and its target, because "leaves the store" alone puzzles the user who made the link."""
    opt_in = (f"to allow it, list the folder it is in under media_roots in {STORE_YAML} "
              "(e.g. `media_roots: [/data/videos]`)")
    absolute = bool(rel) and Path(rel).is_absolute()
    if not rel or ".." in Path(rel).parts or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", rel):
        raise MediaPathError(f"media path {rel!r} must be relative to the store and stay inside it",
                             hint="write paths relative to the store folder, without `..` or a URL scheme")
    if absolute and not media_roots:
        raise MediaPathError(f"media path {rel!r} is absolute, outside the store", hint=opt_in)
    path = (root / rel).resolve()  # an absolute rel replaces root
    if not any(path.is_relative_to(folder) for folder in (root.resolve(), *media_roots)):
        link = next((p for p in [root / rel, *(root / rel).parents] if p.is_symlink()), None)
        where = "outside the store" + (" and every media root" if media_roots else "")
        if link is not None and not absolute:
            raise MediaPathError(f"media path {rel!r} is a link whose target {path} is {where}", hint=opt_in)
        raise MediaPathError(f"media path {rel!r} resolves to {path}, {where}", hint=opt_in)
    return path

