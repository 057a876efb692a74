"""HDF5 sources -> the conversion plan: which files, which episodes, which field each dataset becomes.

Opens each source file once (metadata only: names, shapes, dtypes, attributes; no array is read
except robomimic's `mask/*` demo lists and ALOHA's nothing), turns it into an outline, and applies the
pure rules of `layout` / `mapping`. The fields come from the first episode; every other
episode is checked against them when it is converted. Every problem found here is one `UserError`
naming the file (and episode), with the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from robowds.export.convert.episode_store import FieldSpec
from robowds.export.convert.hdf5.episode import EpisodeTask, Source, require_h5py
from robowds.export.convert.hdf5.layout import (ALOHA_DT_S, DatasetInfo, Outline, aloha_keys, aloha_names,
                                                detect_layout, episode_id, groups_of, natural_key,
                                                quaternion_declare, robomimic_demos, robomimic_keys,
                                                robomimic_rate, series_width, split_of_demos, step_kind,
                                                store_dtype, unique_fields)
from robowds.export.convert.hdf5.mapping import TIME_UNITS, HDF5Mapping, match_groups
from robowds.export.errors import UserError

SUFFIXES = (".hdf5", ".h5", ".he5")
MAPPING_HINT = "name the datasets with --layout mapping --mapping FILE (see docs/convert-hdf5.md)"


@dataclass
class Plan:
    """What `plan_hdf5` turns into a Conversion."""

    layout: str
    specs: list[FieldSpec]
    tasks: list[EpisodeTask]
    report: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Options:
    fps: float | None = None
    exclude: tuple[str, ...] = ()
    codec: str = "ffv1"
    split_masks: tuple[str, ...] | None = None  # None: robomimic's usual split names; (): none


def source_files(src: Path, patterns: Sequence[str] | None = None) -> list[Path]:
    """SRC as a list of files: the file itself, or a folder's HDF5 files (by suffix, or `patterns`) in
    natural order (episode_2 before episode_10)."""
    if not src.exists():
        raise UserError(f"{src} does not exist", hint="pass an HDF5 file or a folder of HDF5 files")
    if src.is_file():
        return [src]
    if patterns:
        files = {p for pattern in patterns for p in src.glob(pattern) if p.is_file()}
    else:
        files = {p for p in src.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES}
    if not files:
        raise UserError(f"{src}: no HDF5 file in this folder (looked for {', '.join(patterns or SUFFIXES)})",
                        hint="pass the file itself, or the folder holding the .hdf5/.h5 files")
    return sorted(files, key=lambda p: natural_key(p.name))


def _dtype_name(h5py: Any, dtype: np.dtype) -> str:
    vlen = h5py.check_vlen_dtype(dtype)
    if vlen is bytes:
        return "vlen-bytes"
    if vlen is not None and np.dtype(vlen) == np.uint8:
        return "vlen-uint8"
    if vlen is not None or h5py.check_string_dtype(dtype) is not None or dtype.kind in "SUO":
        return "str"
    return dtype.newbyteorder("=").name if dtype.kind in "biuf" else "other"


def read_outline(path: Path) -> tuple[dict[str, DatasetInfo], dict[str, Any], Any]:
    """(outline, root attributes, h5py module) of one file; not HDF5 or unreadable: UserError."""
    h5py = require_h5py()
    if not h5py.is_hdf5(path):
        raise UserError(f"{path} is not an HDF5 file", hint="pass a .hdf5/.h5 file written by h5py or HDF5")
    outline: dict[str, DatasetInfo] = {}
    try:
        with h5py.File(path, "r") as f:
            def visit(name: str, node: Any) -> None:
                if isinstance(node, h5py.Dataset):
                    outline[name] = DatasetInfo(tuple(int(n) for n in node.shape), _dtype_name(h5py, node.dtype))
            f.visititems(visit)
            attrs = dict(f.attrs)
    except OSError as exc:
        raise UserError(f"{path}: cannot read the HDF5 file: {exc}", hint="the file may be truncated: copy it again") from exc
    return outline, attrs, h5py


def _sources(outline: Outline, prefix: str, keys: list[tuple[str, str]], options: Options, where: str,
             aloha: bool, taken: Sequence[str] = ()) -> tuple[list[Source], list[FieldSpec]]:
    """Sources and field specs for (path relative to the episode, key) pairs of the first episode, less
    those `options.exclude` names by path, key or field name (a name that matches nothing is a typo)."""
    names = unique_fields([k for _, k in keys], taken)
    unknown = [e for e in options.exclude if e not in {x for p, k in keys for x in (p, k, names[k])}]
    if unknown:
        raise UserError(f"{where}: --exclude {unknown[0]!r} matches no dataset (keys: {sorted(names)})",
                        hint="name a dataset path, key or field name of the file")
    kept = [(p, k) for p, k in keys if not {p, k, names[k]} & set(options.exclude)]
    cameras = sorted(k for p, k in kept if aloha and p.startswith("observations/images/"))
    sources, specs = [], []
    for path, key in kept:
        info, name = outline[prefix + path], names[key]
        jpeg_rows = aloha and path.startswith("observations/images/") and info.dtype == "uint8" and len(info.shape) == 2
        kind = "video" if jpeg_rows else step_kind(info)
        if kind is None:
            raise UserError(f"{where}: dataset {path!r} ({info.dtype} {list(info.shape)}) is neither a time series "
                            "([T], [T, N] numbers) nor camera frames (uint8 [T, H, W, 3], or JPEG bytes per step)",
                            hint=f"leave it out with --exclude {key}")
        if kind == "timeseries":
            width = series_width(info)
            declare = quaternion_declare(key, width) if not aloha else {}
            sources.append(Source(name, kind, path, store_dtype(info.dtype), width))
            specs.append(FieldSpec(name, kind, store_dtype(info.dtype), aloha_names(key, width) if aloha else None,
                                   source=path, declare=declare))
        else:
            sources.append(Source(name, kind, path, info.dtype, jpeg_rows=jpeg_rows,
                                  lengths="compress_len" if jpeg_rows else None,
                                  lengths_row=cameras.index(key) if key in cameras else -1))
            specs.append(FieldSpec(name, "video", "uint8", source=path))
    if not sources:
        raise UserError(f"{where}: nothing left to convert", hint="exclude fewer datasets")
    return sources, specs


def _rate(options: Options, found: float | None, found_source: str, where: str, missing: str) -> tuple[float, str]:
    if options.fps is not None:
        if not options.fps > 0:
            raise UserError(f"--fps must be > 0, got {options.fps}", hint="the rate the episodes were recorded at, in Hz")
        return float(options.fps), "--fps"
    if found is None:
        raise UserError(f"{where}: no control rate: {missing}, and HDF5 stores no timestamps",
                        hint="pass --fps HZ, the rate the steps were recorded at")
    return found, found_source


def plan_robomimic(files: list[Path], options: Options) -> Plan:
    """robomimic: every `data/demo_*` of every file is an episode (id: the demo name, prefixed by the file
    stem when SRC holds several files); rate from `data.attrs["env_args"]`; split from `mask/*`."""
    specs: list[FieldSpec] = []
    sources: list[Source] = []
    tasks: list[EpisodeTask] = []
    masks_used: dict[str, int] = {}
    rates: set[float] = set()
    rate_source = ""
    for file in files:
        outline, _, h5py = read_outline(file)
        demos = robomimic_demos(outline)
        if not demos:
            raise UserError(f"{file}: no robomimic demo (data/<demo>/actions or data/<demo>/obs/)",
                            hint="convert files of one layout together, or " + MAPPING_HINT)
        with h5py.File(file, "r") as f:
            env_args = f["data"].attrs.get("env_args")
            num_samples = {d: f[f"data/{d}"].attrs.get("num_samples") for d in demos}
            masks = {name: [m.decode() if isinstance(m, bytes) else str(m) for m in np.asarray(ds[()]).ravel()]
                     for name, ds in (f["mask"].items() if "mask" in f else []) if isinstance(ds, h5py.Dataset)}
        rate, rate_source = _rate(options, robomimic_rate(env_args), "data.attrs['env_args'] env_kwargs.control_freq",
                                  str(file), "data.attrs['env_args'] has no env_kwargs.control_freq")
        rates.add(rate)
        chosen = options.split_masks
        try:
            splits = split_of_demos(masks, chosen)
        except ValueError as exc:
            raise UserError(f"{file}: {exc}", hint="choose the masks that split the demos with --split-mask NAME") from exc
        if chosen:
            absent = [m for m in chosen if m not in masks]
            if absent:
                raise UserError(f"{file}: --split-mask {absent[0]!r} is not one of its masks {sorted(masks)}",
                                hint="name a mask of the file, or leave --split-mask out")
        for name in set(splits.values()):
            masks_used[name] = masks_used.get(name, 0) + sum(1 for s in splits.values() if s == name)
        if not specs:
            sources, specs = _sources(outline, f"data/{demos[0]}/", robomimic_keys(outline, demos[0]), options,
                                      f"{file} (demo {demos[0]})", aloha=False, taken=("split",))
        for demo in demos:
            eid = episode_id(demo if len(files) == 1 else f"{file.stem}_{demo}")
            n = num_samples[demo]
            tasks.append(EpisodeTask(file, f"data/{demo}", eid, f"demo {demo}", tuple(sources), rate,
                                     split=splits.get(demo), codec=options.codec,
                                     num_samples=int(n) if n is not None else None))
    if len(rates) > 1:
        raise UserError(f"the files have different control rates {sorted(rates)} Hz",
                        hint="convert each rate into its own store, or pass --fps")
    if masks_used:
        specs.append(FieldSpec("split", "text", "str", source="mask/" + ",".join(sorted(masks_used))))
    return Plan("robomimic", specs, tasks, {"rate_hz": rates.pop(), "rate_source": rate_source, "masks": masks_used})


def plan_aloha(files: list[Path], options: Options) -> Plan:
    """ALOHA/ACT: each file is one episode (id: the file stem); 50 Hz (DT = 0.02 s) unless --fps."""
    outline, attrs, _ = read_outline(files[0])
    if detect_layout(outline) != "aloha":
        raise UserError(f"{files[0]}: not an ALOHA episode (no /observations/qpos and /action)",
                        hint="convert files of one layout together, or " + MAPPING_HINT)
    rate, rate_source = _rate(options, 1.0 / ALOHA_DT_S, "ALOHA DT = 0.02 s", str(files[0]), "")
    sources, specs = _sources(outline, "", aloha_keys(outline), options, str(files[0]), aloha=True)
    tasks = [EpisodeTask(file, "", episode_id(file.stem), "episode file", tuple(sources), rate, codec=options.codec)
             for file in files]
    return Plan("aloha", specs, tasks, {"rate_hz": rate, "rate_source": rate_source,
                                        "sim": bool(attrs.get("sim", False)), "compress": bool(attrs.get("compress", False))})


def plan_mapping(files: list[Path], mapping: HDF5Mapping, where_mapping: str, options: Options) -> Plan:
    """The generic mode: `mapping.episodes` groups of every file, fields as the mapping names them."""
    if options.exclude:
        raise UserError(f"--exclude does not apply with a mapping ({where_mapping})",
                        hint="leave the field out of the mapping instead")
    if mapping.time is not None and options.fps is not None:
        raise UserError(f"{where_mapping}: --fps and a time dataset ({mapping.time}) both give the times",
                        hint="drop --fps, or replace time with rate_hz in the mapping")
    rate, rate_source, ticks = None, f"time dataset {mapping.time!r} ({mapping.time_unit})", TIME_UNITS[mapping.time_unit]
    if mapping.time is None:
        rate, rate_source = _rate(options, mapping.rate_hz, "mapping rate_hz", where_mapping,
                                  "the mapping has neither rate_hz nor time")
    sources: list[Source] = []
    specs: list[FieldSpec] = []
    tasks: list[EpisodeTask] = []
    ids: set[str] = set()
    for file in files:
        outline, _, h5py = read_outline(file)
        groups = match_groups(mapping.episodes, groups_of(outline))
        if not groups:
            raise UserError(f"{file}: the mapping's episodes {mapping.episodes or '/'!r} match no group",
                            hint="set episodes to the groups that hold one episode each, e.g. data/demo_*")
        if not specs:
            sources, specs = _mapped_sources(outline, groups[0], mapping, file, h5py)
        for group in groups:
            base = episode_id(file.stem if not group else group if len(files) == 1 else f"{file.stem}_{group}")
            eid, k = base, 2
            while eid in ids:
                eid, k = f"{base}_{k}", k + 1
            ids.add(eid)
            tasks.append(EpisodeTask(file, group, eid, f"group {group or '/'}", tuple(sources), rate, mapping.time,
                                     ticks, codec=options.codec))
    return Plan("mapping", specs, tasks, {"rate_hz": rate, "rate_source": rate_source, "episode_groups": mapping.episodes or "/"})


def _mapped_sources(outline: Outline, group: str, mapping: HDF5Mapping, file: Path,
                    h5py: Any) -> tuple[list[Source], list[FieldSpec]]:
    prefix = f"{group}/" if group else ""
    where = f"{file} (group {group or '/'})"
    sources, specs = [], []
    for name in [t for t in (mapping.time,) if t] + [f.time for f in mapping.fields if f.time]:
        if prefix + name not in outline:
            raise UserError(f"{where}: the mapping's time dataset {name!r} does not exist",
                            hint="fix the time path in the mapping (relative to the episode group)")
    for mf in mapping.fields:
        if mf.attr is not None:
            with h5py.File(file, "r") as f:
                present = mf.attr in (f[group] if group else f).attrs
            if not present:
                raise UserError(f"{where}: the mapping's field {mf.name!r} names attribute {mf.attr!r}, which "
                                "the episode group does not have", hint="fix the attr in the mapping")
            sources.append(Source(mf.name, "text", mf.attr))
            specs.append(FieldSpec(mf.name, "text", "str", source=f"@{mf.attr}"))
            continue
        info = outline.get(prefix + mf.path)
        if info is None:
            held = sorted(p[len(prefix):] for p in outline if p.startswith(prefix))
            raise UserError(f"{where}: the mapping's field {mf.name!r} names dataset {mf.path!r}, which does not "
                            f"exist (the group holds {held[:12]})", hint="fix the path in the mapping")
        kind = step_kind(info)
        declare = dict(mf.declare)
        jpeg_rows = mf.video and info.dtype == "uint8" and len(info.shape) == 2
        if kind is None:
            raise UserError(f"{where}: dataset {mf.path!r} of field {mf.name!r} ({info.dtype} {list(info.shape)}) is "
                            "neither a time series nor camera frames", hint="map another dataset, or leave it out")
        if jpeg_rows or kind == "video":
            sources.append(Source(mf.name, "video", mf.path, info.dtype, time=mf.time, jpeg_rows=jpeg_rows))
            specs.append(FieldSpec(mf.name, "video", "uint8", source=mf.path))
        else:
            width = series_width(info)
            if mf.names is not None and len(mf.names) != width:
                raise UserError(f"{where}: field {mf.name!r} has {len(mf.names)} names for {width} values per step",
                                hint="give one name per value, or none")
            sources.append(Source(mf.name, "timeseries", mf.path, store_dtype(info.dtype), width, time=mf.time))
            specs.append(FieldSpec(mf.name, "timeseries", store_dtype(info.dtype), mf.names, source=mf.path,
                                   declare=declare))
    return sources, specs
