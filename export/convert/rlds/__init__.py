"""RLDS / TFDS TFRecord datasets (Open X-Embodiment) -> an episode store, exactly, without TensorFlow.

Layout read (TFDS): a version folder holding `features.json` (the feature spec), `dataset_info.json`
(name, splits, shard lengths; optional) and `<name>-<split>.tfrecord-XXXXX-of-YYYYY` files, each a
sequence of records, one `tf.train.Example` per episode (`records`).

Mapping (one store row per episode, `episode_id` = `<split>_<file number:05d>_<record:06d>`):
- every numeric step feature -> a typed time series `{t, v}`, `t = (step - first step) / fps` in
  float64, `v` [T, N] in the declared dtype (float32 stays float32; bool/int interpolate `hold`);
- a per-step string constant over the episode (`language_instruction`) -> a text field;
- per-step images -> one video per episode and camera in `media/<field>/<episode_id>.mkv`: JPEG frames
  muxed byte for byte as MJPEG (decoded frames are the source's own JPEG decodes, bit-exact), other
  images (PNG) decoded and encoded with `image_codec` (FFV1, lossless, by default);
- episode features (`episode_metadata/*`) -> text (strings) or value fields (`episode_<name>`).
`is_first` / `is_last` cut the episode out of the record when set (`episode_spans`).

One task per record (its file and byte range, found from the record headers at plan time), so workers
split files. Memory: one record at a time per worker.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robowds.export.convert.episode_store import FieldSpec
from robowds.export.convert.rlds.features import (KNOWN_FPS, Feature, constant_text, episode_spans, read_features,
                                                  step_count, step_values, texts)
from robowds.export.convert.rlds.records import RecordRef, parse_example, read_record, scan_records
from robowds.export.convert.run import Conversion, run_conversion
from robowds.export.errors import UserError

IMAGE_CODECS = ("ffv1", "mjpeg")
SHARD = re.compile(r"^(?P<name>.+)-(?P<split>[^-.]+)\.tfrecord(?:-\d+-of-\d+)?$")
JPEG_SOI = b"\xff\xd8\xff"


@dataclass(frozen=True)
class RecordTask:
    """One record to convert: where it is and how to map it (picklable, a few hundred bytes)."""

    path: Path
    name: str  # the file relative to the dataset folder, for messages
    index: int  # the record's number in its file
    episode_id: str
    ref: RecordRef | None  # None: the record cannot be located (`problem` says why)
    problem: str | None
    features: tuple[Feature, ...]  # the features to convert (excluded ones left out)
    fps: float
    image_codec: str
    whole_records: bool


def find_dataset(src: Path) -> Path:
    """The TFDS version folder at or under `src` (the one holding features.json, at most 3 levels
    down: `bridge_dataset/1.0.0/` from its parent's parent)."""
    if not src.exists():
        raise UserError(f"{src} does not exist", hint="pass the RLDS dataset's folder (holding features.json)")
    if (src / "features.json").is_file():
        return src
    found = sorted({p.parent for depth in ("*/", "*/*/", "*/*/*/") for p in src.glob(depth + "features.json")})
    if len(found) == 1:
        return found[0]
    if found:
        raise UserError(f"{src} holds {len(found)} RLDS datasets: {', '.join(str(p) for p in found[:5])}",
                        hint="pass one of these folders")
    records = sorted(p for depth in ("", "*/", "*/*/") for p in src.glob(depth + "*.tfrecord*"))
    if records:
        raise UserError(f"{records[0].parent / 'features.json'} is missing (TFRecords without their feature spec)",
                        hint="copy features.json (and dataset_info.json), which TFDS writes beside the "
                             "*.tfrecord-* files, from the dataset's download")
    raise UserError(f"{src} is not an RLDS dataset: no features.json in it or its sub-folders",
                    hint="pass the folder holding features.json and the *.tfrecord-* files")


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not readable JSON: {exc}", hint="download it again") from exc
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a JSON object", hint="download it again")
    return data


def split_files(root: Path, info: dict[str, Any], split: str) -> dict[str, list[Path]]:
    """split -> its TFRecord files in shard order (`<name>-<split>.tfrecord-*`); `split` "all" gives
    every split found."""
    if str(info.get("fileFormat", "tfrecord")) != "tfrecord":
        raise UserError(f"{root / 'dataset_info.json'}: fileFormat {info['fileFormat']!r} is not TFRecord",
                        hint="this converter reads TFRecord datasets; rebuild it with file_format='tfrecord'")
    shards = [(path, m) for path in sorted(root.iterdir()) if path.is_file() and (m := SHARD.match(path.name))]
    name = info.get("name")
    named = any(m["name"] == name for _, m in shards)  # else files renamed since dataset_info.json: take all
    found: dict[str, list[Path]] = {}
    for path, match in shards:
        if not named or match["name"] == name:
            found.setdefault(match["split"], []).append(path)
    if split == "all":
        return found
    if split not in found:
        listed = ", ".join(sorted(found)) or "none"
        raise UserError(f"{root}: no records of split {split!r}: no file named "
                        f"{name or '<name>'}-{split}.tfrecord-* (splits with files: {listed})",
                        hint="pass --split with a split that has files, or download that split's TFRecords")
    return {split: found[split]}


def dataset_fps(info: dict[str, Any], root: Path, fps: float | None) -> tuple[float, str]:
    """The step rate and where it came from: --fps, else the known rate of this Open-X dataset."""
    if fps is not None:
        if not fps > 0:
            raise UserError(f"--fps must be > 0, got {fps}", hint="the dataset's control rate in Hz, e.g. --fps 5")
        return float(fps), "--fps"
    name = str(info.get("name") or root.parent.name)
    if name in KNOWN_FPS:
        return KNOWN_FPS[name], f"known rate of {name}"
    raise UserError(f"{root}: RLDS stores no step times and the rate of dataset {name!r} is not known",
                    hint="pass its control rate with --fps (Hz), e.g. --fps 10")


def plan_rlds(src: Path, fps: float | None = None, split: str = "train", exclude: tuple[str, ...] = (),
              image_codec: str = "ffv1", whole_records: bool = False) -> Conversion:
    """The conversion of the RLDS dataset at `src` (its version folder, or a folder above it): its
    fields from features.json and one task per record of the chosen split(s). `exclude`: feature keys
    (`steps/observation/image_3`, `observation/image_3`) or field names not to convert."""
    root = find_dataset(Path(src).resolve())
    if image_codec not in IMAGE_CODECS:
        raise UserError(f"--image-codec {image_codec!r} is not one of {', '.join(IMAGE_CODECS)}",
                        hint="ffv1 is lossless; mjpeg is lossy and smaller")
    info = _json(root / "dataset_info.json") if (root / "dataset_info.json").is_file() else {}
    features = read_features(_json(root / "features.json"), str(root / "features.json"))
    names = {f.key for f in features} | {f.key.removeprefix("steps/") for f in features} | {f.field for f in features}
    unknown = [x for x in exclude if x not in names]
    if unknown:
        raise UserError(f"--exclude {unknown[0]!r}: no such feature in {root / 'features.json'}",
                        hint="features: " + ", ".join(f.key for f in features))
    kept = tuple(f for f in features if not {f.key, f.key.removeprefix("steps/"), f.field} & set(exclude))
    for f in kept:
        if f.problem:
            raise UserError(f"{root / 'features.json'}: feature {f.key!r} cannot be mapped to a store field: {f.problem}",
                            hint=f"leave it out with --exclude {f.key}")
    rate, rate_source = dataset_fps(info, root, fps)
    files = split_files(root, info, split)
    if rate > 1000 and any(f.kind == "video" for f in kept):
        raise UserError(f"--fps {rate:g}: camera frames more than 1000 per second apart cannot be stored "
                        "(Matroska times are milliseconds)", hint="check --fps, or --exclude the cameras")
    tasks, notes = [], []
    for split_name, paths in files.items():
        found = 0
        for number, path in enumerate(paths):
            try:
                refs, problem = scan_records(path)
            except OSError as exc:
                raise UserError(f"cannot read {path}: {exc}", hint="check the file's permissions") from exc
            found += len(refs)
            rel = path.relative_to(root).as_posix()
            tasks += [RecordTask(path, rel, r.index, f"{split_name}_{number:05d}_{r.index:06d}", r, None, kept,
                                 rate, image_codec, whole_records) for r in refs]
            if problem:  # converted as a failing task: the message names it, --skip-bad goes on
                tasks.append(RecordTask(path, rel, len(refs), f"{split_name}_{number:05d}_{len(refs):06d}", None,
                                        f"{path}: {problem}", kept, rate, image_codec, whole_records))
        notes += _shard_length_notes(info, split_name, len(paths), found)
    if not tasks:
        raise UserError(f"{root}: the {'/'.join(files) or split} TFRecord files hold no records: "
                        + ", ".join(p.name for paths in files.values() for p in paths),
                        hint="the files are empty (an interrupted download?): download them again")
    specs = [FieldSpec(f.field, f.kind, f.dtype, source=f.key) for f in kept]
    return Conversion("rlds", root, specs, tasks, convert_record, lambda t: f"record {t.index} of {t.name}",
                      report={"dataset": info.get("name", root.parent.name), "version": root.name,
                              "splits": sorted(files), "fps": rate, "fps_source": rate_source,
                              "image_codec": image_codec, "excluded": sorted(exclude),
                              "whole_records": whole_records, "dataset_notes": notes})


def _shard_length_notes(info: dict[str, Any], split: str, files: int, found: int) -> list[str]:
    """dataset_info.json's record count of a split against the records found (a partial download)."""
    splits = info.get("splits")
    listed = next((s for s in splits if isinstance(s, dict) and s.get("name") == split), None) \
        if isinstance(splits, list) else None
    if not listed or not isinstance(listed.get("shardLengths"), list):
        return []
    try:
        expected = sum(int(n) for n in listed["shardLengths"])
    except (TypeError, ValueError):
        return [f"split {split}: dataset_info.json's shardLengths are not numbers: {listed['shardLengths']!r}"]
    if (expected, len(listed["shardLengths"])) == (found, files):
        return []
    return [f"split {split}: dataset_info.json lists {expected} records in {len(listed['shardLengths'])} files; "
            f"found {found} in {files}"]


def convert_record(task: RecordTask, folder: Path) -> dict[str, Any]:
    """One store row from one record: time series, texts, values, and one video per camera."""
    where = f"{task.path}: record {task.index}"
    if task.ref is None:
        raise UserError(task.problem or where, hint="download this TFRecord file again, or pass --skip-bad")
    raw = parse_example(read_record(task.path, task.ref), where)
    missing = [f.key for f in task.features if f.key not in raw]
    if missing:
        raise UserError(f"{where}: feature {missing[0]!r} of features.json is not in the record",
                        hint=f"leave it out with --exclude {missing[0]}, or pass --skip-bad")
    for f in task.features:
        _check_stored_kind(raw[f.key], f, where)
    steps = step_count(raw, task.features, where)
    lo, hi, notes = _episode_steps(raw, steps, task, where)
    if hi - lo < 2:
        raise UserError(f"{where}: the episode has {hi - lo} step(s); a time series needs at least 2",
                        hint="pass --skip-bad to leave it out")
    t = np.arange(hi - lo, dtype=np.float64) / task.fps  # [T'] seconds from the episode's first step
    row: dict[str, Any] = {"episode_id": task.episode_id}
    for f in task.features:
        values = raw[f.key]
        if not f.step:
            row[f.field] = _episode_value(values, f, where)
        elif f.kind == "timeseries":
            row[f.field] = {"t": t, "v": step_values(values, f, steps, where)[lo:hi]}  # v: [T', N]
        elif f.kind == "text":
            row[f.field] = _step_text(values, f, steps, where, lo, hi)
        else:
            row[f.field] = _video(values[lo:hi] if len(values) == steps else values, f, t, folder, task, where)
    if notes:
        row["_notes"] = notes
    return row


def _check_stored_kind(values: Any, f: Feature, where: str) -> None:
    """Images, texts and byte-encoded tensors are stored as bytes_list, other numbers as float/int64
    lists: anything else does not match features.json."""
    as_bytes = f.kind in ("video", "text") or f.encoding in ("bytes", "zlib")
    if as_bytes != isinstance(values, list) and len(values):
        stored = "byte strings" if isinstance(values, list) else f"{values.dtype} numbers"
        raise UserError(f"{where}: feature {f.key!r} holds {stored}, not what features.json declares "
                        f"({f.kind}, {f.dtype})", hint=f"leave it out with --exclude {f.key}, or pass --skip-bad")


def _episode_steps(raw: dict[str, Any], steps: int, task: RecordTask, where: str) -> tuple[int, int, list[str]]:
    """The record's steps [lo, hi) that are the episode, and a note when some were left out."""
    if task.whole_records:
        return 0, steps, []
    spans = episode_spans(raw.get("steps/is_first"), raw.get("steps/is_last"), steps)
    if len(spans) > 1:
        raise UserError(f"{where}: is_first/is_last mark {len(spans)} episodes in one record (steps "
                        + ", ".join(f"{a}-{b - 1}" for a, b in spans[:4]) + ")",
                        hint="convert each record whole with --whole-records, or pass --skip-bad")
    lo, hi = spans[0] if spans else (0, steps)  # no span: a record of no steps
    notes = [] if (lo, hi) == (0, steps) else [
        f"{task.episode_id} ({task.name}, record {task.index}): steps {lo}-{hi - 1} of {steps} kept "
        "(the others are outside is_first..is_last)"]
    return lo, hi, notes


def _episode_value(values: Any, f: Feature, where: str) -> Any:
    """An episode feature: its text, or its value (a scalar, or a 1-D array for a tensor)."""
    if f.kind == "text":
        decoded = texts(values, f, where)
        if len(decoded) != 1:
            raise UserError(f"{where}: episode feature {f.key!r} holds {len(decoded)} strings, not one",
                            hint=f"leave it out with --exclude {f.key}")
        return decoded[0]
    array = step_values(values, f, 1, where)[0]  # [N]
    return array[0] if f.shape == () else array


def _step_text(values: Any, f: Feature, steps: int, where: str, lo: int, hi: int) -> str:
    decoded = texts(values, f, where)
    if len(decoded) != steps:
        raise UserError(f"{where}: feature {f.key!r} has {len(decoded)} strings for {steps} steps",
                        hint=f"leave it out with --exclude {f.key}, or pass --skip-bad")
    text = constant_text(decoded[lo:hi])
    if text is None:
        raise UserError(f"{where}: text feature {f.key!r} changes within the episode (the store holds one "
                        "text per episode)", hint=f"leave it out with --exclude {f.key}")
    return text


def _video(images: list[bytes], f: Feature, t: np.ndarray, folder: Path, task: RecordTask,
           where: str) -> dict[str, Any]:
    """One camera's images of the episode -> `media/<field>/<episode_id>.mkv` and its video struct.
    All JPEG: muxed as they are; otherwise decoded (Pillow) and encoded with `task.image_codec`."""
    from robowds.export.media.encode import encode_frames, mux_jpegs

    if len(images) != len(t):
        raise UserError(f"{where}: camera {f.key!r} has {len(images)} images for {len(t)} steps",
                        hint=f"leave it out with --exclude {f.key}, or pass --skip-bad")
    path = folder / "media" / f.field / f"{task.episode_id}.mkv"
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = None
    if all(bytes(b[:3]) == JPEG_SOI for b in images):
        width, height = _jpeg_size(images, f, where)
        offset = mux_jpegs(images, t, path, width, height)
    else:
        frames = _decode_images(images, f, where)  # [T, H, W, 3] uint8
        offset = encode_frames(frames, t, path, codec=task.image_codec)
    return {"path": path.relative_to(folder).as_posix(), "fps": task.fps, "start_s": None, "end_s": None,
            "clock_offset_s": offset}


def _jpeg_size(images: list[bytes], f: Feature, where: str) -> tuple[int, int]:
    """(width, height) of the JPEGs from their headers; every frame must have the same size."""
    from PIL import Image, UnidentifiedImageError

    sizes = set()
    for k, data in enumerate(images):
        try:
            sizes.add(Image.open(io.BytesIO(data)).size)
        except (UnidentifiedImageError, OSError) as exc:
            raise UserError(f"{where}: image {k} of camera {f.key!r} is not a readable JPEG ({exc})",
                            hint=f"leave the camera out with --exclude {f.key}, or pass --skip-bad") from exc
    if len(sizes) != 1:
        raise UserError(f"{where}: camera {f.key!r} changes image size within the episode ({sorted(sizes)})",
                        hint=f"leave the camera out with --exclude {f.key}, or pass --skip-bad")
    return sizes.pop()


def _decode_images(images: list[bytes], f: Feature, where: str) -> np.ndarray:
    """Encoded images (PNG...) -> [T, H, W, 3] uint8 RGB (grey repeated into 3 channels, exactly)."""
    from PIL import Image, UnidentifiedImageError

    frames = []
    for k, data in enumerate(images):
        try:
            image = Image.open(io.BytesIO(data))
            image.load()
        except (UnidentifiedImageError, OSError) as exc:
            raise UserError(f"{where}: image {k} of camera {f.key!r} cannot be decoded ({exc})",
                            hint=f"leave the camera out with --exclude {f.key}, or pass --skip-bad") from exc
        if image.mode not in ("RGB", "L", "P"):
            raise UserError(f"{where}: image {k} of camera {f.key!r} is {image.mode} (videos take RGB or grey)",
                            hint=f"leave the camera out with --exclude {f.key}")
        frames.append(np.asarray(image.convert("RGB")))  # [H, W, 3]; grey and palette exactly
    if len({a.shape for a in frames}) != 1:
        raise UserError(f"{where}: camera {f.key!r} changes image size within the episode",
                        hint=f"leave the camera out with --exclude {f.key}, or pass --skip-bad")
    return np.stack(frames)


def convert_rlds(src: Path, store: Path, overwrite: bool = False, progress: bool = False, workers: int = 1,
                 skip_bad: bool = False, fps: float | None = None, split: str = "train",
                 exclude: tuple[str, ...] = (), image_codec: str = "ffv1",
                 whole_records: bool = False) -> dict[str, Any]:
    """Convert the RLDS dataset at `src` into a new episode store at `store`; returns the report (also
    written as `store/convert_report.json`). `progress`: a bar over episodes on stderr."""
    return run_conversion(plan_rlds(src, fps, split, exclude, image_codec, whole_records), Path(store),
                          overwrite=overwrite, workers=workers, skip_bad=skip_bad, progress=progress)
