"""`robowds demo`: the whole pipeline on a synthetic store, as a user would run it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from robowds.export.check.verify import verify_export
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.errors import UserError
from robowds.export.job.config import load_config
from robowds.export.job.run import run_export
from robowds.export.store.validate import validate_store


def run_demo(base: Path, episodes: int = 24, workers: int = 2, progress: bool = True) -> int:
    base = Path(base)
    store, out = base / "store", base / "out"
    if base.exists():
        # only a previous demo's folder is replaced: `--dir ~` must never delete a home folder
        if not base.is_dir() or not {p.name for p in base.iterdir()} <= {"store", "out"}:
            raise UserError(f"demo folder {base} exists and holds more than a previous demo (store/, out/)",
                            hint="pass --dir with a new folder, or a folder a previous demo wrote")
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
    print(run_export(store, out, config, workers=workers, progress=progress).line())
    print("4/5 verify (with 16 windows recomputed from the store)")
    result = verify_export(out, store=store, check_windows=16, progress=progress)
    print(result.render())
    if not result.ok:
        return 1
    print("5/5 train-style read: 2 DataLoader workers, stop half-way, save the cursor, resume in a new loader")
    return _read_and_resume(out)


def _read_and_resume(out: Path) -> int:
    from robowds.reader import ShardDataset, ShardLoader

    def loader() -> ShardLoader:
        return ShardLoader(ShardDataset(out, "train", seed=0), batch_size=32, num_workers=2)

    reference = [key for batch in loader() for key in batch["__key__"]]
    first = loader()
    half = len(first) // 2
    head: list[str] = []
    for i, batch in enumerate(first):
        head += batch["__key__"]
        if i + 1 == half:
            break
    cursor = json.dumps(first.state_dict())
    print(f"  read {half} of {len(first)} batches; cursor ({len(cursor)} bytes): {cursor}")
    batch = None
    second = loader()
    second.load_state_dict(json.loads(cursor))
    tail: list[str] = []
    for batch in second:
        tail += batch["__key__"]
    same = head + tail == reference
    print(f"  resumed: {len(tail)} more samples; identical to the uninterrupted epoch: {same}")
    if batch is not None:
        for name, value in sorted(batch.items()):
            shape = list(value.shape) if hasattr(value, "shape") else f"of {len(value)}"  # tensors; lists of str/dict
            print(f"  {name:<20} {getattr(value, 'dtype', type(value).__name__)} {shape}")
    return 0 if same else 1
