"""Epoch-second clocks (issue 10, item 1): a store and the same store shifted by up to 2e9 s (Unix
epoch seconds, as many loggers write) give the same windows; only meta `t` moves by the shift.

Stream times here are multiples of 2^-12 s, so shifting them by an offset that is a multiple of 2^-12
below 2^31 s is exact in float64: the two stores hold the same clock, and any difference in the
windows is the export's arithmetic, not the data's."""

from __future__ import annotations

import io
import json
import tarfile
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from robowds.export.cli.main import main
from robowds.export.job.config import load_config
from robowds.export.job.run import run_export
from robowds.export.store.validate import validate_store
from robowds.reader.format import mask_field

TICK = 2.0 ** -12  # s; every stream time is a multiple of it
METHODS = {"held": "hold", "lin": "linear", "near": "nearest"}


def _episode_streams(rng: np.random.Generator, t0: float) -> dict[str, np.ndarray]:
    """Irregular streams: random periods of 10-100 ms, an occasional 0.5-1.5 s gap."""
    streams = {}
    for name in METHODS:
        n = int(rng.integers(4, 60))
        ticks = rng.integers(40, 410, size=n - 1)  # [T-1] steps in TICKs
        gaps = rng.random(n - 1) < 0.08
        ticks[gaps] = rng.integers(2_000, 6_000, size=int(gaps.sum()))
        times = t0 + np.concatenate([[0], np.cumsum(ticks)]) * TICK + int(rng.integers(0, 200)) * TICK  # [T]
        values = rng.normal(size=(n, 2)).round(3)  # [T, 2]
        streams[name] = np.column_stack([times, values])
    return streams


def _write_store(root: Path, episodes: list[dict[str, np.ndarray]], bounds: list[tuple[float, float] | None],
                 shift: float) -> Path:
    root.mkdir(parents=True)
    rows = []
    for e, (streams, bound) in enumerate(zip(episodes, bounds)):
        row: dict = {"episode_id": f"ep{e}"}
        for name, arr in streams.items():
            shifted = arr.copy()
            shifted[:, 0] += shift
            assert np.array_equal(shifted[:, 0] - shift, arr[:, 0])  # the shift is exact
            row[name] = shifted.tolist()
        if any(b is not None for b in bounds):
            row["start_s"] = None if bound is None else bound[0] + shift
            row["end_s"] = None if bound is None else bound[1] + shift
        rows.append(row)
    pq.write_table(pa.Table.from_pylist(rows), root / "t.parquet")
    fields = {name: {"interpolation": method} for name, method in METHODS.items()}
    (root / "store.yaml").write_text(yaml.safe_dump({"version": 1, "fields": fields}))
    return root


def _windows(out: Path) -> dict[str, dict[str, bytes]]:
    manifest = json.loads((out / "manifest.json").read_text())
    samples: dict[str, dict[str, bytes]] = {}
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            with tarfile.open(out / shard["path"]) as tar:
                for member in tar.getmembers():
                    key, _, suffix = member.name.partition(".")
                    samples.setdefault(key, {})[suffix] = tar.extractfile(member).read()
    return samples


OFFSET_TICKS = st.integers(0, int(2e9 / TICK))  # offsets 0 .. 2e9 s in steps of 2^-12 s


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), offset_ticks=OFFSET_TICKS, fps=st.sampled_from([10.0, 16.0, 30.0, 7.0]),
       rate_hz=st.sampled_from([None, 20.0, 50.0, 8.0]), steps=st.integers(1, 12),
       offset_s=st.sampled_from([0.0, -0.5, -0.3, 0.1]), declared=st.booleans(), pad=st.sampled_from(["zero", "edge"]))
@example(seed=1, offset_ticks=int(1.3e9 / TICK), fps=30.0, rate_hz=None, steps=5, offset_s=-0.3, declared=False,
         pad="zero")
@example(seed=2, offset_ticks=int(2e9 / TICK), fps=10.0, rate_hz=50.0, steps=10, offset_s=-0.5, declared=True,
         pad="edge")
