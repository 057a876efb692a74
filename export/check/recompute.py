"""Recomputing exported windows from the source store, for `verify --store`.

Uses the export's own resolve/load/build code with the config recorded in the manifest, so a window
that does not come out byte-identical means the store changed, or the shard did.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from robowds.export.check.result import VerifyResult
from robowds.export.errors import EpisodeError
from robowds.export.job.build import EpisodeWindows, build_episode
from robowds.export.job.config import DEFAULTS, STREAM_KEYS
from robowds.export.job.spec import resolve
from robowds.export.progress import progress_bar
from robowds.export.store.episodes import EpisodeLoader
from robowds.export.store.fingerprint import fingerprint
from robowds.export.store.location import StoreLocation
from robowds.reader.format import read_sample
from robowds.reader.manifest import ShardInfo, shard_index, shards_of
from robowds.reader.npz import unpack


def config_from_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """The export config that `load_config` would have produced, from the manifest's resolved config."""
    resolved = manifest["config"]
    config = {k: resolved.get(k, DEFAULTS[k]) for k in DEFAULTS}  # keys added later: their defaults
    config["streams"] = {n: {k: v for k, v in w.items() if k in STREAM_KEYS}
                         for n, w in {**resolved["streams"], **resolved.get("videos", {}),
                                      **resolved.get("images", {})}.items()}
    return config


def recompute_windows(out: StoreLocation, manifest: dict[str, Any], store: StoreLocation, count: int, seed: int,
                      result: VerifyResult, progress: bool = False,
                      shards: dict[str, list[ShardInfo]] | None = None) -> None:
    """`progress`: a bar on stderr over the picked windows, moving as each is rebuilt (building an
    episode's windows is most of verify --store's time, so a per-shard bar alone sat still).
    `shards`: per split, the shards to pick windows from (`verify --since`: those it read; default
    every shard the manifest lists)."""
    if fingerprint(store) != manifest["source"]["fingerprint"]:
        result.failures.append(f"store {store} changed since the export (fingerprint differs); "
                               "recomputed windows are not expected to match")
        return
    job, _ = resolve(store, config_from_manifest(manifest))
    picks: dict[str, list[tuple[str, int, int]]] = {}  # episode -> (shard path, start, stop)
    rng = np.random.default_rng(seed)
    for split in sorted(manifest["splits"]):
        listed = shards_of(manifest, split) if shards is None else shards.get(split, [])
        total = sum(s.samples for s in listed)
        if not total:
            continue
        chosen = rng.choice(total, size=min(count, total), replace=False)
        bounds = np.cumsum([0] + [s.samples for s in listed])
        for flat in sorted(chosen.tolist()):
            i = int(np.searchsorted(bounds, flat, side="right") - 1)
            shard = listed[i]
            offsets = shard_index(shard, out.read_bytes)  # [samples + 1]; verify checked it before
            start, stop = int(offsets[flat - int(bounds[i])]), int(offsets[flat - int(bounds[i]) + 1])
            with out.open(shard.path) as fh:
                fh.seek(start)
                blob = fh.read(stop - start)
            key = read_sample(blob, shard.path, start)[0]
            episode = next(ep for ep, prefix in job.prefixes.items() if key.rsplit("_", 1)[0] == prefix)
            picks.setdefault(episode, []).append((key, shard.path, start, blob))
    loader = EpisodeLoader(job.schema, job.load_fields)
    bar = progress_bar(total=sum(map(len, picks.values())), desc="recompute", unit="window", disable=not progress)
    for data in loader.load(sorted(picks)):
        if isinstance(data, EpisodeError):
            result.failures.append(str(data))
            bar.update(len(picks[data.episode_id]))
            continue
        wanted = {key: (path, start, blob) for key, path, start, blob in picks[data.episode_id]}
        windows = EpisodeWindows()
        meta = {"episode_id": data.episode_id, "split": job.splits[data.episode_id]}
        try:
            for blob in build_episode(data, job.build, job.prefixes[data.episode_id], meta, windows):
                key = windows.keys[-1]
                if key in wanted:
                    path, start, stored = wanted.pop(key)
                    result.recomputed += 1
                    bar.update(1)
                    if blob != stored:
                        result.failures.append(f"shard {path}: key {key} (byte {start}) differs from the window "
                                               f"recomputed from the store{_diff(blob, stored)}")
        except EpisodeError as exc:
            result.failures.append(str(exc))
        for key, (path, start, _) in wanted.items():
            result.failures.append(f"shard {path}: key {key} (byte {start}) is not produced by the store")
        bar.update(len(wanted))
    bar.close()


def _diff(new: bytes, old: bytes) -> str:
    a = {k: bytes(v) for k, v in unpack(read_sample(new)[1]).items()}  # npz layout: the differing entries
    b = {k: bytes(v) for k, v in unpack(read_sample(old)[1]).items()}
    names = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    return f" (members {', '.join(names)})" if names else ""
