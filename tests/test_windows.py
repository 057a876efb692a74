"""Tests for window geometry (export/core/windows.py) and, as a property, for robowds.export.job.build.build_episode."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from robowds.export.core.windows import (StreamWindow, anchor_frames, grid_frame_count, pad_invalid, query_times,
                                         valid_fraction)
from robowds.export.job.build import BuildSpec, EpisodeWindows, build_episode
from robowds.export.store.episodes import EpisodeData
from robowds.reader.format import decode_npy, group_samples, iter_members

EPS = 1e-9


def _window(rate: float, steps: int, offset: float = 0.0, pad: str = "zero", max_gap: float | None = None,
            interpolation: str = "linear") -> StreamWindow:
    return StreamWindow(rate_hz=rate, duration_s=steps / rate, offset_s=offset, pad=pad, steps=steps,
                        max_gap_s=max_gap, interpolation=interpolation)


# --- grid, anchors, query times ---

@pytest.mark.parametrize("start, end, fps, expected", [
    (1.0, 2.0, 10.0, 11), (0.0, 0.95, 10.0, 10), (1.0, 1.0, 10.0, 1), (1.0, 0.9, 10.0, 0),
    (0.0, 1.0, 3.0, 4), (0.1, 0.3, 10.0, 3), (0.3, 0.7, 10.0, 5),  # (end - start) * fps = 1.9999999999999998
    (-2.5, 2.5, 30.0, 151),
])
def test_grid_frame_count(start: float, end: float, fps: float, expected: int) -> None:
    assert grid_frame_count(start, end, fps) == expected


def test_anchor_frames() -> None:
    assert anchor_frames(10, 3).tolist() == [0, 3, 6, 9]
    assert anchor_frames(9, 3).tolist() == [0, 3, 6]
    assert anchor_frames(1, 5).tolist() == [0]
    assert anchor_frames(0, 1).tolist() == []
    assert anchor_frames(4, 1).dtype == np.int64


def test_query_times_hand_computed() -> None:
    q = query_times(1.0, 10.0, np.array([0, 3]), _window(50.0, 5, offset=-0.04))
    assert q.shape == (2, 5) and q.dtype == np.float64
    np.testing.assert_allclose(q, [[0.96, 0.98, 1.00, 1.02, 1.04], [1.26, 1.28, 1.30, 1.32, 1.34]], rtol=0, atol=1e-12)
    for w, k in enumerate((0, 3)):
        for j in range(5):  # every time from integers: (start + k / fps + offset) + j / rate
            assert q[w, j] == (1.0 + k / 10.0 + -0.04) + j / 50.0


def test_query_times_are_not_accumulated() -> None:
    q = query_times(1.0, 10.0, np.array([1000]), _window(10.0, 1))
    assert q[0, 0] == 1.0 + 1000 / 10.0 == 101.0
    accumulated = 1.0
    for _ in range(1000):
        accumulated += 0.1
    assert accumulated != 101.0  # what accumulation would have given
    q = query_times(0.3, 30.0, np.array([0, 1000, 123456]), _window(50.0, 3, offset=0.5))
    assert q[1].tolist() == [0.3 + 1000 / 30.0 + 0.5 + j / 50.0 for j in range(3)]
    assert q[2, 2] == 0.3 + 123456 / 30.0 + 0.5 + 2 / 50.0


def test_query_times_do_not_depend_on_batching() -> None:
    window = _window(7.0, 4, offset=-0.3)
    everything = query_times(0.123, 15.0, np.arange(0, 50), window)
    for lo in range(0, 50, 7):
        np.testing.assert_array_equal(query_times(0.123, 15.0, np.arange(lo, min(lo + 7, 50)), window),
                                      everything[lo:lo + 7])


def test_pad_invalid_zero_and_edge() -> None:
    values = np.arange(1, 13, dtype=np.float64).reshape(2, 3, 2)  # [W=2, n=3, N=2]
    valid = np.array([[True, False, True], [False, False, True]])
    zero = pad_invalid(values, valid, "zero")
    assert zero.tolist() == [[[1, 2], [0, 0], [5, 6]], [[0, 0], [0, 0], [11, 12]]]
    assert values[0, 1].tolist() == [3, 4]  # the input is not modified
    np.testing.assert_array_equal(pad_invalid(values, valid, "edge"), values)


def test_valid_fraction() -> None:
    a = np.array([[True, False, True, True], [False, False, False, False]])  # [W=2, n=4]
    b = np.array([[False, False], [True, True]])  # [W=2, n=2]
    np.testing.assert_array_equal(valid_fraction([a, b]), [3 / 6, 2 / 6])
    np.testing.assert_array_equal(valid_fraction([a]), [0.75, 0.0])
    assert valid_fraction([]).shape == (0,)


def _spec(windows: dict[str, StreamWindow], **kw: object) -> BuildSpec:
    base = dict(fps=10.0, stride=1, min_valid_fraction=0.0, float_dtype="float32", strict_timestamps=False,
                max_gap_factor=2.5, windows=windows, value_dtypes={n: "float64" for n in windows},
                static_fields=(), clock=None)
    return BuildSpec(**{**base, **kw})


def _decode(blob: bytes) -> tuple[str, dict[str, memoryview]]:
    samples = list(group_samples(iter_members(blob)))
    assert len(samples) == 1 and samples[0][1] == 0
    return samples[0][0], samples[0][2]


def test_build_small_episode_exact() -> None:
    t = np.arange(0, 6) * 0.1  # samples at 0.0 .. 0.5, value = 10 * t
    data = EpisodeData("ep", streams={"x": np.column_stack([t, 10 * t])}, texts={"task": "go"})
    spec = _spec({"x": _window(10.0, 3, offset=-0.1, pad="edge")}, stride=2, static_fields=("task",))
    out = EpisodeWindows()
    samples = [_decode(b) for b in build_episode(data, spec, "ep", {"episode_id": "ep"}, out)]
    assert out.anchors == [0, 2, 4] and out.keys == ["ep_000000", "ep_000002", "ep_000004"]
    assert [k for k, _ in samples] == out.keys
    expected = {0: ([0, 0, 1], [False, True, True]), 2: ([1, 2, 3], [True] * 3), 4: ([3, 4, 5], [True] * 3)}
    for (key, fields), anchor in zip(samples, out.anchors):
        assert sorted(fields) == ["meta.json", "task.txt", "x.npy", "x_mask.npy"]
        values, mask = decode_npy(fields["x.npy"]), decode_npy(fields["x_mask.npy"])
        assert values.dtype == np.float32 and values.shape == (3, 1) and mask.dtype == bool
        np.testing.assert_allclose(values[:, 0], expected[anchor][0], atol=1e-6)
        assert mask.tolist() == expected[anchor][1]
        assert bytes(fields["task.txt"]) == b"go"
        assert json.loads(bytes(fields["meta.json"])) == {"episode_id": "ep", "anchor": anchor,
                                                          "t": round(anchor / 10, 9)}
    assert out.report["candidates"] == 3 and out.report["emitted"] == 3
    assert out.report["masked_steps"] == {"x": 1} and out.report["steps"] == {"x": 9}
    assert out.stats["x"].count == 8


@pytest.mark.parametrize("max_gap, mask", [(0.31, [True] * 6), (0.29, [True, True, True, False, False, True])])
def test_build_gap_longer_than_max_gap_is_masked(max_gap: float, mask: list[bool]) -> None:
    t = np.array([0.0, 0.1, 0.2, 0.5, 0.6])  # a 0.3 s gap between 0.2 and 0.5 (0.30000000000000004)
    data = EpisodeData("ep", streams={"x": np.column_stack([t, 10 * t])})
    spec = _spec({"x": _window(10.0, 6, pad="edge", max_gap=max_gap)}, fps=10.0)
    (blob,) = list(build_episode(data, spec, "ep", {}, EpisodeWindows()))[:1]
    fields = _decode(blob)[1]
    assert decode_npy(fields["x_mask.npy"]).tolist() == mask
    expected = [0, 1, 2, 3, 4, 5] if mask[3] else [0, 1, 2, 2, 2, 5]  # edge = the sample before the gap
    np.testing.assert_allclose(decode_npy(fields["x.npy"])[:, 0], expected, atol=1e-6)


def test_edge_padding_does_not_leak_data_outside_declared_extent() -> None:
    t = np.arange(0.0, 11.0)  # a longer recording, value = t; the episode is [2, 5]
    data = EpisodeData("ep", streams={"x": np.column_stack([t, t])}, start_s=2.0, end_s=5.0)
    spec = _spec({"x": _window(1.0, 3, offset=-1.0, pad="edge")}, fps=1.0)
    fields = [_decode(b)[1] for b in build_episode(data, spec, "ep", {}, EpisodeWindows())]
    values = [decode_npy(f["x.npy"])[:, 0].tolist() for f in fields]
    masks = [decode_npy(f["x_mask.npy"]).tolist() for f in fields]
    assert masks == [[False, True, True], [True, True, True], [True, True, True], [True, True, False]]
    assert values == [[2, 2, 3], [2, 3, 4], [3, 4, 5], [4, 5, 5]]  # gets 1.0 and 6.0 at the padded steps


# --- build_episode, property ---

@st.composite
def _stream(draw: st.DrawFn, dims: int, base: float) -> np.ndarray:
    rate = draw(st.sampled_from([3.0, 7.0, 10.0, 20.0, 50.0, 12.5]))
    n = draw(st.integers(2, 30))  # clean_stream rejects < 2 samples
    t = draw(st.floats(-1.0, 1.0)) + np.arange(n) / rate
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        t = t + rng.uniform(0.0, 0.4 / rate, n)  # irregular, still strictly increasing
    if n > 1 and draw(st.booleans()):
        t[draw(st.integers(1, n - 1)):] += draw(st.floats(0.2, 2.0))  # a gap
    return np.column_stack([t, base + rng.uniform(0.0, 1.0, (n, dims))])


@st.composite
def _stream_window(draw: st.DrawFn) -> StreamWindow:
    return _window(draw(st.sampled_from([5.0, 7.0, 10.0, 20.0, 50.0])), draw(st.integers(1, 6)),
                   offset=draw(st.floats(-1.0, 1.0)), pad=draw(st.sampled_from(["zero", "edge"])),
                   max_gap=draw(st.none() | st.floats(0.05, 1.0)),
                   interpolation=draw(st.sampled_from(["linear", "hold", "nearest"])))


@st.composite
def _episode(draw: st.DrawFn, name: str, base: float) -> EpisodeData:
    data = EpisodeData(name, streams={"joints": draw(_stream(2, base)), "grip": draw(_stream(1, base))},
                       texts={"task": f"task of {name}"})
    if draw(st.booleans()):
        data.start_s = draw(st.floats(-1.0, 1.0))
        data.end_s = data.start_s + draw(st.floats(0.0, 4.0))
    return data


def _reference(data: EpisodeData, spec: BuildSpec) -> tuple[float, float, dict]:
    """Extent and, per stream, a function anchor -> (query times, mask, edge value or None, valid value)."""
    basis = [data.streams[spec.clock]] if spec.clock else list(data.streams.values())
    start = data.start_s if data.start_s is not None else min(s[0, 0] for s in basis)
    end = data.end_s if data.end_s is not None else max(s[-1, 0] for s in basis)
    out = {}
    for name, raw in data.streams.items():
        t, v, w = raw[:, 0], raw[:, 1:], spec.windows[name]
        max_gap = w.max_gap_s if w.max_gap_s is not None else (
            spec.max_gap_factor * float(np.median(np.diff(t))) if len(t) > 1 else math.inf)
        # a step exactly max_gap long (samples every 0.05 s with max_gap_s 0.05): whether it is "longer"
        # is decided by float rounding of the times after the export shifts them to the episode start
        # (CI drew 1.3 - 1.25 > 0.05 here but not in the export): not a case to test
        assume(not (np.abs(np.diff(t) - max_gap) < 2 * EPS).any())

        def ref(anchor: int, t=t, v=v, w=w, max_gap=max_gap):  # noqa: ANN202
            q = np.array([start + anchor / spec.fps + w.offset_s + j / w.rate_hz for j in range(w.steps)])
            # exactly TIME_EPS from a sample or the extent, float rounding decides: not a case to test
            d = np.abs(q[:, None] - np.concatenate([t, [start, end]])[None, :])
            assume(not ((d > 0.5 * EPS) & (d < 2 * EPS)).any())
            in_extent = (q >= start - EPS) & (q <= end + EPS)
            qc = np.clip(q, start, end)  # outside the extent: evaluated at its nearest end
            in_stream = (qc >= t[0] - EPS) & (qc <= t[-1] + EPS)
            in_gap = np.zeros(len(q), dtype=bool)
            edge = np.full((len(q), v.shape[1]), np.nan)
            edge[qc < t[0] - EPS], edge[qc > t[-1] + EPS] = v[0], v[-1]
            for a in np.flatnonzero(np.diff(t) > max_gap):
                inside = (qc > t[a] + EPS) & (qc < t[a + 1] - EPS)
                in_gap |= inside
                edge[inside] = v[a]
            if w.interpolation == "linear":
                value = np.column_stack([np.interp(qc, t, v[:, d]) for d in range(v.shape[1])])
            elif w.interpolation == "hold":
                value = v[np.clip(np.searchsorted(t, qc + EPS, side="right") - 1, 0, len(t) - 1)]
            else:
                value = None
            by_extent = ~in_extent & in_stream & ~in_gap  # real data at the extent's end, masked
            if value is not None:
                edge[by_extent] = value[by_extent]
            return q, in_stream & in_extent & ~in_gap, edge, value
        out[name] = ref
    return start, end, out


def _check_episode(data: EpisodeData, spec: BuildSpec, prefix: str, lo: float, hi: float) -> list[str]:
    windows = EpisodeWindows()
    blobs = list(build_episode(data, spec, prefix, {"episode_id": data.episode_id}, windows))
    start, end, refs = _reference(data, spec)
    candidates = list(range(0, math.floor((end - start) * spec.fps + 1e-6) + 1, spec.stride))
    masks = {a: {n: refs[n](a)[1] for n in refs} for a in candidates}
    emitted = [a for a in candidates
               if sum(m.sum() for m in masks[a].values()) / sum(m.size for m in masks[a].values())
               >= spec.min_valid_fraction - 1e-12]
    assert windows.anchors == emitted and windows.keys == [f"{prefix}_{a:06d}" for a in emitted]
    assert windows.report["candidates"] == len(candidates)
    assert windows.report["dropped_min_valid"] == len(candidates) - len(emitted)
    valid_steps = dict.fromkeys(refs, 0)
    keys = []
    for blob, anchor in zip(blobs, emitted, strict=True):
        key, fields = _decode(blob)
        assert key == f"{prefix}_{anchor:06d}" and key.startswith(prefix + "_")
        keys.append(key)
        assert bytes(fields["task.txt"]) == f"task of {data.episode_id}".encode()
        assert json.loads(bytes(fields["meta.json"]))["anchor"] == anchor
        for name, ref in refs.items():
            q, mask, edge, value = ref(anchor)
            w = spec.windows[name]
            got, got_mask = decode_npy(fields[f"{name}.npy"]), decode_npy(fields[f"{name}_mask.npy"])
            assert got.dtype == np.dtype(spec.float_dtype) and got.shape == (w.steps, data.streams[name].shape[1] - 1)
            assert got_mask.dtype == bool and got_mask.tolist() == mask.tolist(), (name, anchor, q)
            valid_steps[name] += int(mask.sum())
            assert ((got[mask] >= lo) & (got[mask] <= hi)).all()  # never another episode's values
            if value is not None:
                np.testing.assert_allclose(got[mask], value[mask], rtol=1e-6, atol=1e-6)
            if w.pad == "zero":
                assert (got[~mask] == 0).all()
            else:
                known = ~mask & ~np.isnan(edge[:, 0])
                # sample edges are exact; an extent edge is interpolated (np.interp may differ by 1 ulp)
                np.testing.assert_allclose(got[known], edge[known].astype(got.dtype), rtol=1e-6, atol=1e-12)
                assert ((got[~mask] >= lo) & (got[~mask] <= hi)).all()
    for name, count in valid_steps.items():
        stats = windows.stats[name]
        assert (stats.count if stats is not None else 0) == count
    return keys


@given(a=_episode("ep A", 0.0), b=_episode("ep/B", 10.0), fps=st.sampled_from([5.0, 10.0, 15.0, 30.0]),
       stride=st.integers(1, 4), joints=_stream_window(), grip=_stream_window(),
       clock=st.sampled_from([None, "joints"]), min_valid=st.sampled_from([0.0, 0.3, 1.0]),
       float_dtype=st.sampled_from(["float32", "float64"]), gap_factor=st.sampled_from([1.5, 2.5]))
@settings(max_examples=100, deadline=None)
def test_build_episode_masks_padding_and_isolation(a: EpisodeData, b: EpisodeData, fps: float, stride: int,
                                                   joints: StreamWindow, grip: StreamWindow, clock: str | None,
                                                   min_valid: float, float_dtype: str, gap_factor: float) -> None:
    spec = _spec({"joints": joints, "grip": grip}, fps=fps, stride=stride, clock=clock, min_valid_fraction=min_valid,
                 float_dtype=float_dtype, max_gap_factor=gap_factor, static_fields=("task",))
    keys_a = _check_episode(a, spec, "ep-A", 0.0, 1.0)  # values of A in [0, 1), of B in [10, 11)
    keys_b = _check_episode(b, spec, "ep-B", 10.0, 11.0)
    assert not set(keys_a) & set(keys_b)
