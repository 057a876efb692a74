"""The config of `export --append`: the one the export in OUT was made with, never a new one.

Why rebuilt from the manifest: the manifest records the *resolved* config (each field's full window,
`job/spec.py: resolve`), not the user's file, and an append must build the new episodes' windows
exactly as the old ones were built. `out_config` turns the resolved config back into one `resolve`
takes (each field's entry cut to the keys a config may set for it) and proves the round trip:
resolving it against the store must give the manifest's config again, key for key; where it does not
(a config form this rebuild does not know, e.g. `stats.relative` written differently) the append is
refused rather than guessed.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from robowds.export.errors import UserError
from robowds.export.job.config import SERIES_ONLY_KEYS, STREAM_KEYS, WINDOW_KEYS
from robowds.export.job.spec import JobSpec, resolve
from robowds.export.store.location import StoreLocation

FULL_EXPORT = "run a full export of the store into OUT with --overwrite"


def out_config(store: StoreLocation, resolved: Mapping[str, Any], out: str) -> tuple[JobSpec, dict[str, Any]]:
    """(job, resolved config) of the store under the config of the export in `out` (its manifest's
    `config`, `resolved`); a UserError when the round trip does not give that config back."""
    raw = {k: v for k, v in resolved.items() if k not in ("streams", "videos", "images")}
    streams: dict[str, dict[str, Any]] = {}
    for name, entry in resolved.get("streams", {}).items():
        streams[name] = {k: v for k, v in entry.items() if k in WINDOW_KEYS | SERIES_ONLY_KEYS}
    for group in ("videos", "images"):
        for name, entry in resolved.get(group, {}).items():
            streams[name] = {k: v for k, v in entry.items() if k in STREAM_KEYS}
    raw["streams"] = streams
    job, again = resolve(store, raw)
    differ = sorted(key for key, _ in _differences(again, resolved))
    if differ:
        raise UserError(f"cannot rebuild the config of the export in {out} from its manifest (keys "
                        f"{', '.join(differ[:10])} come out differently), so --append cannot build new windows "
                        f"exactly like the old ones", hint=FULL_EXPORT)
    return job, again


def check_given(given: Mapping[str, Any], keys: set[str], out_resolved: Mapping[str, Any], out: str) -> None:
    """Refuse a config the user passed with `--append` (`given`, resolved) where it differs from OUT's
    at the dotted `keys` the user set (a `--set` key, a `--config` file's or a flag's): the config of
    an append is OUT's; the same value given again is fine."""
    differ = sorted(key for key, _ in _differences(given, out_resolved)
                    if any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for k in keys))
    if differ:
        shown = ", ".join(f"{k} (OUT: {_at(out_resolved, k)!r}, given: {_at(given, k)!r})" for k in differ[:20])
        raise UserError(f"--append uses the config of the export in {out}; the config given differs at "
                        f"{len(differ)} key(s): {shown}",
                        hint=f"drop those settings to append with OUT's config, or {FULL_EXPORT} to change it")


def given_keys(config: Mapping[str, Any], defaults: Mapping[str, Any], overrides: list[str]) -> set[str]:
    """The dotted keys a user set: where `config` differs from the defaults, and every override's key
    (which may repeat a default: `--set seed=0` against an export made with seed 1 is still a change)."""
    keys = {key for key, _ in _differences(config, defaults)}
    return keys | {item.partition("=")[0] for item in overrides}


def _differences(a: Any, b: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Dotted keys where two nested configs differ (a mapping on one side only: its key)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in sorted(set(a) | set(b), key=str):
            where = f"{prefix}{key}"
            if key not in a or key not in b:
                yield where, None
            else:
                yield from _differences(a[key], b[key], where + ".")
    elif a != b:
        yield prefix.rstrip("."), None


def _at(doc: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(doc, Mapping) or part not in doc:
            return None
        doc = doc[part]
    return doc
