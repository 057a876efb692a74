"""`robowds demo`: the whole pipeline on a synthetic store, as a user would run it."""

from __future__ import annotations

import shutil
from pathlib import Path

from export.config import load_config
from export.job import run_export
from export.synth import write_synthetic_store
from export.validate import validate_store
from export.verify import verify_export
from reader.format import decode_npy, group_samples, iter_members
from reader.manifest import MANIFEST_NAME, parse_manifest, shards_of


def run_demo(base: Path, episodes: int = 24, workers: int = 2) -> int:
    base = Path(base)
    store, out = base / "store", base / "out"
    if base.exists():
        shutil.rmtree(base)
    print(f"1/5 synth: {episodes} episodes -> {store}")
    write_synthetic_store(store, episodes=episodes, seed=0)
    print("2/5 validate")
    report = validate_store(store)
    print(report.render())
    if not report.exportable:
        return 1
    print(f"3/5 export ({workers} workers) -> {out}")
    config = load_config(None, ["splits.val=0.125", "streams.joints.rate_hz=50",
                                "streams.imu.rate_hz=100", "streams.imu.duration_s=0.5",
                                "streams.imu.offset_s=-0.5", "min_valid_fraction=0.5"])
    print(run_export(store, out, config, workers=workers).line())
    print("4/5 verify (with 16 windows recomputed from the store)")
    result = verify_export(out, store=store, check_windows=16)
    print(result.render())
    if not result.ok:
        return 1
    print("5/5 read back the first training sample")
    manifest = parse_manifest((out / MANIFEST_NAME).read_bytes())
    shard = shards_of(manifest, "train")[0]
    start, stop = shard.sample_span(0)
    with open(out / shard.path, "rb") as fh:
        fh.seek(start)
        key, _, members = next(group_samples(iter_members(fh.read(stop - start))))
    print(f"  key {key}")
    for name, data in sorted(members.items()):
        if name.endswith(".npy"):
            arr = decode_npy(data)
            print(f"  {name:<24} {arr.dtype}{list(arr.shape)}")
        else:
            print(f"  {name:<24} {len(data)} bytes")
    return 0
