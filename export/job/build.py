"""The map step's core: one episode's raw data -> its windows as encoded sample blobs. Pure.

Memory is bounded by one episode's streams plus one chunk of `CHUNK_ANCHORS` windows, whatever the
episode length. The chunking is fixed, so results (blobs and statistics) do not depend on workers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from robowds.export.core.extent import ExtentError, episode_extent
from robowds.export.core.plausible import (MAX_EPISODE_S, DiskSpaceError, Implausible, extent_problem, period_problem,
                                           size_problem, space_problem)
from robowds.export.core.precision import float32_loss
from robowds.export.core.relative import RelativeSpec, relative_stats
from robowds.export.core.resample import Stream, StreamError, clean_stream, resample
from robowds.export.core.stats import FieldStats, StatsError, merge_all
from robowds.export.core.windows import (StreamWindow, anchor_frames, grid_frame_count, pad_invalid, query_times,
                                         valid_fraction)
from robowds.export.errors import EpisodeError
from robowds.export.media.frames import MISSING_FRAMES_LIMIT, VideoError, VideoReadError, VideoSizeError
from robowds.export.output.sizes import source_bytes, window_bytes
from robowds.export.store.episodes import EpisodeData
from robowds.reader.format import encode_npy, encode_sample, mask_field
from robowds.reader.npz import laid_out

if TYPE_CHECKING:
    from robowds.export.media.images import ImageOptions
    from robowds.export.media.video_windows import VideoOptions, VideoWindows

CHUNK_ANCHORS = 1024
VIDEO_CHUNK_ANCHORS = 64  # decoded frames held at once stay ~ (64 + window) per camera
# query times per chunk (all streams' steps x anchors): bounds a chunk's arrays to ~32 MB each when
# windows are very long (rate_hz 1e6); every config with <= 4096 steps per window keeps full chunks
CHUNK_QUERIES = CHUNK_ANCHORS * 4096


@dataclass(frozen=True)
class BuildSpec:
    """What turning an episode into windows depends on (besides the episode itself); picklable."""

    fps: float
    stride: int
    min_valid_fraction: float
    float_dtype: str
    strict_timestamps: bool
    max_gap_factor: float
    windows: dict[str, StreamWindow]  # time-series field -> window
    value_dtypes: dict[str, str]  # time-series field -> source value dtype
    static_fields: tuple[str, ...]  # text, image, value fields carried by every window
    clock: str | None  # the store's declared clock stream (loaded even when not exported)
    clock_interpolation: str = "linear"
    videos: dict[str, tuple[StreamWindow, "VideoOptions"]] = field(default_factory=dict)
    images: dict[str, "ImageOptions"] = field(default_factory=dict)  # image field -> encoding (default original)
    max_episode_s: float = MAX_EPISODE_S  # longer extents are refused (export/core/plausible.py)
    dtypes: dict[str, str] = field(default_factory=dict)  # time-series field -> `streams.<field>.dtype` override
    widths: dict[str, int] = field(default_factory=dict)  # time-series field -> N, for episodes that lack it
    layout: str = "members"  # shard.layout: members | npz (every .npy member packed into arrays.npz)
    relative: tuple[RelativeSpec, ...] = ()  # `stats.relative`: relative-action statistics entries


@dataclass
class EpisodeWindows:
    """The windows of one episode plus what the manifest needs to know about them."""

    anchors: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    stats: dict[str, FieldStats | None] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)


def output_dtype(spec: BuildSpec, name: str) -> np.dtype:
    """A field's `streams.<field>.dtype` if set; else interpolated and float fields use `float_dtype`,
    integer/bool fields held or nearest keep theirs."""
    if name in spec.dtypes:
        return np.dtype(spec.dtypes[name])
    source = np.dtype(spec.value_dtypes[name])
    if spec.windows[name].interpolation in ("linear", "slerp") or source.kind == "f":
        return np.dtype(spec.float_dtype)
    return source


def _clean(data: EpisodeData, spec: BuildSpec) -> dict[str, Stream]:
    streams = {}
    for name, raw in data.streams.items():
        if name not in spec.windows:
            continue
        try:
            streams[name] = clean_stream(raw, spec.windows[name].interpolation, strict=spec.strict_timestamps)
        except StreamError as exc:
            raise EpisodeError(data.episode_id, name, str(exc), hint=exc.hint) from exc
    return streams


def _refuse(data: EpisodeData, name: str | None, problem: Implausible | None) -> None:
    if problem is not None:
        raise EpisodeError(data.episode_id, name, problem.message, hint=problem.hint)


def build_extent(data: EpisodeData, streams: dict[str, Stream], spec: BuildSpec,
                 cameras: list[tuple[float, float]], camera_resolution: float = 0.0) -> tuple[float, float, float]:
    """[start, end] of the episode by the one rule of `robowds.export.core.extent` (validate uses it too), and the
    resolution (s) of the clocks that gave them, for the grid count.

    `camera_resolution`: the coarsest pts unit of the cameras (Matroska/webm: 1 ms). It counts only when
    the cameras give the extent (no time series, no declared end): the last of 18 frames at 15 fps is
    stored at 1.133 s, 0.33 ms before its grid point, which must still count.

    The clock stream counts even when it is not exported (it is loaded for this alone). Implausible
    sample periods and extents (`robowds.export.core.plausible`) are refused here, before any window exists."""
    series = {n: (float(s.times[0]), float(s.times[-1])) for n, s in streams.items()}
    resolutions = [s.resolution for s in streams.values()]
    for name, stream in streams.items():
        _refuse(data, name, period_problem(stream.median_period))
    if spec.clock is not None and spec.clock not in series and spec.clock in data.streams:
        try:
            clock = clean_stream(data.streams[spec.clock], spec.clock_interpolation, strict=spec.strict_timestamps)
        except StreamError as exc:
            raise EpisodeError(data.episode_id, spec.clock, f"{exc} (this stream is the declared clock)",
                               hint="fix its timestamps, or remove `clock` from store.yaml") from exc
        series[spec.clock] = (float(clock.times[0]), float(clock.times[-1]))
        resolutions.append(clock.resolution)
        _refuse(data, spec.clock, period_problem(clock.median_period))
    try:
        start, end = episode_extent(data.start_s, data.end_s, series, spec.clock, cameras)
    except ExtentError as exc:
        raise EpisodeError(data.episode_id, None, str(exc),
                           hint="fix the episode's start_s / end_s, or leave them out to take the extent from "
                                "its streams") from exc
    _refuse(data, None, extent_problem(start, end, list(series.values()) or cameras, spec.max_episode_s))
    if not series and data.end_s is None:
        resolutions.append(camera_resolution)
    resolution = max([*resolutions, float(np.spacing(abs(start))), float(np.spacing(abs(end)))])
    return start, end, resolution


def _window_bytes(spec: BuildSpec, streams: dict[str, Stream], static: dict[str, bytes],
                  cameras: dict[str, "VideoWindows"]) -> int:
    series = [(spec.windows[n].steps, s.values.shape[1], output_dtype(spec, n).itemsize) for n, s in streams.items()]
    clips = [(spec.videos[n][0].steps, int(np.prod(c.shape)) if c.options.encoding == "raw" else None)
             for n, c in cameras.items()]
    return window_bytes(series, [len(b) for b in static.values()], clips)


def build_episode(data: EpisodeData, spec: BuildSpec, key_prefix: str, meta: dict[str, Any],
                  windows_out: EpisodeWindows, free_bytes: int | None = None) -> Iterator[bytes]:
    """Yield the sample blob of every emitted window, filling `windows_out` as a side record.

    Time series are resampled on times relative to the extent's start (`Stream.shifted`): grid and
    query times are then small numbers computed exactly, whatever the store's clock origin (epoch
    seconds near 1.3e9 keep only 238 ns). Cameras keep absolute times (their frame choice has a
    tolerance of half a frame) and meta `t` adds the start back. `free_bytes`: the output disk's free
    space; an episode whose planned windows exceed it stops the export (`DiskSpaceError`) before any
    is written."""
    streams = _clean(data, spec)
    missing = sorted(n for n in spec.windows if n in data.missing)  # not recorded: zeros, mask all false
    if spec.clock is not None and spec.clock in data.missing:
        raise EpisodeError(data.episode_id, spec.clock, "the declared clock stream is missing in this episode",
                           hint="record it, give the episode start_s/end_s, or remove `clock` from store.yaml")
    cameras = _open_videos(data, spec)
    start, end, resolution = build_extent(data, streams, spec, [c.span() for c in cameras.values()],
                                          max((c.info.time_base for c in cameras.values()), default=0.0))
    frame_count = grid_frame_count(start, end, spec.fps, resolution)
    static = _static_members(data, spec)
    count, per_window = len(range(0, frame_count, spec.stride)), _window_bytes(spec, streams, static, cameras)
    _refuse(data, None, size_problem(count, per_window, source_bytes(data)))
    space = space_problem(count, per_window, free_bytes)
    if space is not None:
        raise DiskSpaceError(f"episode {data.episode_id!r}: {space.message}", hint=space.hint)
    anchors = anchor_frames(frame_count, spec.stride)
    streams = {n: s.shifted(start) for n, s in streams.items()}  # exact: see Stream.shifted
    extent = (0.0, end - start)  # relative to `start`, as the streams
    # the grid's last point, when counted within the clocks' resolution after `end` (a camera-only
    # extent in ms pts), is still inside the episode for frame selection
    camera_end = max(end, start + (frame_count - 1) / spec.fps)
    max_gaps = {n: max_gap(spec, n, s) for n, s in streams.items()}  # s; longer intervals are gaps
    report = windows_out.report
    report.update(episode_id=data.episode_id, duration_s=end - start, candidates=int(len(anchors)),
                  emitted=0, dropped_min_valid=0,
                  repairs={n: s.repairs.as_dict() for n, s in streams.items() if s.repairs.total()},
                  masked_steps={n: 0 for n in [*streams, *missing, *cameras]},
                  steps={n: 0 for n in [*streams, *missing, *cameras]},
                  float32_loss=_float32_losses(streams, spec), missing_streams=missing,
                  # per field its source rate and how many source intervals the resampler masks as gaps
                  rate_hz={n: 1.0 / s.median_period for n, s in streams.items()},
                  gaps={n: int(np.count_nonzero(np.diff(s.times) > max_gaps[n])) for n, s in streams.items()})
    partial: dict[str, list[FieldStats | None]] = {n: [] for n in [*streams, *(r.key for r in spec.relative)]}
    for name, camera in cameras.items():
        declared = data.videos[name].get("fps")
        report.setdefault("video", {})[name] = {"bytes": 0, "frames": 0, "sq_error": 0.0, "sq_count": 0,
                                                "psnr_frames_count": 0, "measured_fps":
                                                camera.info.measured_fps,
                                                "declared_fps": float(declared) if declared else None}
    chunk_size = VIDEO_CHUNK_ANCHORS if cameras else CHUNK_ANCHORS
    relative_fields = {f for r in spec.relative for f in (r.action, r.state)}  # their float64 values kept a chunk
    steps_per_window = sum(w.steps for n, w in spec.windows.items() if n in streams or n in missing)
    steps_per_window += sum(spec.videos[n][0].steps for n in cameras)
    chunk_size = max(1, min(chunk_size, CHUNK_QUERIES // max(1, steps_per_window)))
    _expect_frames(cameras, spec, start, anchors, chunk_size)
    for lo in range(0, len(anchors), chunk_size):
        chunk = anchors[lo:lo + chunk_size]  # [W]
        values, masks = {}, {}
        picks = {}  # camera -> frame index [W, n]: windows are built from the camera's held frames
        for name, camera in cameras.items():
            q = query_times(start, spec.fps, chunk, spec.videos[name][0])  # [W, n]
            try:
                picks[name], masks[name] = camera.select(q, (start, camera_end))  # [W, n], [W, n]
            except VideoError as exc:
                raise _video_error(data, name, exc) from exc
        for name, stream in streams.items():
            window = spec.windows[name]
            q = query_times(0.0, spec.fps, chunk, window)  # [W, n] relative to start
            flat, valid = resample(stream, q.ravel(), window.interpolation, max_gaps[name], extent)
            values[name] = flat.reshape(q.shape + (flat.shape[1],))  # [W, n, N]
            masks[name] = valid.reshape(q.shape)  # [W, n]
        for name in missing:
            steps = spec.windows[name].steps
            values[name] = np.zeros((len(chunk), steps, spec.widths[name]), output_dtype(spec, name))  # [W, n, N]
            masks[name] = np.zeros((len(chunk), steps), dtype=bool)  # [W, n]: no step is real
        keep = np.ones(len(chunk), dtype=bool)  # [W]
        if masks:
            keep = valid_fraction(list(masks.values())) >= spec.min_valid_fraction - 1e-12
        report["dropped_min_valid"] += int((~keep).sum())
        kept = _kept(keep)  # all windows kept (the usual case): no copy of the chunk's arrays
        for name in cameras:
            picks[name], masks[name] = kept(picks[name]), kept(masks[name])
            report["masked_steps"][name] += int((~masks[name]).sum())
            report["steps"][name] += int(masks[name].size)
        resampled = {}  # field -> (values [W, n, N] before padding and the output cast, mask [W, n])
        for name in streams:
            vals, mask = kept(values[name]), kept(masks[name])
            if name in relative_fields:
                resampled[name] = (vals, mask)
            try:
                partial[name].append(FieldStats.of(vals[mask]))
            except StatsError as exc:
                raise EpisodeError(data.episode_id, name, str(exc),
                                   hint="scale the stream's values in the store, or leave it out with exclude") from exc
            report["masked_steps"][name] += int((~mask).sum())
            report["steps"][name] += int(mask.size)
            values[name] = pad_invalid(vals, mask, spec.windows[name].pad).astype(output_dtype(spec, name))
            masks[name] = mask
        for key, part in relative_stats(data.episode_id, spec.relative, resampled).items():
            partial[key].append(part)
        for name in missing:
            values[name], masks[name] = kept(values[name]), kept(masks[name])
            report["masked_steps"][name] += int(masks[name].size)
            report["steps"][name] += int(masks[name].size)
        sampled = {name: _quality_sample(masks[name]) for name in cameras}  # one window per chunk, or None
        for w, anchor in enumerate(chunk[keep].tolist()):
            key = f"{key_prefix}_{anchor:06d}"
            members = dict(static)
            for name in [*streams, *missing]:
                members[f"{name}.npy"] = encode_npy(values[name][w])
                members[f"{mask_field(name)}.npy"] = encode_npy(masks[name][w])
            for name, camera in cameras.items():
                index, mask = picks[name][w], masks[name][w]  # [n], [n]
                ext, blob = camera.encode(index, mask, spec.videos[name][0].rate_hz)
                members[f"{name}.{ext}"] = blob
                _video_quality(report, name, ext, blob, len(index),
                               (camera.window(index, mask), mask) if w == sampled[name] else None)
                members[f"{mask_field(name)}.npy"] = encode_npy(mask)
            members["meta.json"] = _meta_json(meta, anchor, start + anchor / spec.fps, data.time_origin_ns)
            windows_out.anchors.append(anchor)
            windows_out.keys.append(key)
            yield encode_sample(key, laid_out(members, spec.layout))
    report["emitted"] = len(windows_out.anchors)
    for name, camera in cameras.items():
        video = report["video"][name]
        video["frames_held_max"] = camera.peak_frames
        video["span_steps"], video["missing_steps"] = camera.span_steps, camera.missing_steps
        if camera.span_steps and camera.missing_steps > MISSING_FRAMES_LIMIT * camera.span_steps:
            raise EpisodeError(
                data.episode_id, name,
                f"{camera.missing_steps} of {camera.span_steps} camera steps "
                f"({100 * camera.missing_steps / camera.span_steps:.0f}%) inside the span of "
                f"{data.videos[name]['path']!r} have no frame: frames are missing from the file"
                + (f" (its index lists {camera.info.listed_frames} frames, {camera.info.unreadable_frames} "
                   "of them unreadable: truncated?)" if camera.info.unreadable_frames else ""),
                hint="re-encode or re-download the video, or pass --set on_bad_episode=skip")
        squared, count = video.pop("sq_error"), video.pop("sq_count")
        video["psnr_frames"] = video.pop("psnr_frames_count")
        video["psnr_db"] = _psnr_db(squared, count)
    windows_out.stats = {n: merge_all(parts) for n, parts in partial.items()}
    windows_out.stats.update({n: None for n in missing})  # nothing recorded: nothing to normalise by


def max_gap(spec: BuildSpec, name: str, stream: Stream) -> float:
    """The longest interval (s) between two samples of `name` that the resampler interpolates across:
    `streams.<name>.max_gap_s`, else `max_gap_factor` x the stream's median period."""
    window = spec.windows[name]
    return window.max_gap_s if window.max_gap_s is not None else spec.max_gap_factor * stream.median_period


