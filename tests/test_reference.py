"""The independent reference (`tests/reference.py`) against hand-computed windows, so that the end-to-end
tests comparing exports with it rest on values a person worked out, not on a second program alone."""

from __future__ import annotations

import math

import numpy as np

from reference import Config, StreamConfig, expected_episode

# 0 .. 0.2 s at 10 Hz, then a 0.3 s gap (> 2.5 x the 0.1 s median period) to the last sample at 0.5 s
RAW = np.array([[0.0, 0.0], [0.1, 1.0], [0.2, 2.0], [0.5, 5.0]])  # [T, 1+1]


def _windows(pad: str, method: str = "linear", min_valid: float = 0.0, raw: np.ndarray = RAW) -> dict:
    config = Config(fps=10.0, min_valid_fraction=min_valid,
                    streams={"x": StreamConfig(method, rate_hz=20, duration_s=0.2, offset_s=-0.05, pad=pad)})
    return {w.anchor: w for w in expected_episode("ep", {"x": raw}, config)}


def test_linear_edges_gap_and_extent_by_hand() -> None:
    windows = _windows("edge")
    assert sorted(windows) == [0, 1, 2, 3, 4, 5]  # extent [0, 0.5] at 10 fps
    first, gap, last = windows[0], windows[3], windows[5]
    # anchor 0: -0.05 (before the extent: the value at 0), 0, 0.05 (halfway), 0.1
    assert first.values["x"].ravel().tolist() == [0.0, 0.0, 0.5, 1.0]
    assert first.masks["x"].tolist() == [False, True, True, True]
    # anchor 3: 0.25 .. 0.4 lie inside the gap: the sample before it, masked
    assert gap.values["x"].ravel().tolist() == [2.0, 2.0, 2.0, 2.0] and not gap.masks["x"].any()
    # anchor 5: 0.45 in the gap, 0.5 the last sample, 0.55 and 0.6 past the extent
    assert last.values["x"].ravel().tolist() == [2.0, 5.0, 5.0, 5.0]
    assert last.masks["x"].tolist() == [False, True, False, False]
    assert first.values["x"].dtype == np.float32 and first.t == 0.0 and last.t == 0.5


def test_zero_padding_and_min_valid_fraction_by_hand() -> None:
    windows = _windows("zero", min_valid=0.5)
    # real steps of 4 per anchor: 0: 3, 1: 4, 2: 2 (0.25 and 0.3 lie in the gap), 3: 0, 4: 0, 5: 1
    assert sorted(windows) == [0, 1, 2]
    assert windows[0].values["x"].ravel().tolist() == [0.0, 0.0, 0.5, 1.0]
    assert windows[2].values["x"].ravel().tolist() == [1.5, 2.0, 0.0, 0.0]
    assert windows[2].masks["x"].tolist() == [True, True, False, False]


def test_hold_and_nearest_by_hand() -> None:
    raw = np.array([[0.0, 1.0], [0.25, 2.0], [0.5, 3.0], [0.75, 4.0]])  # binary-exact times: ties are ties
    got = {}
    for method in ("hold", "nearest"):
        config = Config(fps=4.0, streams={"x": StreamConfig(method, rate_hz=16, duration_s=0.5)})
        got[method] = expected_episode("ep", {"x": raw}, config)[0].values["x"].ravel().tolist()  # 0 .. 0.4375 s
    assert got["hold"] == [1, 1, 1, 1, 2, 2, 2, 2]
    assert got["nearest"] == [1, 1, 1, 2, 2, 2, 2, 3]  # 0.125 and 0.375 are ties: the earlier sample


def test_slerp_fixes_the_hemisphere_by_hand() -> None:
    half = math.pi / 8  # a 45 degree turn about z between the two samples, the second stored as -q
    raw = np.array([[0.0, 0.0, 0.0, 0.0, 1.0], [0.2, 0.0, 0.0, -math.sin(half), -math.cos(half)]])
    config = Config(fps=10.0, streams={"q": StreamConfig("slerp", rate_hz=10, duration_s=0.3)})
    (window, *_) = expected_episode("ep", {"q": raw}, config)
    quarter = math.pi / 16  # halfway: 22.5 degrees
    np.testing.assert_allclose(window.values["q"], [[0, 0, 0, 1], [0, 0, math.sin(quarter), math.cos(quarter)],
                                                    [0, 0, math.sin(half), math.cos(half)]], atol=1e-7)
    assert window.masks["q"].tolist() == [True, True, True]
