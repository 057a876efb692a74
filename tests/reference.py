"""An independent reference for what an export must contain, and a reader of shards that does not use ours.

Why: `robowds verify --store` recomputes windows with the exporter's own `build_episode`, so it catches
corruption, a changed store and non-determinism, but a wrong rule gives the same wrong value twice.
This module re-implements the documented rules from scratch, one query time at a time with plain loops
(slow, readable, nothing shared with `export/`: no import of robowds.export.core.resample / windows / build /
extent), so an end-to-end test can compare every exported value, mask and window count against it.

Rules implemented (SPEC "Resampling policy" and "Windows and padding"; README "The episode extent" and
"Export: resampling, windows, padding"):

* Cleaning: rows with a non-finite time or any non-finite value are missing samples; rows are sorted
  by time; rows with the same time keep the last one. `time_unit: ns` streams hold int64 nanoseconds,
  converted to seconds after subtracting an integer origin (the episode's earliest ns sample).
* Extent `[start, end]`: `start_s` / `end_s` when given, else the first / last sample of the `clock`
  stream, else the first / last sample over the exported streams.
* Grid: `t_k = start + k / fps` for integer k with `t_k <= end` (within 1e-6 frames); anchors every
  `stride` frames. Stream s of anchor k is sampled at `t_k + offset_s + j / rate_hz`,
  j in [0, duration_s * rate_hz). Times are taken relative to `start` (README: one exact subtraction).
* Per query time q (two times within 1 ns are equal):
    - outside the extent: masked, with the value the stream has at the nearest end of the extent;
    - before the first / after the last sample: masked, the first / last value;
    - at a sample: that sample, real;
    - strictly between samples t_a < q < t_b with t_b - t_a > max_gap (default max_gap_factor x the
      median sample period): masked, the value of t_a;
    - otherwise real, by method: `linear` v_a + (v_b - v_a)(q - t_a)/(t_b - t_a); `hold` v_a;
      `nearest` the closer of v_a, v_b, ties to v_a; `slerp` great-arc interpolation of quaternions
      normalised and sign-fixed so consecutive samples have a non-negative dot product.
* Padding: masked steps are 0 (`zero`) or keep the value above (`edge`).
* Dtypes: float sources and `linear` / `slerp` streams are `float_dtype`; integer/bool streams held or
  nearest keep their dtype.
* A window is emitted when (real steps over all its time-series steps) >= `min_valid_fraction`.
* Meta: `episode_id`, `anchor`, `t` = start + anchor / fps rounded to 9 decimals.

Not covered: video frames, images, splits, the shuffle, `timestamps: reject`, coarse-clock tolerances
(epoch-second clocks). Tests that need those check them on their own.
"""

from __future__ import annotations

import bisect
import io
import json
import math
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

EPS = 1e-9  # s: two times this close are the same time


@dataclass(frozen=True)
class StreamConfig:
    """How one time-series field is windowed (hand-written by each test from the README's defaults)."""

    interpolation: str  # linear | hold | nearest | slerp
    rate_hz: float
    duration_s: float
    offset_s: float = 0.0
    pad: str = "zero"  # zero | edge
    max_gap_s: float | None = None  # None: max_gap_factor x median period
    time_unit: str = "s"  # s | ns

    @property
    def steps(self) -> int:
        return round(self.duration_s * self.rate_hz)


@dataclass(frozen=True)
class Config:
    fps: float
    streams: dict[str, StreamConfig]
    stride: int = 1
    min_valid_fraction: float = 0.0
    max_gap_factor: float = 2.5
    clock: str | None = None  # a stream of the store (exported or not) that defines the extent
    float_dtype: str = "float32"


@dataclass
class Window:
    """One expected sample: values [steps, N] and masks [steps] per stream, and its meta."""

    episode_id: str
    anchor: int
    t: float
    values: dict[str, np.ndarray] = field(default_factory=dict)
    masks: dict[str, np.ndarray] = field(default_factory=dict)


# --- reading the store ---

