"""The export config `robowds convert lerobot` writes into the store (`STORE/export.yaml`): LeRobot's
item semantics in one step.

Why: a LeRobot dataset item with `delta_timestamps` takes each delta as a whole frame of the dataset's
fps and, where a frame falls outside the episode, repeats the episode's first or last frame and flags
it (`<key>_is_pad`). robowds' defaults differ (fps 10, zero padding), so a user who wants the windows
LeRobot would give has to know three settings; this file has them: `fps` = the dataset's fps,
`pad: edge` for every field (the mask `<field>_mask` is `not <key>_is_pad`), and one frame per field
(LeRobot's item without delta_timestamps). Commented lines under each field show how a state history,
an action chunk and a camera history map from delta_timestamps to `offset_s` / `duration_s`.

`robowds export STORE OUT --config STORE/export.yaml` uses it as it is; the store's fingerprint does not
cover it (export/store/fingerprint.py), so editing it does not make earlier exports of the store stale.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Protocol

from robowds.export.store.declarations import EXPORT_YAML  # written beside store.yaml, not in the fingerprint

HISTORY_FRAMES = 3  # the state history example: deltas [-2/fps, -1/fps, 0]
CHUNK_FRAMES = 16  # the action chunk example: deltas [0, 1/fps, ..., 15/fps]
CAMERA_FRAMES = 2  # the camera history example: deltas [-1/fps, 0]


class LeRobotFeature(Protocol):
    """What this module needs of `meta.Feature` (not imported: the package's `__init__` imports this module)."""

    key: str  # LeRobot's feature key, e.g. observation.state
    field: str  # the store's field name, e.g. observation_state
    kind: str  # "timeseries" | "video" | "images" (per-frame images, a video field in the store)


def export_files(fps: float, features: Iterable[LeRobotFeature], source: Path) -> dict[str, str]:
    """{"export.yaml": its text} for `Conversion.files`: written into the store with it."""
    fields = [(f.field, f.key, "timeseries" if f.kind == "timeseries" else "video") for f in features]
    return {EXPORT_YAML: export_config_text(fps, fields, str(source))}


def _number(value: float) -> str:
    """A YAML number as a user would write it: `30` for a whole fps, else 6 decimals (within 5e-7 s of
    the exact fraction, well inside the 1e-4 s the export snaps to a whole frame)."""
    if float(value).is_integer():
        return str(int(value))
    return repr(round(float(value), 6))


def _delta_list(first: int, count: int, fps: float) -> str:
    """LeRobot's delta_timestamps list as frames over fps, shortened past four entries."""
    rate = _number(fps)
    frames = [f"{k}/{rate}" if k else "0" for k in range(first, first + count)]
    return "[" + ", ".join(frames if count <= 4 else [*frames[:2], "...", frames[-1]]) + "]"


def _example(what: str, first: int, count: int, fps: float) -> list[str]:
    """Commented lines that turn a field's window into `count` frames starting `first` frames from
    the anchor (negative: history)."""
    lines = [f"    # {what}: delta_timestamps {_delta_list(first, count, fps)} ({count} frames)"]
    if first:
        lines.append(f"    # offset_s: {_number(first / fps)}")
    lines.append(f"    # duration_s: {_number(count / fps)}")
    return lines


def export_config_text(fps: float, fields: Iterable[tuple[str, str, str]], source: str) -> str:
    """The YAML text of `STORE/export.yaml` for a converted LeRobot dataset.

    `fields`: (store field name, LeRobot feature key, kind "timeseries" | "video") of every windowed
    field, in store order. The examples go to `observation.state` (else the first time series that is
    not `action`), `action`, and the first camera."""
    fields = list(fields)
    series = [f for f in fields if f[2] == "timeseries"]
    state = next((f[0] for f in series if f[1] == "observation.state"),
                 next((f[0] for f in series if f[1] != "action"), None))
    action = next((f[0] for f in series if f[1] == "action"), None)
    camera = next((f[0] for f in fields if f[2] == "video"), None)
    lines = [
        f"# Export config written by `robowds convert lerobot` from {' '.join(source.splitlines())}:",
        "# the windows a LeRobot dataset item gives, on the dataset's frame grid.",
        "#   robowds export STORE OUT --config STORE/export.yaml",
        "# Each field is sampled at anchor + offset_s + j / rate_hz for j < duration_s x rate_hz (rate_hz:",
        "# the fps below). LeRobot's delta_timestamps [d0, d0 + 1/fps, ..., dn] for a feature become",
        "# offset_s = d0 and duration_s = (number of deltas) / fps; an offset or duration within 1e-4 s of",
        "# a whole number of frames is taken as exactly that (LeRobot's tolerance_s), so -0.0333 is -1/30.",
        "# pad: edge repeats the episode's first / last frame outside it, as LeRobot does; <field>_mask",
        "# is false there (LeRobot's <key>_is_pad is `not <field>_mask`). See docs/convert.md.",
        f"fps: {_number(fps)}",
        "# every field: one frame at the anchor (an item without delta_timestamps), edge padded",
        f"window: {{duration_s: {1.0 / fps!r}, offset_s: 0.0, rate_hz: null, pad: edge}}",
        "streams:" if fields else "streams: {}",
    ]
    examples = {state: ("a state history", 1 - HISTORY_FRAMES, HISTORY_FRAMES),
                action: ("an action chunk", 0, CHUNK_FRAMES),
                camera: ("a camera history", 1 - CAMERA_FRAMES, CAMERA_FRAMES)}
    for name, _, _ in fields:
        lines.append(f"  {name}:")
        lines.append("    pad: edge")
        if name in examples:
            lines += _example(*examples[name], fps)
    return "\n".join(lines) + "\n"