def _float32_losses(streams: dict[str, Stream], spec: BuildSpec) -> dict[str, dict[str, float | int]]:
    """Fields written as float32 whose values float32 cannot tell apart (`core/precision.py`), over the
    episode's cleaned samples: O(values), on arrays already in memory."""
    out = {}
    for name, stream in streams.items():
        if output_dtype(spec, name) == np.float32:
            loss = float32_loss(stream.values)  # [T, N]
            if loss is not None:
                out[name] = loss.as_dict()
    return out


def _expect_frames(cameras: dict[str, "VideoWindows"], spec: BuildSpec, start: float, anchors: np.ndarray,
                   chunk_size: int) -> None:
    """Tell each camera every frame the episode's windows will use, before decoding starts (a chunk
    can need a frame that an earlier chunk's decode passed without using)."""
    for name, camera in cameras.items():
        for lo in range(0, len(anchors), chunk_size):
            camera.expect(query_times(start, spec.fps, anchors[lo:lo + chunk_size], spec.videos[name][0]))  # [W, n]


def _kept(keep: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Selects the kept windows (`keep` [W]) of a chunk's [W, ...] arrays: the arrays themselves when
    every window is kept, so the usual chunk is not copied."""
    if keep.all():
        return lambda array: array
    return lambda array: array[keep]


def _quality_sample(masks: np.ndarray) -> int | None:
    """Which window of a chunk ([W, n] camera masks of its kept windows) to measure the PSNR on: the
    first with a real frame. One per chunk spreads the sample over the whole episode at the cost of
    one clip decode per `VIDEO_CHUNK_ANCHORS` windows; windows of padding only would measure zeros
    against zeros."""
    with_frames = np.flatnonzero(masks.any(axis=1))
    return int(with_frames[0]) if len(with_frames) else None


def _video_quality(report: dict[str, Any], name: str, ext: str, blob: bytes, steps: int,
                   sample: tuple[np.ndarray, np.ndarray] | None) -> None:
    """Bytes per frame for every window of `steps` frames; for sampled windows (`sample` = the window's
    source frames [n, H, W, 3] and mask [n]), the squared error of the stored against the source
    frames, over the real (unpadded) frames only."""
    stats = report["video"][name]  # set up in build_episode when the camera was opened
    stats["bytes"] += len(blob)
    stats["frames"] += steps
    if sample is not None:
        from robowds.reader.decode import decode_member
        frames, sample_mask = sample
        stored = decode_member(ext, blob)[sample_mask].astype(np.float64)  # [v, H, W, 3]
        stats["sq_error"] += float(((stored - frames[sample_mask].astype(np.float64)) ** 2).sum())
        stats["sq_count"] += int(stored.size)
        stats["psnr_frames_count"] += int(sample_mask.sum())


def _psnr_db(squared_error: float, count: int) -> float | None:
    """PSNR in dB of the pooled squared error (None when no real frame was sampled; 100 if lossless)."""
    if not count:
        return None
    from robowds.export.media.clips import psnr_of_mse
    return round(psnr_of_mse(squared_error / count), 3)


def _open_videos(data: EpisodeData, spec: BuildSpec) -> dict[str, "VideoWindows"]:
    from robowds.export.media.video_windows import VideoWindows

    cameras = {}
    for name, (_, options) in spec.videos.items():
        video = data.videos[name]
        try:
            cameras[name] = VideoWindows(video["file"], video, options)  # a Path, or a StoreFile (remote store)
        except VideoError as exc:
            raise _video_error(data, name, exc) from exc
    return cameras


def _video_error(data: EpisodeData, name: str, exc: VideoError) -> EpisodeError:
    """A video that fails at open or while decoding: one message naming the file, with the fix that
    fits the cause (the config, access to the store, or the file itself)."""
    if isinstance(exc, VideoSizeError):
        hint = f"change streams.{name}.crop / resize / encoding in the export config"
    elif isinstance(exc, VideoReadError):
        hint = f"{exc.hint}, then re-run the same command: it resumes"
    else:
        hint = "re-encode or re-download the video, or fix its path"
    return EpisodeError(data.episode_id, name, f"video file {data.videos[name]['path']!r}: {exc}", hint=hint)


def _static_members(data: EpisodeData, spec: BuildSpec) -> dict[str, bytes]:
    """Members every window of the episode carries, encoded once per episode."""
    members: dict[str, bytes] = {}
    for name in spec.static_fields:
        if name in data.texts:
            members[f"{name}.txt"] = data.texts[name].encode("utf-8")
        elif name in data.images:
            ext, blob = _image_member(data, spec, name)
            members[f"{name}.{ext}"] = blob
        elif name in data.values:
            members[f"{name}.npy"] = encode_npy(data.values[name])
    return members


def _image_member(data: EpisodeData, spec: BuildSpec, name: str) -> tuple[str, bytes]:
    """(extension, bytes) of an image field: the stored bytes, or re-encoded per `streams.<name>`."""
    from robowds.export.media.images import ImageOptions, encode_image

    blob, ext = data.images[name]
    options = spec.images.get(name, ImageOptions())
    try:
        return encode_image(blob, ext, options)
    except ValueError as exc:  # CropError is a ValueError too
        source = data.image_sources.get(name, "image")
        raise EpisodeError(data.episode_id, name, f"image {source}: {exc}",
                           hint=f"fix the image, or change streams.{name} (crop/resize/encoding)") from exc


def _meta_json(meta: dict[str, Any], anchor: int, t: float, origin_ns: int | None) -> bytes:
    """The window's identity: episode, split, anchor, and its anchor time `t` in the streams' clock.

    For `time_unit: ns` stores, `t` counts seconds from the episode's first ns sample, and `t_ns` is
    the anchor time in the store's own int64 ns clock, so every window can be found in the source."""
    doc = {**meta, "anchor": anchor, "t": round(t, 9)}
    if origin_ns is not None:
        doc["t_ns"] = origin_ns + round(t * 1e9)  # exact: |t| << 1e6 s keeps float64 below 1 ns error
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
