"""Offsets and durations within 1e-4 s of a whole number of steps are taken as exactly that (LeRobot's
`tolerance_s` for delta_timestamps); farther ones are kept (offsets interpolated, durations refused)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robowds.export.core.windows import SNAP_TOLERANCE_S, snap_to_step
from robowds.export.errors import UserError
from robowds.export.job.config import load_config, snap_notes, stream_window

RATES = st.floats(min_value=0.5, max_value=2000.0)  # a step of at least 5e-4 s: more than twice the tolerance
STEPS = st.integers(min_value=-100_000, max_value=100_000)


@settings(max_examples=100, deadline=None)
@given(rate=RATES, k=STEPS, fraction=st.floats(min_value=-0.999, max_value=0.999))
def test_an_offset_within_the_tolerance_of_a_step_snaps_to_it_exactly(rate: float, k: int, fraction: float) -> None:
    value = k / rate + fraction * SNAP_TOLERANCE_S
    assert snap_to_step(value, rate) == k / rate
    assert snap_to_step(k / rate, rate) == k / rate  # snapped values snap to themselves (manifest re-resolve)


@settings(max_examples=100, deadline=None)
@given(rate=RATES, k=STEPS, fraction=st.floats(min_value=1.001, max_value=1000.0), sign=st.sampled_from([-1, 1]))
def test_an_offset_farther_from_every_step_is_unchanged(rate: float, k: int, fraction: float, sign: int) -> None:
    off = min(fraction * SNAP_TOLERANCE_S, 0.5 / rate)  # at most half a step from k / rate: k is the nearest
    value = k / rate + sign * off
    assert snap_to_step(value, rate) == value


def test_values_too_large_for_steps_are_unchanged() -> None:
    assert snap_to_step(1e300, 30.0) == 1e300 and snap_to_step(-1e300, 1e10) == -1e300


def test_lerobot_deltas_written_rounded_resolve_to_whole_frames() -> None:
    config = load_config(None, ["fps=30", "streams.state.offset_s=-0.0667", "streams.state.duration_s=0.1",
                                "streams.action.duration_s=0.5333", "streams.late.offset_s=-0.0330",
                                "window.duration_s=0.0333"])
    state = stream_window(config, "state", "linear", None)
    assert (state.offset_s, state.duration_s, state.steps) == (-2 / 30, 0.1, 3)
    action = stream_window(config, "action", "linear", None)
    assert (action.offset_s, action.duration_s, action.steps) == (0.0, 16 / 30, 16)
    late = stream_window(config, "late", "linear", None)  # 3e-4 s from -1/30: interpolated as written
    assert (late.offset_s, late.duration_s, late.steps) == (-0.033, 1 / 30, 1)
    resolved = {"streams": {n: w.__dict__ for n, w in (("state", state), ("action", action), ("late", late))}}
    assert snap_notes(config, resolved) == [
        "streams.state.offset_s -0.0667 s taken as -2 x 1/30 s = -0.06666666666666667 s (within 0.0001 s of a whole step)",
        "streams.action.duration_s 0.5333 s taken as 16 x 1/30 s = 0.5333333333333333 s (within 0.0001 s of a whole "
        "step)",
        "window.duration_s (for late) 0.0333 s taken as 1 x 1/30 s = 0.03333333333333333 s (within 0.0001 s of a whole "
        "step)"]


def test_a_duration_farther_than_the_tolerance_from_whole_steps_is_refused() -> None:
    config = load_config(None, ["fps=30", "streams.action.duration_s=0.533"])  # 3.3e-4 s short of 16 steps
    with pytest.raises(UserError) as caught:
        stream_window(config, "action", "linear", None)
    assert caught.value.message == ("config streams.action.duration_s is 0.533 s, which at fps 30 Hz is 15.99 steps "
                                    "of field 'action': not a whole number of steps")
    assert "within 0.0001 s of one is taken as that multiple" in caught.value.hint
