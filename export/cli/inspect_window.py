"""`robowds inspect OUT`: look at one exported window, as text or as a picture.

The picture shows the camera frames as a strip (padded frames crossed out in red), every time series
plotted over the window's time axis with the masked (padded) steps shaded, and the task text as title.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from robowds.export.errors import UserError
from robowds.export.output.publish import load_finished_manifest
from robowds.export.store.location import RemoteStoreError, StoreLocation, store_location
from robowds.reader.decode import decode_sample
from robowds.reader.format import BLOCK, ShardFormatError, parse_header, read_sample
from robowds.reader.manifest import ManifestError, ShardIndexError, ShardInfo, shard_index, shards_of
from robowds.reader.npz import unpack


def load_window(out: Path | str | StoreLocation, split: str, key: str | None, index: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest, decoded sample) for a key, or for the index-th sample of the split in shard order."""
    out = store_location(out)
    manifest = load_finished_manifest(out)
    try:
        shards = shards_of(manifest, split)
    except ManifestError as exc:
        raise UserError(str(exc), hint="the manifest is not as robowds wrote it (edited or damaged): "
                        "export again into a new folder") from exc
    seen = 0
    for shard in shards:
        if index is not None and not seen <= index < seen + shard.samples:  # not this shard: not read at all
            seen += shard.samples
            continue
        try:
            data = out.read_bytes(shard.path)
            offsets = shard_index(shard, out.read_bytes).tolist()  # [samples + 1]
        except RemoteStoreError as exc:
            raise UserError(str(exc), hint=exc.hint) from exc
        except ShardIndexError as exc:  # missing, or not the one the manifest lists
            raise UserError(exc.problem, hint=exc.fix) from exc
        check_length(shard, data, offsets, out)
        for i in range(shard.samples):
            start, stop = offsets[i], offsets[i + 1]
            if index is not None and seen + i != index:
                continue
            try:
                found, members = read_sample(memoryview(data)[start:stop], f"shard {shard.path}", start)
                if key is None or found == key:
                    return manifest, decode_sample(found, unpack(members, f"shard {shard.path}", start))
            except ValueError as exc:  # ShardFormatError too: a damaged shard, named once with its byte
                text = str(exc) if str(exc).startswith("shard ") else f"shard {shard.path}: byte {start}: {exc}"
                raise UserError(text, hint=f"`robowds verify {out}` checks every shard; export again to repair "
                                           "it") from exc
        seen += shard.samples
    what = f"key {key!r}" if key is not None else f"index {index}"
    raise UserError(f"no sample with {what} in split {split!r} ({seen} samples)",
                    hint="keys look like <episode>_<anchor>; see `robowds inspect OUT --index 0`")


def check_length(shard: ShardInfo, data: bytes, offsets: list[int], out: StoreLocation) -> None:
    """Refuse a shard whose length is not the manifest's, naming the first sample it cuts.

    Why: a shard cut at a member boundary holds samples that parse but lack their last members, and
    inspect printed such a partial window and exited 0. Comparing one length (the manifest's `bytes`)
    catches every cut before any sample is decoded; hashing the shard is `verify`'s job."""
    if len(data) == shard.bytes:
        return
    fix = f"`robowds verify {out}` checks every shard; export again to repair it"
    if len(data) > shard.bytes:
        raise UserError(f"shard {shard.path} is {len(data)} bytes, the manifest lists {shard.bytes}: it is not "
                        "the shard this export wrote", hint=fix)
    cut = next((i for i in range(shard.samples) if offsets[i + 1] > len(data)), None)
    head = f"shard {shard.path} is cut short ({len(data)} of {shard.bytes} bytes)"
    if cut is None:
        raise UserError(f"{head}: its end-of-archive blocks are missing", hint=fix)
    start, after = offsets[cut], shard.samples - cut - 1
    more = f", and the {after} sample(s) after it are missing" if after else ""
    key = _key_at(data, start, f"shard {shard.path}")
    what = f"sample {key!r} at byte {start} is incomplete" if key else f"sample {cut} at byte {start} is missing"
    raise UserError(f"{head}: {what}{more}", hint=fix)


def _key_at(data: bytes, start: int, where: str) -> str | None:
    """The key in the tar header at `start`, or None when no whole, valid header is there."""
    if start + BLOCK > len(data):
        return None
    try:
        name, _ = parse_header(data[start:start + BLOCK], where, start)
    except ShardFormatError:
        return None
    return name.partition(".")[0]


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


GROUP = 8  # dimensions per plot: more lines than this are unreadable in one axis, so they get several
MAX_FRAMES = 8  # camera frames drawn per window (evenly spaced when the window has more)
FRAME_INCHES = 2.4  # per frame: ~240 px at the PNG's 100 dpi, enough to see the scene


