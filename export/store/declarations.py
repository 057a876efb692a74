"""What a store says about its fields: the `FieldSpec` each field becomes, the `Problem`s found on the
way, and `store.yaml` (its keys, `media_roots`, and each declaration checked and laid over what the
column's type implies; the README, section "store.yaml").

Problems are collected, not raised, so `validate` can report all of them at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robowds.export.core.resample import METHODS, QUAT_ORDERS
from robowds.export.store.location import StoreLocation
from robowds.export.store.yamlio import YamlError, load_bytes

KINDS = ("timeseries", "video", "image", "text", "value")
DECL_KEYS = {"kind", "interpolation", "names", "units", "max_gap_s", "time_unit", "quaternion_order", "fps"}
SERIES_KEYS = {"names", "units", "max_gap_s", "time_unit", "quaternion_order"}  # meaningless for other kinds
STORE_YAML = "store.yaml"
# an export config kept with the store (`convert lerobot` writes one): not store content, so editing it
# does not change the fingerprint (earlier exports still verify against the store)
EXPORT_YAML = "export.yaml"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the store; `error` problems make it non-exportable."""

    severity: str  # "error" | "warning"
    message: str
    episode: str | None = None
    field: str | None = None
    hint: str | None = None

    @property
    def located(self) -> str:
        """The message after its episode and field: "episode 'e', field 'f': message"."""
        where = ", ".join(p for p in (f"episode {self.episode!r}" if self.episode else "",
                                      f"field {self.field!r}" if self.field else "") if p)
        return f"{where + ': ' if where else ''}{self.message}"

    def __str__(self) -> str:
        text = f"{self.severity}: {self.located}"
        return text + (f" (fix: {self.hint})" if self.hint else "")



@dataclass(frozen=True)
class FieldSpec:
    name: str
    table: str  # parquet file name
    kind: str
    arrow_type: str
    interpolation: str | None = None  # timeseries / video
    value_dtype: str | None = None  # numpy dtype of the stored values
    names: tuple[str, ...] | None = None
    units: str | tuple[str, ...] | None = None
    max_gap_s: float | None = None
    time_unit: str = "s"
    quaternion_order: str | None = None
    fps: float | None = None
    declared: bool = False
    # "typed": the struct layout {t: list<float64 | int64>, v: list<list<T>>}; None: [T, N+1] rows
    layout: str | None = None

    def describe(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if v is not None and k not in ("name", "declared")}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}



def load_declarations(location: StoreLocation, problems: list[Problem]
                       ) -> tuple[dict[str, dict[str, Any]], str | None, tuple[Path, ...]]:
    where = location.join(STORE_YAML)
    try:
        if not ((location.path / STORE_YAML).exists() if location.local else location.is_file(STORE_YAML)):
            return {}, None, ()
        doc = load_bytes(location.read_bytes(STORE_YAML), where) or {}
    except YamlError as exc:
        problems.append(Problem("error", f"{STORE_YAML} is {exc.reason}", hint=f"fix {where}"))
        return {}, None, ()
    except OSError as exc:
        problems.append(Problem("error", f"{STORE_YAML} cannot be read: {exc.strerror or exc}",
                                hint=f"make {where} a readable YAML file, or remove it"))
        return {}, None, ()
    if not isinstance(doc, dict):
        problems.append(Problem("error", f"{STORE_YAML} must be a mapping",
                                hint="see docs/store.md, section store.yaml"))
        return {}, None, ()
    unknown = set(doc) - {"version", "clock", "fields", "media_roots"}
    if unknown:
        problems.append(Problem("error", f"{STORE_YAML}: unknown key(s) {sorted(unknown)}",
                                hint="known: version, clock, fields, media_roots"))
    if doc.get("version", 1) != 1:
        problems.append(Problem("error", f"{STORE_YAML}: version {doc.get('version')!r} is not supported (1)"))
    decls = doc.get("fields") or {}
    if not isinstance(decls, dict):
        problems.append(Problem("error", f"{STORE_YAML}: fields must be a mapping of field name -> declaration, "
                                f"got a {type(decls).__name__}",
                                hint="write `fields:` then one indented `name:` per field, without `- ` in front"))
        decls = {}
    clock = doc.get("clock")
    if clock is not None and not isinstance(clock, str):
        problems.append(Problem("error", f"{STORE_YAML}: clock must be a field name, got {clock!r}",
                                hint="e.g. `clock: joints`"))
        clock = None
    for name, decl in decls.items():
        if not isinstance(decl, dict):
            problems.append(Problem("error", f"{STORE_YAML}: declaration must be a mapping", field=name))
            continue
        bad = set(decl) - DECL_KEYS
        if bad:
            problems.append(Problem("error", f"{STORE_YAML}: unknown declaration key(s) {sorted(bad)}",
                                    field=name, hint=f"known: {', '.join(sorted(DECL_KEYS))}"))
    if not location.local and doc.get("media_roots") is not None:
        problems.append(Problem("error", f"{STORE_YAML}: media_roots is for a store in a local folder; a store "
                                f"in object storage reads media under its own URL only ({location.url})",
                                hint="copy the media under the store's prefix and remove media_roots"))
        return decls, clock, ()
    media_roots = _media_roots(location.path, doc.get("media_roots"), problems) if location.local else ()
    return decls, clock, media_roots


