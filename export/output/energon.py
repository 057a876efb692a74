"""`.nv-meta/`: what Megatron-Energon needs to load an export folder directly, without `energon prepare`.

Why: Energon (7.x) opens a folder as a webdataset when `.nv-meta/.info.json` exists, then reads
`.nv-meta/dataset.yaml` (which factory builds samples), `.nv-meta/split.yaml` (split part -> shard
names) and each shard's `<shard>.tar.idx` (sample offsets; the export already writes it, byte-identical
to Energon's). `index.sqlite` is not read by `get_train_dataset` / `get_val_dataset` + `get_loader`
(only by random access by key, joins and auxiliary data sources); `energon prepare OUT --tar-index-only`
adds it where needed. These three files are pure functions of the manifest, so publish can tell ours
(bytes equal to what we write for the old manifest) from a user's edited or `energon prepare`-written
ones, which are never replaced.

Sizes: `.info.json` is one line per shard; `split.yaml` one brace range per split when the split's
shards are numbered consecutively (always, for our exports), else one line per shard.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from robowds.reader.manifest import shards_of

NV_META = ".nv-meta"
DATASET_YAML = f"{NV_META}/dataset.yaml"
SPLIT_YAML = f"{NV_META}/split.yaml"
INFO_JSON = f"{NV_META}/.info.json"
FILES = (DATASET_YAML, SPLIT_YAML, INFO_JSON)  # what robowds writes into `.nv-meta/`, in publish order
SUBFLAVOR = "robowds"  # `subflavors: {robowds: <manifest format_version>}`: a cooker can match on it

_SHARD_RE = re.compile(r"^(?P<prefix>.*shard-)(?P<num>[0-9]+)(?P<suffix>\.tar)$")


def collapse(names: list[str]) -> list[str]:
    """`names` as brace patterns Energon expands back (`braceexpand`, zero-padded ranges), one per
    run of consecutively numbered shards: `train/shard-{000000..000099}.tar`. Order is kept."""
    runs: list[list[Any]] = []  # [prefix, suffix, width, first, last] or [name]
    for name in names:
        m = _SHARD_RE.match(name)
        if m is None or "{" in name or "}" in name:
            runs.append([name])
            continue
        prefix, suffix, num = m["prefix"], m["suffix"], m["num"]
        last = runs[-1] if runs else None
        if (last is not None and len(last) == 5 and last[:3] == [prefix, suffix, len(num)]
                and int(num) == last[4] + 1):
            last[4] += 1
        else:
            runs.append([prefix, suffix, len(num), int(num), int(num)])
    out = []
    for run in runs:
        if len(run) == 1:
            out.append(run[0])
        else:
            prefix, suffix, width, first, last = run
            out.append(f"{prefix}{first:0{width}d}{suffix}" if first == last else
                       f"{prefix}{{{first:0{width}d}..{last:0{width}d}}}{suffix}")
    return out


def dataset_yaml(manifest: dict[str, Any]) -> bytes:
    """A `CrudeWebdataset`: samples arrive as dicts of members (`"joints.npy"`, `"cam.jpgs.msgpack"`,
    ...) for a cooker to turn into the user's sample type; `robowds.reader.interop.decode_sample` decodes
    them. A field map to a fixed Energon sample type cannot fit: every export has its own fields."""
    doc = {"__module__": "megatron.energon", "__class__": "CrudeWebdataset",
           "subflavors": {SUBFLAVOR: int(manifest["format_version"])}}
    head = "# written by robowds export (replaced by the next export; edit a copy under another name)\n"
    return head.encode() + yaml.safe_dump(doc, sort_keys=False).encode()


def split_yaml(manifest: dict[str, Any]) -> bytes:
    """`split_parts`: each manifest split -> its shard paths (relative to OUT, as Energon resolves them)."""
    parts = {split: collapse([s.path for s in shards_of(manifest, split)]) for split in sorted(manifest["splits"])}
    return yaml.safe_dump({"split_parts": parts, "exclude": []}, sort_keys=False).encode()


def info_json(manifest: dict[str, Any]) -> bytes:
    """`shard_counts`: every shard's sample count, as `energon prepare` writes it (indent 2)."""
    counts = {s.path: s.samples for split in sorted(manifest["splits"]) for s in shards_of(manifest, split)}
    return json.dumps({"energon_version": None, "shard_counts": counts}, indent=2).encode()


def energon_files(manifest: dict[str, Any]) -> dict[str, bytes]:
    """Every `.nv-meta/` file robowds writes for `manifest`: POSIX path relative to OUT -> bytes."""
    return {DATASET_YAML: dataset_yaml(manifest), SPLIT_YAML: split_yaml(manifest), INFO_JSON: info_json(manifest)}