def figure(manifest: dict[str, Any], sample: dict[str, Any]) -> Any:
    """The window as a matplotlib Figure: the episode's images, camera frames (padded ones crossed out
    in red), and every time series over seconds from the anchor, in groups of up to `GROUP` dimensions
    labelled with the manifest's `names`. Padded steps are gaps (NaN), never drawn as values, and are
    shaded grey; the y label says how many steps are real."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schema = manifest["schema"]
    cameras = [n for n, s in schema.items() if s["kind"] == "video" and n in sample]
    series = [n for n, s in schema.items() if s["kind"] == "timeseries" and n in sample]
    images = [n for n, s in schema.items() if s["kind"] == "image" and n in sample]  # one per episode
    if not cameras and not series:
        raise UserError("this window has no camera or time-series field to draw",
                        hint="export a camera or time series too (the config's include/exclude) to draw its windows")
    groups = [(name, lo) for name in series for lo in range(0, max(1, sample[name].shape[1]), GROUP)]
    picks = {c: np.unique(np.linspace(0, len(sample[c]) - 1, min(MAX_FRAMES, len(sample[c]))).round().astype(int))
             for c in cameras}
    columns = max([1, len(images), *(len(p) for p in picks.values())])
    frame_rows = len(cameras) + bool(images)
    fig = plt.figure(figsize=(max(10.0, FRAME_INCHES * columns), FRAME_INCHES * frame_rows + 2.2 * len(groups) + 0.8))
    grid = fig.add_gridspec(frame_rows + len(groups), columns,
                            height_ratios=[FRAME_INCHES] * frame_rows + [2.2] * len(groups))
    for c, name in enumerate(images):  # the episode's images first, as they were stored for training
        ax = fig.add_subplot(grid[0, c])
        ax.imshow(sample[name].squeeze(), cmap="gray" if sample[name].shape[-1] == 1 else None)
        ax.set_xticks([]), ax.set_yticks([])
        ax.set_title(f"{name} (episode image)", fontsize=8)
    for r, name in enumerate(cameras, start=bool(images)):
        spec, mask = schema[name], sample[f"{name}_mask"]
        for c, step in enumerate(picks[name]):
            frame = sample[name][step]
            ax = fig.add_subplot(grid[r, c])
            ax.imshow(frame)
            ax.set_xticks([]), ax.set_yticks([])
            when = spec.get("offset_s", 0.0) + step / spec["rate_hz"] if spec.get("rate_hz") else step
            ax.set_title(f"{name} {when:+.2f} s" if c == 0 else f"{when:+.2f} s", fontsize=8)
            if not mask[step]:
                ax.plot([0, frame.shape[1] - 1], [0, frame.shape[0] - 1], color="red", lw=2)
                ax.plot([0, frame.shape[1] - 1], [frame.shape[0] - 1, 0], color="red", lw=2)
    ax = None
    spans = [(schema[n]["offset_s"] - 0.5 / schema[n]["rate_hz"],
              schema[n]["offset_s"] + (len(sample[n]) - 0.5) / schema[n]["rate_hz"]) for n in series]
    xlim = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None  # one time axis for all
    for r, (name, lo) in enumerate(groups, start=frame_rows):
        spec = schema[name]
        values, mask = sample[name], sample[f"{name}_mask"]  # [T, N], [T]
        times = spec["offset_s"] + np.arange(len(values)) / spec["rate_hz"]  # [T] seconds from the anchor
        shown = np.where(mask[:, None], values.astype(np.float64), np.nan)  # [T, N]: padding is a gap
        names = spec.get("names") or [f"{name}[{d}]" for d in range(values.shape[1])]
        ax = fig.add_subplot(grid[r, :])
        for d in range(lo, min(lo + GROUP, values.shape[1])):
            ax.plot(times, shown[:, d], lw=1.2, marker="." if len(times) <= 60 else None, ms=3,
                    label=names[d] if d < len(names) else f"{name}[{d}]")
        for step in np.flatnonzero(~mask):
            ax.axvspan(times[step] - 0.5 / spec["rate_hz"], times[step] + 0.5 / spec["rate_hz"], color="grey",
                       alpha=0.25, lw=0)
        part = f" [{lo}:{min(lo + GROUP, values.shape[1])}]" if values.shape[1] > GROUP else ""
        ax.set_ylabel(f"{name}{part}\n{int(mask.sum())}/{mask.size} real", fontsize=8)
        ax.set_xlim(*xlim)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), borderaxespad=0.2)
    if ax is not None:
        ax.set_xlabel("seconds from the anchor (grey, and gaps in the lines: padded steps)", fontsize=8)
    texts = [v for n, v in sample.items() if isinstance(v, str) and n != "__key__"]
    fig.suptitle(f"{sample['__key__']}: {texts[0] if texts else ''}", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig


def render_png(manifest: dict[str, Any], sample: dict[str, Any], png: Path) -> None:
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise UserError("inspect --png needs matplotlib", hint="pip install 'robowds[plot]'") from exc
    fig = figure(manifest, sample)
    fig.savefig(png, dpi=100)
    plt.close(fig)


def random_windows(out: Path | str | StoreLocation, split: str, count: int, seed: int) -> list[int]:
    """`count` distinct sample indices of the split, drawn with `seed` (all of them if it has fewer)."""
    manifest = load_finished_manifest(out)
    total = sum(s.samples for s in shards_of(manifest, split))
    if not total:
        raise UserError(f"split {split!r} has no samples", hint="pick another --split")
    return sorted(np.random.default_rng(seed).choice(total, size=min(count, total), replace=False).tolist())
