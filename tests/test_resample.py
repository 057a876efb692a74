"""Tests for the resampler (export/core/resample.py): clean_stream + resample against the module contract."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from robowds.export.core.resample import METHODS, TIME_EPS, Repairs, Stream, StreamError, clean_stream, resample
from robowds.export.store.episodes import ns_to_seconds

S225, C225 = math.sin(math.radians(22.5)), math.cos(math.radians(22.5))


def _stream(times: list[float], values: list[list[float]], method: str = "linear", **kw: object) -> Stream:
    raw = np.column_stack([np.asarray(times, dtype=np.float64), np.asarray(values, dtype=np.float64)])
    return clean_stream(raw, method, **kw)


def _zquat(deg: float) -> list[float]:
    """Rotation about z by `deg` degrees, xyzw."""
    h = math.radians(deg) / 2
    return [0.0, 0.0, math.sin(h), math.cos(h)]


# --- 1. Hand-computed values for every method ---

TINY_T = [0.0, 1.0, 2.0]
TINY_V = [[0.0], [10.0], [20.0]]
TINY_Q = [-0.5, 0.0, 0.25, 0.75, 1.0, 1.5, 2.0, 2.5]
TINY_VALID = [False, True, True, True, True, True, True, False]
TINY_EXPECTED = {"linear": [0.0, 0.0, 2.5, 7.5, 10.0, 15.0, 20.0, 20.0],
                 "hold": [0.0, 0.0, 0.0, 0.0, 10.0, 10.0, 20.0, 20.0],
                 "nearest": [0.0, 0.0, 0.0, 10.0, 10.0, 10.0, 20.0, 20.0]}  # 1.5 is a tie -> earlier


@pytest.mark.parametrize("method", ["linear", "hold", "nearest"])
def test_tiny_stream_exact_values(method: str) -> None:
    out, valid = resample(_stream(TINY_T, TINY_V, method), np.array(TINY_Q), method)
    assert out.shape == (len(TINY_Q), 1)
    np.testing.assert_array_equal(out[:, 0], TINY_EXPECTED[method])
    np.testing.assert_array_equal(valid, TINY_VALID)
    assert valid.dtype == bool


def test_tiny_stream_slerp_exact_values() -> None:
    s = _stream(TINY_T, [_zquat(0), _zquat(90), _zquat(180)], "slerp")
    out, valid = resample(s, np.array(TINY_Q), "slerp")
    expected = [_zquat(d) for d in (0, 0, 22.5, 67.5, 90, 135, 180, 180)]
    np.testing.assert_allclose(out, expected, atol=1e-12)
    np.testing.assert_array_equal(valid, TINY_VALID)


@pytest.mark.parametrize("method", METHODS)
def test_query_within_time_eps_of_a_sample_selects_it_exactly(method: str) -> None:
    s = _stream(TINY_T, [_zquat(0), _zquat(40), _zquat(80)], method)
    q = np.array([-1e-12, 1e-12, 1.0 - 1e-12, 1.0 + 1e-12, 2.0 - 1e-12, 2.0 + 1e-12])
    out, valid = resample(s, q, method)
    np.testing.assert_array_equal(out, s.values[[0, 0, 1, 1, 2, 2]])
    assert valid.all()


Q_JUST_OUT = 0.29999999899999996  # 1.0000000272e-9 s before 0.3: just over TIME_EPS, so not "at" 0.3


@pytest.mark.parametrize("times, vals, expected, expected_valid", [
    ([0.3, 1.3], [0, 100], 0.0, False),  # before the first sample (got -1e-7, valid)
    ([-0.7, 0.3], [0, 100], 100.0 - 1e-7, True),  # just before the last sample (got 100, invalid)
    ([-9.7, -8.7, -7.7, 0.3, 1.3], [0, 0, 0, 100, 100], 0.0, False),  # strictly inside a gap (got 100, valid)
])
def test_query_just_over_time_eps_before_a_sample(times: list[float], vals: list[float], expected: float,
                                                  expected_valid: bool) -> None:
    assert 0.3 - Q_JUST_OUT > TIME_EPS
    out, valid = resample(_stream(times, [[v] for v in vals]), np.array([Q_JUST_OUT]), "linear")
    assert (out[0, 0], valid[0]) == (pytest.approx(expected, abs=1e-12), expected_valid)


def test_time_eps_is_the_boundary() -> None:
    s = _stream(TINY_T, TINY_V, "hold")
    out, valid = resample(s, np.array([1.0 - 1e-8, 2.0 + 1e-8]), "hold")
    np.testing.assert_array_equal(out[:, 0], [0.0, 20.0])  # 10 ns early: hold does not look ahead
    np.testing.assert_array_equal(valid, [True, False])  # 10 ns past the last sample: out of range


GAP_T = [0.0, 1.0, 2.0, 3.0, 6.0, 7.0]  # periods 1,1,1,3,1 -> median 1, default max_gap 2.5
GAP_V = [_zquat(d) for d in (0, 10, 20, 30, 60, 70)]


@pytest.mark.parametrize("method", METHODS)
def test_gap_longer_than_default_max_gap(method: str) -> None:
    s = _stream(GAP_T, GAP_V, method)
    q = np.array([3.0, 3.0 + 1e-6, 4.5, 6.0 - 1e-6, 6.0, 6.5])
    out, valid = resample(s, q, method)
    np.testing.assert_array_equal(valid, [True, False, False, False, True, True])
    np.testing.assert_array_equal(out[:4], s.values[[3, 3, 3, 3]])  # sample before the gap
    np.testing.assert_array_equal(out[4], s.values[4])


@pytest.mark.parametrize("max_gap, gap_valid", [(None, False), (2.9, False), (3.0, True), (10.0, True)])
def test_explicit_max_gap(max_gap: float | None, gap_valid: bool) -> None:
    s = _stream(GAP_T, [[v] for v in (0.0, 1.0, 2.0, 3.0, 6.0, 7.0)])
    assert s.median_period == 1.0
    out, valid = resample(s, np.array([0.5, 4.5]), "linear", max_gap=max_gap)
    assert valid[0] and valid[1] == gap_valid  # a gap of exactly max_gap is not "longer"
    np.testing.assert_array_equal(out[:, 0], [0.5, 4.5 if gap_valid else 3.0])


def test_small_max_gap_masks_every_interior_point_but_not_samples() -> None:
    s = _stream(TINY_T, TINY_V)
    out, valid = resample(s, np.array([0.0, 0.5, 1.0, 1.5, 2.0]), "linear", max_gap=0.5)
    np.testing.assert_array_equal(valid, [True, False, True, False, True])
    np.testing.assert_array_equal(out[:, 0], [0.0, 0.0, 10.0, 10.0, 20.0])


@pytest.mark.parametrize("method", ["linear", "hold", "nearest"])
def test_valid_range_masks_and_clamps_to_the_extent(method: str) -> None:
    s = _stream([0.0, 1.0, 2.0, 3.0, 4.0], [[0.0], [10.0], [20.0], [30.0], [40.0]], method)
    q = np.array([0.5, 1.0 - 1e-12, 2.0, 3.0, 3.5])
    out, valid = resample(s, q, method, valid_range=(1.0, 3.0))
    np.testing.assert_array_equal(valid, [False, True, True, True, False])
    # outside the extent: the value at its nearest end, never data recorded beyond it
    np.testing.assert_array_equal(out, resample(s, np.clip(q, 1.0, 3.0), method)[0])


def test_multi_column_linear() -> None:
    s = _stream(TINY_T, [[0.0, 1.0, -1.0], [10.0, 3.0, -5.0], [20.0, 5.0, -9.0]])
    out, valid = resample(s, np.array([0.25, 1.5, 3.0]), "linear")
    np.testing.assert_array_equal(out, [[2.5, 1.5, -2.0], [15.0, 4.0, -7.0], [20.0, 5.0, -9.0]])
    np.testing.assert_array_equal(valid, [True, True, False])


@pytest.mark.parametrize("method", ["hold", "nearest"])
def test_integer_values_keep_their_dtype(method: str) -> None:
    raw = np.array([[0, 3, -1], [1, 7, -2], [2, 9, -3]], dtype=np.int64)
    s = clean_stream(raw, method)
    out, valid = resample(s, np.array([-1.0, 0.4, 0.6, 2.0, 5.0]), method)
    assert s.values.dtype == np.int64 and out.dtype == np.int64
    mid = [3, -1] if method == "hold" else [7, -2]
    np.testing.assert_array_equal(out, [[3, -1], [3, -1], mid, [9, -3], [9, -3]])
    np.testing.assert_array_equal(valid, [False, True, True, True, False])
    s = clean_stream(raw, "linear")  # linear (and slerp) work in float64
    assert s.values.dtype == np.float64 and resample(s, np.array([0.5]), "linear")[0][0, 0] == 5.0


def test_unknown_method_raises() -> None:
    with pytest.raises(StreamError):
        resample(_stream(TINY_T, TINY_V), np.array([0.5]), "cubic")


# --- 2. clean_stream repairs ---

def test_nan_rows_and_nonfinite_times_are_dropped_and_counted() -> None:
    nan, inf = float("nan"), float("inf")
    s = _stream([0.0, 1.0, nan, 2.0, inf, -inf, 3.0], [[0, 0], [1, nan], [2, 2], [nan, 3], [4, 4], [5, 5], [6, 6]])
    np.testing.assert_array_equal(s.times, [0.0, 3.0])
    np.testing.assert_array_equal(s.values, [[0, 0], [6, 6]])
    assert s.repairs == Repairs(nonfinite_time=3, nan_rows=2)
    assert s.repairs.total() == 5 and s.repairs.as_dict()["nan_rows"] == 2


def test_unsorted_rows_are_stably_sorted_and_counted() -> None:
    s = _stream([0.0, 2.0, 1.0, 3.0, 2.5], [[0], [2], [1], [3], [25]])
    np.testing.assert_array_equal(s.times, [0.0, 1.0, 2.0, 2.5, 3.0])
    np.testing.assert_array_equal(s.values[:, 0], [0, 1, 2, 25, 3])
    assert s.repairs == Repairs(unsorted=2)  # 2 -> 1 and 3 -> 2.5


def test_duplicate_times_keep_the_last_row() -> None:
    s = _stream([0.0, 1.0, 1.0, 1.0, 2.0, 3.0, 4.0], [[0], [11], [12], [13], [2], [3], [4]])
    np.testing.assert_array_equal(s.times, [0.0, 1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(s.values[:, 0], [0, 13, 2, 3, 4])
    assert s.repairs == Repairs(duplicate_time=2)
    # unsorted duplicates: the stable sort keeps input order, so the last row *in the input* wins
    s = _stream([1.0, 0.0, 1.0, 2.0, 3.0], [[100], [0], [200], [2], [3]])
    np.testing.assert_array_equal(s.values[:, 0], [0, 200, 2, 3])
    assert s.repairs == Repairs(unsorted=1, duplicate_time=1)


@pytest.mark.parametrize("times", [[0.0, 1.0, 1.0, 1.0, 2.0], [0.0, 0.0, 1.0], [1.0, 0.0, 1.0]])
def test_few_distinct_times_with_duplicates_are_kept(times: list[float]) -> None:
    s = _stream(times, [[float(i)] for i in range(len(times))])
    np.testing.assert_array_equal(s.times, sorted(set(times)))


@pytest.mark.parametrize("raw", [
    np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]]),  # constant clock
    np.array([[1.0, 1.0], [2.0, float("nan")], [1.0, 3.0]]),  # constant once the missing sample is dropped
    np.zeros((0, 2)),  # empty
    np.array([[5.0, 1.0]]),  # a single sample: fewer than 2
    np.array([[5.0, 1.0], [6.0, float("nan")], [float("nan"), 2.0]]),  # 1 valid sample
    np.array([[0.0, float("nan")], [1.0, float("nan")]]),  # all NaN
    np.array([[float("nan"), 1.0], [float("inf"), 2.0]]),  # all times non-finite
    np.array([0.0, 1.0, 2.0]),  # not [T, N+1]
    np.array([[0.0], [1.0]]),  # no value column
    np.array([[0.0, 0, 0, 1], [1.0, 0, 0, 1]]),  # slerp needs 4 components
])
def test_unusable_streams_raise(raw: np.ndarray) -> None:
    with pytest.raises(StreamError):
        clean_stream(raw, "slerp" if raw.ndim == 2 and raw.shape[1] == 4 else "linear")


@pytest.mark.parametrize("times", [[0.0, 2.0, 1.0], [0.0, 1.0, 1.0, 2.0]])
def test_strict_rejects_unsorted_and_duplicates(times: list[float]) -> None:
    vals = [[float(i)] for i in range(len(times))]
    assert _stream(times, vals).repairs.total() == 1
    with pytest.raises(StreamError):
        _stream(times, vals, strict=True)


def test_strict_still_drops_missing_samples() -> None:
    s = _stream([0.0, 1.0, float("nan"), 2.0], [[0], [float("nan")], [5], [2]], strict=True)
    assert s.repairs == Repairs(nonfinite_time=1, nan_rows=1)


T0_NS = 1_700_000_000_000_000_000  # ~2023-11 in ns since the epoch


def test_int64_nanosecond_times() -> None:
    raw = np.array([[T0_NS + k * 20_000_000, k] for k in range(50)], dtype=np.int64)
    converted, origin = ns_to_seconds({"x": raw})
    assert origin == T0_NS
    s = clean_stream(converted["x"], "linear")
    assert s.times.dtype == np.float64 and s.repairs.total() == 0
    np.testing.assert_allclose(s.times, np.arange(50) * 0.02, rtol=0, atol=1e-15)  # relative: ns-exact
    out, valid = resample(s, s.times, "linear")
    np.testing.assert_array_equal(out[:, 0], np.arange(50.0))
    assert valid.all()


def test_distinct_nanosecond_times_are_not_duplicates() -> None:
    raw = np.array([[T0_NS, 1], [T0_NS + 100, 2], [T0_NS + 20_000_000, 3]], dtype=np.int64)
    other = np.array([[T0_NS - 5, 7], [T0_NS + 50, 8]], dtype=np.int64)
    converted, origin = ns_to_seconds({"a": raw, "b": other})
    assert origin == T0_NS - 5  # one origin for all streams of the episode keeps them aligned
    s = clean_stream(converted["a"], "hold")
    assert s.repairs.duplicate_time == 0 and len(s.times) == 3
    np.testing.assert_allclose(s.times, [5e-9, 105e-9, 0.020000005], rtol=0, atol=1e-15)


# --- 3. Quaternions ---

def test_alternating_signs_are_fixed_onto_the_first_samples_hemisphere() -> None:
    q = np.array(_zquat(30))
    s = _stream([0, 1, 2, 3, 4, 5], [q, -q, q, -q, -q, q], "slerp")
    np.testing.assert_allclose(s.values, np.tile(q, (6, 1)), atol=1e-15)
    assert (np.einsum("ij,ij->i", s.values[1:], s.values[:-1]) >= 0).all()


@pytest.mark.parametrize("scale_a, scale_b", [(1.0, -1.0), (3.0, -0.5)])  # negated, optionally non-unit
def test_slerp_takes_the_short_arc_xyzw(scale_a: float, scale_b: float) -> None:
    s = _stream([0.0, 1.0], [np.multiply(scale_a, _zquat(0)), np.multiply(scale_b, _zquat(90))], "slerp")
    out, valid = resample(s, np.array([0.0, 0.25, 0.5, 1.0]), "slerp")
    np.testing.assert_allclose(out, [_zquat(0), _zquat(22.5), [0, 0, S225, C225], _zquat(90)], atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-12)
    assert valid.all()


def test_slerp_wxyz_is_the_same_rotation_permuted() -> None:
    a, b = np.array(_zquat(0))[[3, 0, 1, 2]], -2.0 * np.array(_zquat(90))[[3, 0, 1, 2]]  # xyzw -> wxyz
    s = _stream([0.0, 1.0], [a, b], "slerp")
    out, _ = resample(s, np.array([0.5]), "slerp")
    np.testing.assert_allclose(out, [[C225, 0, 0, S225]], atol=1e-12)


def test_slerp_of_nearly_equal_quaternions_stays_unit_and_between() -> None:
    s = _stream([0.0, 1.0], [_zquat(0), _zquat(1e-4)], "slerp")  # within 1e-3 rad: normalised lerp
    out, _ = resample(s, np.array([0.5]), "slerp")
    np.testing.assert_allclose(out, [_zquat(0.5e-4)], atol=1e-12)


def test_zero_quaternions_are_dropped_and_counted() -> None:
    s = _stream([0, 1, 2, 3], [_zquat(0), [0, 0, 0, 0], _zquat(20), [0, 0, float("nan"), 0]], "slerp")
    np.testing.assert_array_equal(s.times, [0.0, 2.0])
    assert s.repairs == Repairs(nan_rows=1, zero_quaternion=1)


# --- 4. Properties against a per-query Python reference ---

Case = tuple[Stream, np.ndarray, "float | None"]


@st.composite
def cases(draw: st.DrawFn, method: str) -> Case:
    n = draw(st.integers(2, 12))
    t0 = draw(st.floats(-100, 100))
    incs = draw(st.lists(st.floats(1e-3, 5.0), min_size=n - 1, max_size=n - 1))
    times = t0 + np.concatenate([[0.0], np.cumsum(incs)])
    assume(np.all(np.diff(times) > 1e-4))
    vals = draw(st.lists(st.lists(st.floats(-1e3, 1e3), min_size=4, max_size=4), min_size=n, max_size=n))
    try:
        s = _stream(list(times), vals, method)
    except StreamError:  # slerp: fewer than 2 non-zero quaternions
        assume(False)
    lo, hi = s.times[0] - 2.0, s.times[-1] + 2.0
    q = draw(st.lists(st.floats(lo, hi), max_size=20))
    q += [s.times[k] + d for k in draw(st.lists(st.integers(0, len(s.times) - 1), max_size=6))
          for d in draw(st.sampled_from([(0.0,), (1e-12,), (-1e-12,)]))]
    # Drop queries ~TIME_EPS from a sample, where rounding decides (see test_query_just_over_time_eps_...).
    q = [x for x in q if not np.any((np.abs(s.times - x) > TIME_EPS / 2) & (np.abs(s.times - x) < 2 * TIME_EPS))]
    max_gap = draw(st.one_of(st.none(), st.floats(1e-3, 6.0)))
    return s, np.array(q, dtype=np.float64), max_gap


def _locate(t: np.ndarray, q: float) -> tuple[str, int]:
    """('at', k) within TIME_EPS, ('before'|'after', edge), or ('between', k) with t[k] < q < t[k+1]."""
    for k in range(len(t)):
        if abs(q - t[k]) <= TIME_EPS:
            return "at", k
    if q < t[0]:
        return "before", 0
    if q > t[-1]:
        return "after", len(t) - 1
    for k in range(len(t) - 1):
        if t[k] < q < t[k + 1]:
            return "between", k
    raise AssertionError(f"unreachable: {q}")


def _ref_valid(t: np.ndarray, q: float, max_gap: float) -> bool:
    where, k = _locate(t, q)
    return where == "at" or (where == "between" and t[k + 1] - t[k] <= max_gap)


def _max_gap(s: Stream, max_gap: float | None) -> float:
    return 2.5 * float(np.median(np.diff(s.times))) if max_gap is None else max_gap


PROPS = settings(max_examples=200, deadline=None)


@pytest.mark.parametrize("method", METHODS)
@PROPS
@given(data=st.data())
def test_valid_mask_and_edge_values_match_reference(method: str, data: st.DataObject) -> None:
    s, q, max_gap = data.draw(cases(method))
    out, valid = resample(s, q, method, max_gap=max_gap)
    gap = _max_gap(s, max_gap)
    assert out.shape == (len(q), 4) and valid.shape == (len(q),)
    for qi, oi, vi in zip(q, out, valid):
        assert vi == _ref_valid(s.times, qi, gap), qi  # (a)
        where, k = _locate(s.times, qi)
        if not vi or where == "at":  # (c) edge value / sample before the gap; at a sample: that sample
            np.testing.assert_array_equal(oi, s.values[k])
    if method == "slerp":
        np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-12)
        assert (np.einsum("ij,ij->i", s.values[1:], s.values[:-1]) >= 0).all()


@PROPS
@given(data=st.data())
def test_linear_matches_reference_and_stays_between_neighbours(data: st.DataObject) -> None:
    s, q, max_gap = data.draw(cases("linear"))
    out, valid = resample(s, q, "linear", max_gap=max_gap)
    t, v = s.times, s.values
    for qi, oi in zip(q[valid], out[valid]):  # (b)
        where, k = _locate(t, qi)
        if where == "at":
            np.testing.assert_array_equal(oi, v[k])
            continue
        ref = v[k] + (v[k + 1] - v[k]) * ((qi - t[k]) / (t[k + 1] - t[k]))
        assert np.allclose(oi, ref, rtol=1e-12, atol=1e-9), (qi, oi, ref)
        lo, hi = np.minimum(v[k], v[k + 1]), np.maximum(v[k], v[k + 1])
        assert np.all(oi >= lo - 1e-9) and np.all(oi <= hi + 1e-9)


@PROPS
@given(data=st.data())
def test_hold_never_looks_ahead(data: st.DataObject) -> None:
    s, q, max_gap = data.draw(cases("hold"))
    out, _ = resample(s, q, "hold", max_gap=max_gap)
    for qi, oi in zip(q, out):  # (d)
        at_or_before = [k for k in range(len(s.times)) if s.times[k] <= qi + TIME_EPS]
        np.testing.assert_array_equal(oi, s.values[at_or_before[-1] if at_or_before else 0])


@PROPS
@given(data=st.data())
def test_nearest_picks_the_closer_neighbour_ties_earlier(data: st.DataObject) -> None:
    s, q, max_gap = data.draw(cases("nearest"))
    out, valid = resample(s, q, "nearest", max_gap=max_gap)
    t = s.times
    for qi, oi in zip(q[valid], out[valid]):
        where, k = _locate(t, qi)
        if where == "between" and (t[k + 1] - qi) < (qi - t[k]):
            k += 1
        np.testing.assert_array_equal(oi, s.values[k])


@pytest.mark.parametrize("method", METHODS)
@PROPS
@given(data=st.data())
def test_resampling_at_the_sample_times_is_the_identity(method: str, data: st.DataObject) -> None:
    s, _, max_gap = data.draw(cases(method))
    out, valid = resample(s, s.times, method, max_gap=max_gap)  # (e)
    np.testing.assert_array_equal(out, s.values)
    assert valid.all()


def test_infinite_values_are_missing_samples() -> None:
    s = _stream([0.0, 1.0, 2.0, 3.0], [[0.0], [float("inf")], [2.0], [-float("inf")]])
    assert s.repairs == Repairs(nan_rows=2)
    np.testing.assert_array_equal(s.times, [0.0, 2.0])
    out, valid = resample(s, np.array([1.0, 3.0]), "linear")
    assert out[:, 0].tolist() == [1.0, 2.0] and valid.tolist() == [True, False]


def test_quaternions_of_extreme_magnitude_normalise_to_unit_length() -> None:
    """Components near 1e-160 square to subnormals and came out 4e-5 off unit length (hypothesis found
    [0, 0, 0, 1e-160]); near 1e-170 they squared to zero and the row was dropped as a zero quaternion;
    near 1e200 the norm overflowed and the row became zeros. Each is the same rotation as its unit
    multiple; an ordinary row normalises bit for bit as `q / |q|`."""
    unit = np.array(_zquat(30))
    s = _stream([0, 1, 2, 3], [list(unit * 1e-160), list(unit * 1e-170), list(unit * 1e200), list(unit * 3)], "slerp")
    assert s.repairs.zero_quaternion == 0 and len(s.times) == 4
    np.testing.assert_allclose(np.linalg.norm(s.values, axis=1), 1.0, rtol=0, atol=1e-15)
    np.testing.assert_allclose(s.values, np.tile(unit, (4, 1)), rtol=0, atol=1e-15)
    ordinary = unit * 3
    assert s.values[3].tobytes() == (ordinary / np.linalg.norm(ordinary)).tobytes()
    out, valid = resample(s, np.array([0.0, 10 ** -12, 2.5]), "slerp")
    assert valid.all() and np.allclose(np.linalg.norm(out, axis=1), 1.0, rtol=0, atol=1e-12)
