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
from robowds.export.report.window_figure import figure
from robowds.export.report.window_samples import check_length
from robowds.export.store.location import RemoteStoreError, StoreLocation, store_location
from robowds.reader.decode import decode_sample
from robowds.reader.format import read_sample
from robowds.reader.manifest import ManifestError, ShardIndexError, shard_index, shards_of
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
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise UserError("inspect --png needs matplotlib", hint="pip install 'robowds[plot]'") from exc
    fig = figure(manifest, sample)
    fig.savefig(png, dpi=100)
    plt.close(fig)
