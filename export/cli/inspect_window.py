"""`robowds inspect OUT`: look at one exported window, as text or as a picture.

The picture shows the camera frames as a strip (padded frames crossed out in red), every time series
plotted over the window's time axis with the masked (padded) steps shaded, and the task text as title.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from robowds.export.errors import UserError
from robowds.export.job.publish import load_finished_manifest
from robowds.reader.decode import decode_sample
from robowds.reader.format import read_sample
from robowds.reader.manifest import ManifestError, shards_of


def load_window(out: Path, split: str, key: str | None, index: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest, decoded sample) for a key, or for the index-th sample of the split in shard order."""
    manifest = load_finished_manifest(Path(out))
    try:
        shards = shards_of(manifest, split)
    except ManifestError as exc:
        raise UserError(str(exc), hint="the manifest is not as robowds wrote it (edited or damaged): "
                        "export again into a new folder") from exc
    seen = 0
    for shard in shards:
        data = (Path(out) / shard.path).read_bytes()
        for i in range(shard.samples):
            start, stop = shard.sample_span(i)
            if index is not None and seen + i != index:
                continue
            try:
                found, members = read_sample(memoryview(data)[start:stop], f"shard {shard.path}", start)
                if key is None or found == key:
                    return manifest, decode_sample(found, members)
            except ValueError as exc:  # ShardFormatError too: a damaged shard, named once with its byte
                text = str(exc) if str(exc).startswith("shard ") else f"shard {shard.path}: byte {start}: {exc}"
                raise UserError(text, hint=f"`robowds verify {out}` checks every shard; export again to repair "
                                           "it") from exc
        seen += shard.samples
    what = f"key {key!r}" if key is not None else f"index {index}"
    raise UserError(f"no sample with {what} in split {split!r} ({seen} samples)",
                    hint="keys look like <episode>_<anchor>; see `robowds inspect OUT --index 0`")


def summary(manifest: dict[str, Any], sample: dict[str, Any]) -> str:
    lines = [f"key {sample['__key__']}"]
    for name, value in sorted(sample.items()):
        if name == "__key__":
            continue
        if isinstance(value, np.ndarray):
            extra = ""
            if value.dtype == np.bool_:
                extra = f"  {int(value.sum())}/{value.size} real"
            elif value.dtype.kind in "fiu" and value.size:
                extra = f"  min {value.min():.4g} max {value.max():.4g}"
            lines.append(f"  {name:<22} {value.dtype.name}{list(value.shape)}{extra}")
        else:
            lines.append(f"  {name:<22} {value!r}")
    return "\n".join(lines)


def render_png(manifest: dict[str, Any], sample: dict[str, Any], png: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise UserError("inspect --png needs matplotlib", hint="pip install 'robowds[plot]'") from exc
    schema = manifest["schema"]
    cameras = [n for n, s in schema.items() if s["kind"] == "video" and n in sample]
    series = [n for n, s in schema.items() if s["kind"] == "timeseries" and n in sample]
    images = [n for n, s in schema.items() if s["kind"] == "image" and n in sample]  # one per episode
    frames_max = max([len(sample[c]) for c in cameras], default=0)
    rows = len(cameras) + len(series) + bool(images)
    if not rows - bool(images):
        raise UserError("this window has no camera or time-series field to draw")
    fig = plt.figure(figsize=(max(8, 1.6 * frames_max), 1.8 * (len(cameras) + bool(images)) + 2.0 * len(series) + 0.8))
    grid = fig.add_gridspec(rows, max(1, frames_max, len(images)))
    for c, name in enumerate(images):  # the episode's images first, as they were stored for training
        ax = fig.add_subplot(grid[0, c])
        ax.imshow(sample[name].squeeze(), cmap="gray" if sample[name].shape[-1] == 1 else None)
        ax.set_xticks([]), ax.set_yticks([])
        ax.set_title(f"{name} (episode image)", fontsize=7)
    for r, name in enumerate(cameras, start=bool(images)):
        mask = sample[f"{name}_mask"]
        for t, frame in enumerate(sample[name]):
            ax = fig.add_subplot(grid[r, t])
            ax.imshow(frame)
            ax.set_xticks([]), ax.set_yticks([])
            ax.set_title(f"{name} t{t}" if t == 0 else f"t{t}", fontsize=7)
            if not mask[t]:
                ax.plot([0, frame.shape[1] - 1], [0, frame.shape[0] - 1], color="red", lw=2)
                ax.plot([0, frame.shape[1] - 1], [frame.shape[0] - 1, 0], color="red", lw=2)
    for r, name in enumerate(series, start=len(cameras) + bool(images)):
        spec = schema[name]
        values, mask = sample[name], sample[f"{name}_mask"]
        times = spec["offset_s"] + np.arange(len(values)) / spec["rate_hz"]  # relative to the anchor
        ax = fig.add_subplot(grid[r, :])
        names = spec.get("names") or [f"{name}[{d}]" for d in range(values.shape[1])]
        for d in range(values.shape[1]):
            ax.plot(times, values[:, d], lw=1, label=names[d] if d < len(names) else str(d))
        for t in np.flatnonzero(~mask):
            ax.axvspan(times[t] - 0.5 / spec["rate_hz"], times[t] + 0.5 / spec["rate_hz"], color="grey", alpha=0.3)
        ax.set_ylabel(name, fontsize=8)
        ax.tick_params(labelsize=7)
        if values.shape[1] <= 8:
            ax.legend(fontsize=6, loc="upper right", ncol=min(4, values.shape[1]))
    ax.set_xlabel("seconds from the anchor (grey: padded steps)", fontsize=8)
    texts = [v for n, v in sample.items() if isinstance(v, str) and n != "__key__"]
    fig.suptitle(f"{sample['__key__']}: {texts[0] if texts else ''}", fontsize=10)
    fig.savefig(png, dpi=80)
    plt.close(fig)