def _media_roots(root: Path, value: Any, problems: list[Problem]) -> tuple[Path, ...]:
    """store.yaml `media_roots`: folders (absolute, or relative to the store) that symlinked or
    absolute media paths may resolve into. Without it, nothing a table names may leave the store."""
    if value is None:
        return ()
    hint = "write media_roots as a list of folders, e.g. `media_roots: [/data/videos]` (relative ones start at the store)"
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        problems.append(Problem("error", f"{STORE_YAML}: media_roots must be a list of folder paths, got {value!r}",
                                hint=hint))
        return ()
    roots = []
    for entry in value:
        folder = (root / entry).resolve()  # an absolute entry replaces root
        if not folder.is_dir():
            problems.append(Problem("error", f"{STORE_YAML}: media root {entry!r} is not a folder ({folder})",
                                    hint="create it, fix the path, or remove it from media_roots"))
            continue
        roots.append(folder)
    return tuple(roots)


def apply_declaration(spec: FieldSpec, decl: dict[str, Any], problems: list[Problem]) -> FieldSpec:
    """Overlay a declaration on the inferred spec, checking each declared value."""
    def bad(msg: str, hint: str | None = None) -> FieldSpec:
        problems.append(Problem("error", f"{STORE_YAML}: {msg}", field=spec.name,
                                hint=hint or f"fix the declaration of {spec.name!r} under fields in {STORE_YAML} "
                                             "(README, section store.yaml)"))
        return spec

    kind = decl.get("kind", spec.kind)
    if kind not in KINDS:
        return bad(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    series_only = sorted(k for k in SERIES_KEYS if k in decl)
    if series_only and kind != "timeseries":
        stored = ("a string column" if spec.arrow_type in ("string", "large_string")
                  else f"a {spec.arrow_type} column")
        return bad(f"declares {', '.join(series_only)}, which only a time series has, but the field is {stored} "
                   f"(kind {kind!r})",
                   hint="store a time series as list<list<float64>> rows [time, v1..vN] (not a JSON string), "
                        "or drop those keys")
    if kind != spec.kind and not (spec.kind in ("text", "image", "video") and kind in ("text", "image", "video")
                                  and spec.arrow_type in ("string", "large_string")):
        return bad(f"declared kind {kind!r} does not fit the column type {spec.arrow_type} (inferred {spec.kind!r})")
    interp = decl.get("interpolation", spec.interpolation if kind == spec.kind else "nearest")
    if kind == "timeseries" and interp not in METHODS:
        return bad(f"interpolation {interp!r} is not one of {', '.join(METHODS)}")
    order = decl.get("quaternion_order")
    if interp == "slerp" and order not in QUAT_ORDERS:
        return bad("slerp needs quaternion_order: xyzw or wxyz", hint="declare quaternion_order")
    time_unit = decl.get("time_unit", "s")
    if time_unit not in ("s", "ns"):
        return bad(f"time_unit {time_unit!r} must be s or ns")
    names = decl.get("names")
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        return bad("names must be a list of strings")
    units = decl.get("units")
    max_gap = decl.get("max_gap_s")
    if max_gap is not None and not (isinstance(max_gap, (int, float)) and not isinstance(max_gap, bool)
                                    and 0 < max_gap < float("inf")):
        return bad(f"max_gap_s must be a positive number, got {max_gap!r}")
    fps = decl.get("fps")
    if fps is not None and not (isinstance(fps, (int, float)) and not isinstance(fps, bool)
                                and 0 < fps < float("inf")):
        return bad(f"fps must be a positive number, got {fps!r}",
                   hint="frames per second of its video files, e.g. fps: 30")
    return FieldSpec(spec.name, spec.table, kind, spec.arrow_type,
                     interp if kind in ("timeseries", "video") else None, spec.value_dtype,
                     tuple(names) if names else None, tuple(units) if isinstance(units, list) else units,
                     float(max_gap) if max_gap is not None else None, time_unit,
                     order if interp == "slerp" else None, float(fps) if fps else spec.fps, declared=True,
                     layout=spec.layout)