def test_shifted_store_gives_the_same_windows(tmp_path_factory: pytest.TempPathFactory, seed: int, offset_ticks: int,
                                              fps: float, rate_hz: float | None, steps: int, offset_s: float,
                                              declared: bool, pad: str) -> None:
    shift = offset_ticks * TICK
    rng = np.random.default_rng(seed)
    episodes = [_episode_streams(rng, float(rng.integers(0, 40_000)) * TICK) for _ in range(2)]
    bounds: list[tuple[float, float] | None] = [None, None]
    if declared:  # start_s / end_s columns, inside and around the data, multiples of TICK too
        bounds = [(float(s["lin"][0, 0]) - 1024 * TICK, float(s["held"][-1, 0]) + 512 * TICK) for s in episodes]
    tmp = tmp_path_factory.mktemp("epoch")
    base = _write_store(tmp / "base", episodes, bounds, 0.0)
    moved = _write_store(tmp / "moved", episodes, bounds, shift)
    rate = rate_hz or fps
    config = load_config(None, [f"fps={fps}", "shuffle=false", f"window.duration_s={steps / rate!r}",
                                f"window.offset_s={offset_s}", f"window.pad={pad}",
                                *([f"window.rate_hz={rate_hz}"] if rate_hz else [])])
    run_export(base, tmp / "out_base", config, workers=1, progress=False)
    run_export(moved, tmp / "out_moved", config, workers=1, progress=False)
    a, b = _windows(tmp / "out_base"), _windows(tmp / "out_moved")
    assert list(a) == list(b)
    assert a, "no window exported"
    for key in a:
        assert a[key].keys() == b[key].keys()
        for member in a[key]:
            if member != "meta.json":
                assert a[key][member] == b[key][member], (key, member)
        meta_a, meta_b = json.loads(a[key]["meta.json"]), json.loads(b[key]["meta.json"])
        assert meta_b.pop("t") == pytest.approx(meta_a.pop("t") + shift, abs=5e-7)  # rounding of t + shift
        assert meta_a == meta_b
    assert validate_store(base).durations == validate_store(moved).durations


def _store_of(root: Path, times: np.ndarray, interpolation: str = "hold") -> Path:
    """One episode, one stream whose value is the sample index."""
    root.mkdir(parents=True)
    values = np.arange(len(times), dtype=np.float64)
    rows = np.column_stack([times, values]).tolist()
    pq.write_table(pa.table({"episode_id": ["ep0"], "joints": pa.array([rows], type=pa.list_(pa.list_(pa.float64())))}),
                   root / "t.parquet")
    (root / "store.yaml").write_text(yaml.safe_dump({"version": 1, "fields": {
        "joints": {"interpolation": interpolation}}}))
    return root


def _logged_times(origin: Fraction, n: int, fps: int, via_ns: bool) -> np.ndarray:
    """What a logger writes for frames at `origin + k / fps` (exact): each true time rounded once to
    float64 (`time.time()`), or int64 ns divided by 1e9 in float64 (rounded twice)."""
    true = [origin + Fraction(k, fps) for k in range(n)]
    if via_ns:
        return np.array([round(t * 10**9) for t in true], dtype=np.int64) / 1e9  # [T]
    return np.array([float(t) for t in true])  # [T]


@pytest.mark.parametrize("origin, via_ns", [(Fraction(0), False), (Fraction(13_000_000_000_123, 10_000), False),
                                            (Fraction(19_999_999_994_567, 10_000), False),
                                            (Fraction(17_000_000_003_456, 10_000), True)])
def test_epoch_seconds_hold_hits_every_sample(tmp_path: Path, origin: Fraction, via_ns: bool) -> None:
    """The issue's case: 30 Hz frames logged in epoch seconds (238 ns float64 spacing near 1.3e9 s), a
    30 fps grid, `hold`, windows of 10 steps reaching 9 frames into the past: every step is its own
    frame and valid, down to the last frame. Before, 49 to 1007 of the 3705 steps that hit a frame
    exactly took the previous frame (a query landing a rounding step early)."""
    n = 375
    store = _store_of(tmp_path / "s", _logged_times(origin, n, 30, via_ns))
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--keep-order", "--fps", "30",
                 "--set", f"window.duration_s={10 / 30!r}", "--set", f"window.offset_s={-9 / 30!r}"]) == 0
    windows = _windows(out)
    assert len(windows) == n
    for k, key in enumerate(windows):
        assert key.endswith(f"_{k:06d}")
        frame = k - 9 + np.arange(10)  # [10] the frame each step hits
        real = frame >= 0
        assert np.load(io.BytesIO(windows[key]["joints.npy"]))[:, 0].tolist() == np.where(real, frame, 0).tolist(), key
        assert np.load(io.BytesIO(windows[key][f"{mask_field('joints')}.npy"])).tolist() == real.tolist(), key