def read_streams(store: Path, names: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """episode_id -> field -> raw [T, N+1] array, straight from every Parquet table of the store."""
    episodes: dict[str, dict[str, np.ndarray]] = {}
    for path in sorted(store.glob("*.parquet")):
        table = pq.read_table(path)
        ids = [str(e) for e in table.column("episode_id").to_pylist()]
        for name in names:
            if name not in table.column_names:
                continue
            for episode_id, cell in zip(ids, table.column(name).to_pylist()):
                episodes.setdefault(episode_id, {})[name] = np.array(cell)  # [T, N+1], int64 or float64
    return episodes


# --- one stream ---

class RefStream:
    """A cleaned stream: times (float seconds, relative to the episode start once `relative_to` ran)
    and values, as Python lists, plus its largest gap allowed between two samples."""

    def __init__(self, times: list[float], values: list[np.ndarray], method: str):
        self.times, self.values, self.method = times, values, method

    @classmethod
    def clean(cls, raw: np.ndarray, method: str, origin_ns: int | None) -> "RefStream":
        rows = []
        for row in raw:
            if origin_ns is not None:
                t = (int(row[0]) - origin_ns) / 1e9
            else:
                t = float(row[0])
            value = np.array(row[1:])
            if not math.isfinite(t) or (value.dtype.kind == "f" and not np.isfinite(value).all()):
                continue  # a missing sample
            rows.append((t, value))
        rows.sort(key=lambda r: r[0])  # stable: equal times keep their order
        times: list[float] = []
        values: list[np.ndarray] = []
        for t, value in rows:
            if times and times[-1] == t:
                values[-1] = value  # duplicate time: the last row wins
            else:
                times.append(t)
                values.append(value)
        if method in ("linear", "slerp"):
            values = [v.astype(np.float64) for v in values]
        if method == "slerp":
            fixed = []
            for v in values:
                v = v / np.sqrt(float(np.dot(v, v)))
                if fixed and float(np.dot(v, fixed[-1])) < 0:
                    v = -v  # the same rotation, on the previous sample's hemisphere
                fixed.append(v)
            values = fixed
        return cls(times, values, method)

    def relative_to(self, start: float) -> "RefStream":
        return RefStream([t - start for t in self.times], self.values, self.method)

    def median_period(self) -> float:
        return float(np.median([b - a for a, b in zip(self.times, self.times[1:])]))

    def at(self, q: float, max_gap: float) -> tuple[np.ndarray, bool]:
        """(value, real) at time q, ignoring the episode extent."""
        t, v = self.times, self.values
        if q < t[0] - EPS:
            return v[0], False
        if q > t[-1] + EPS:
            return v[-1], False
        i = bisect.bisect_left(t, q - EPS)  # first sample at or after q - EPS
        if i < len(t) and abs(t[i] - q) <= EPS:
            return v[i], True  # at a sample
        a, b = i - 1, i  # t[a] < q < t[b]
        if t[b] - t[a] > max_gap:
            return v[a], False
        f = (q - t[a]) / (t[b] - t[a])
        if self.method == "hold":
            return v[a], True
        if self.method == "nearest":
            return (v[b] if t[b] - q < q - t[a] else v[a]), True
        if self.method == "linear":
            return v[a] + (v[b] - v[a]) * f, True
        return slerp(v[a], v[b], f), True


def slerp(a: np.ndarray, b: np.ndarray, f: float) -> np.ndarray:
    """Great-arc interpolation between unit quaternions a and b (same hemisphere), normalised."""
    theta = math.acos(max(-1.0, min(1.0, float(np.dot(a, b)))))
    if theta < 1e-12:
        out = a
    else:
        out = (math.sin((1 - f) * theta) * a + math.sin(f * theta) * b) / math.sin(theta)
    return out / np.sqrt(float(np.dot(out, out)))


def out_dtype(raw: np.ndarray, cfg: StreamConfig, float_dtype: str) -> np.dtype:
    if cfg.interpolation in ("linear", "slerp") or raw.dtype.kind == "f":
        return np.dtype(float_dtype)
    return raw.dtype


# --- one episode ---

def expected_episode(episode_id: str, raw: dict[str, np.ndarray], config: Config,
                     start_s: float | None = None, end_s: float | None = None) -> list[Window]:
    """Every emitted window of one episode, in anchor order. `raw`: field -> [T, N+1] as stored
    (the clock stream included when it is not exported)."""
    ns = {n for n, c in config.streams.items() if c.time_unit == "ns"}
    origin_ns = min(int(raw[n][0][0]) for n in ns) if ns else None  # integer origin of ns clocks
    streams = {n: RefStream.clean(raw[n], c.interpolation, origin_ns if n in ns else None)
               for n, c in config.streams.items()}
    if config.clock is not None:
        clock = streams.get(config.clock) or RefStream.clean(raw[config.clock], "linear", None)
        spans = [(clock.times[0], clock.times[-1])]
    else:
        spans = [(s.times[0], s.times[-1]) for s in streams.values()]
    start = start_s if start_s is not None else min(a for a, _ in spans)
    end = end_s if end_s is not None else max(b for _, b in spans)
    length = end - start
    frames = math.floor(length * config.fps + 1e-6) + 1
    relative = {n: s.relative_to(start) for n, s in streams.items()}
    windows = []
    for anchor in range(0, frames, config.stride):
        window = Window(episode_id, anchor, round(start + anchor / config.fps, 9))
        real_steps = total_steps = 0
        for name, cfg in config.streams.items():
            stream = relative[name]
            max_gap = cfg.max_gap_s if cfg.max_gap_s is not None else config.max_gap_factor * stream.median_period()
            values, mask = [], []
            for j in range(cfg.steps):
                q = anchor / config.fps + cfg.offset_s + j / cfg.rate_hz
                if q < -EPS or q > length + EPS:  # outside the episode: the value at its nearest end
                    value, real = stream.at(min(max(q, 0.0), length), max_gap)[0], False
                else:
                    value, real = stream.at(q, max_gap)
                if not real and cfg.pad == "zero":
                    value = np.zeros_like(value)
                values.append(value)
                mask.append(real)
            window.values[name] = np.array(values).astype(out_dtype(raw[name], cfg, config.float_dtype))  # [steps, N]
            window.masks[name] = np.array(mask, dtype=bool)  # [steps]
            real_steps += sum(mask)
            total_steps += len(mask)
        if real_steps / total_steps >= config.min_valid_fraction - 1e-12:
            windows.append(window)
    return windows


def expected_export(store: Path, config: Config, episodes: list[str] | None = None) -> dict[str, list[Window]]:
    """episode_id -> its expected windows, for every episode of the store (or the ones named)."""
    names = list(config.streams) + ([config.clock] if config.clock else [])
    data = read_streams(store, names)
    return {e: expected_episode(e, data[e], config) for e in (episodes or sorted(data))}


# --- reading an export back without robowds' reader ---

def read_export(out: Path) -> dict[str, dict[str, object]]:
    """key -> {field: decoded member} for every sample of every split: tarfile + np.load (no pickle),
    `meta.json` parsed, `.txt` decoded. The shard list and counts come from manifest.json."""
    manifest = json.loads((out / "manifest.json").read_text())
    samples: dict[str, dict[str, object]] = {}
    for split, entry in manifest["splits"].items():
        read = 0
        for shard in entry["shards"]:
            with tarfile.open(out / shard["path"]) as tar:
                for member in tar:
                    key, suffix = member.name.split(".", 1)
                    blob = tar.extractfile(member).read()
                    if suffix.endswith(".npy"):
                        value: object = np.load(io.BytesIO(blob), allow_pickle=False)
                    elif suffix == "meta.json":
                        value = json.loads(blob)
                    elif suffix.endswith(".txt"):
                        value = blob.decode()
                    else:
                        value = blob
                    sample = samples.setdefault(key, {})
                    read += not sample
                    sample[suffix.rsplit(".", 1)[0]] = value
        assert read == entry["samples"], f"split {split}: manifest says {entry['samples']} samples, shards hold {read}"
    return samples


def assert_export_matches(out: Path, config: Config, expected: dict[str, list[Window]], rtol: float = 1e-6) -> int:
    """Every exported window equals its expected one: same windows per episode (anchors and count),
    masks exact, values exact for held / nearest / integer fields, within `rtol` (and 1e-9 absolute,
    for values near 0) for interpolated floats. Returns the number of windows compared."""
    samples = read_export(out)
    by_episode: dict[str, dict[int, dict[str, object]]] = {}
    for sample in samples.values():
        meta = sample["meta"]
        by_episode.setdefault(meta["episode_id"], {})[meta["anchor"]] = sample
    assert sorted(by_episode) == sorted(e for e, w in expected.items() if w), "episodes with windows differ"
    compared = 0
    for episode_id, windows in expected.items():
        got = by_episode.get(episode_id, {})
        assert sorted(got) == [w.anchor for w in windows], f"{episode_id}: anchors differ"
        for window in windows:
            sample = got[window.anchor]
            where = f"{episode_id} anchor {window.anchor}"
            assert sample["meta"]["t"] == window.t, where
            for name, want in window.values.items():
                have, mask = sample[name], sample[f"{name}_mask"]
                assert mask.dtype == np.bool_ and mask.tolist() == window.masks[name].tolist(), f"{where}: {name}_mask"
                assert have.dtype == want.dtype and have.shape == want.shape, f"{where}: {name} {have.dtype}{have.shape}"
                if config.streams[name].interpolation in ("linear", "slerp"):
                    np.testing.assert_allclose(have, want, rtol=rtol, atol=1e-9, err_msg=f"{where}: {name}")
                else:
                    np.testing.assert_array_equal(have, want, err_msg=f"{where}: {name}")
            compared += 1
    return compared
