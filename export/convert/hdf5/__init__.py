"""HDF5 robot datasets (robomimic, ALOHA/ACT, or any layout through a YAML mapping) -> an episode store.

Layouts (detected from the first file, or named with `layout`):
- robomimic: one file, `data/<demo>/obs/<key>`, `actions`, `rewards`, `dones`, `states` per demo (one
  episode each, id = the demo name), `data.attrs["env_args"]` JSON with `env_kwargs.control_freq` (the
  rate), `mask/<name>` demo lists -> the store's `split` column;
- ALOHA/ACT: one file per episode (id = the file stem), `/observations/qpos|qvel|effort` and `/action`
  (14 joints, named as ALOHA names them), `/observations/images/<cam>` raw or JPEG per step; 50 Hz
  (ALOHA's DT = 0.02 s);
- mapping: a YAML file naming the episode groups, the datasets of each field and the rate or a time
  dataset (`mapping`).

These formats store no timestamps: step k sits at `k / rate` seconds (float64, from the integer k), the
rate from the file's attributes, the mapping, or `fps` (which overrides them). Camera frames become one
video per episode and camera in the store: raw arrays losslessly (FFV1, or `image_codec`), JPEG bytes
muxed as MJPEG byte for byte. Modules: `layout` (pure rules), `mapping` (the YAML),
`frames` (camera frames), `plan` (files -> plan), `episode` (one episode, in a worker).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from robowds.export.convert.hdf5.episode import EpisodeTask, convert_episode
from robowds.export.convert.hdf5.layout import LAYOUTS, detect_layout
from robowds.export.convert.hdf5.mapping import HDF5Mapping, parse_mapping
from robowds.export.convert.hdf5.plan import (MAPPING_HINT, Options, plan_aloha, plan_mapping, plan_robomimic,
                                              read_outline, source_files)
from robowds.export.convert.run import Conversion, run_conversion
from robowds.export.errors import UserError


def load_mapping(path: Path) -> HDF5Mapping:
    """The YAML mapping file at `path`, parsed; any problem is one UserError naming the file."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise UserError(f"mapping {path}: cannot read it: {exc.strerror or exc}", hint="pass an existing YAML file") from exc
    except yaml.YAMLError as exc:
        raise UserError(f"mapping {path} is not valid YAML: {exc}", hint="see docs/convert-hdf5.md for the format") from exc
    try:
        return parse_mapping(data)
    except ValueError as exc:
        raise UserError(f"mapping {path}: {exc}", hint="see docs/convert-hdf5.md for the format") from exc


def _describe(task: EpisodeTask) -> str:
    return task.where


def plan_hdf5(src: Path, layout: str | None = None, mapping: Path | None = None, fps: float | None = None,
              exclude: tuple[str, ...] = (), image_codec: str = "ffv1",
              split_masks: tuple[str, ...] | None = None) -> Conversion:
    """The conversion of the HDF5 file or folder at `src`. `layout`: robomimic | aloha | mapping (None:
    detected; `mapping` given: mapping). `exclude`: dataset paths, keys or field names left out.
    `split_masks`: robomimic masks that become the split column (None: train/valid/val/test... present)."""
    src = Path(src).resolve()
    if layout is not None and layout not in LAYOUTS:
        raise UserError(f"unknown layout {layout!r}", hint=f"choose one of {', '.join(LAYOUTS)}")
    if mapping is not None and layout not in (None, "mapping"):
        raise UserError(f"--mapping goes with --layout mapping, not {layout}", hint="drop --layout or --mapping")
    if layout == "mapping" and mapping is None:
        raise UserError("--layout mapping needs --mapping FILE", hint="write the YAML mapping (docs/convert-hdf5.md)")
    options = Options(fps, tuple(exclude), image_codec, split_masks)
    parsed = load_mapping(mapping) if mapping is not None else None
    files = source_files(src, parsed.files if parsed is not None and src.is_dir() else None)
    if parsed is not None:
        plan = plan_mapping(files, parsed, f"mapping {mapping}", options)
    else:
        if layout is None:
            outline, _, _ = read_outline(files[0])
            layout = detect_layout(outline)
            if layout is None:
                top = sorted({p.split("/")[0] for p in outline})
                raise UserError(f"{files[0]}: unknown HDF5 layout: neither robomimic (data/<demo>/actions) nor "
                                f"ALOHA (/observations/qpos and /action); top level: {top[:12]}", hint=MAPPING_HINT)
        plan = plan_robomimic(files, options) if layout == "robomimic" else plan_aloha(files, options)
    if split_masks and plan.layout != "robomimic":
        raise UserError("--split-mask applies to robomimic files only", hint="drop --split-mask")
    report = {"layout": plan.layout, "files": len(files), "excluded": sorted(exclude), "image_codec": image_codec,
              **plan.report}
    return Conversion("hdf5", src, plan.specs, plan.tasks, convert_episode, _describe, report=report)


def convert_hdf5(src: Path, store: Path, overwrite: bool = False, progress: bool = False, workers: int = 1,
                 skip_bad: bool = False, **options: Any) -> dict[str, Any]:
    """Convert the HDF5 file or folder at `src` into a new episode store at `store` (options: those of
    `plan_hdf5`); returns the report (also written as `store/convert_report.json`)."""
    return run_conversion(plan_hdf5(src, **options), Path(store), overwrite=overwrite, workers=workers,
                          skip_bad=skip_bad, progress=progress)
