"""The transforms of `robowds.reader.transforms` against the read they follow: per sample in the process
(as in a DataLoader worker), batched on CPU torch, and the loader's samples/s with the recipe and without.

    python scripts/bench_transforms.py            # ~1-2 minutes on 2 cores

One export of the synthetic store with a 10 fps 224x224 camera added (smooth moving frames, so the
JPEGs are photo-like, ~10-20 KB), windowed as docs/reader.md's training recipe: `joints` history of 2
steps, an `actions` chunk of 10, a 2-frame `cam` history stored as JPEG frames (`jpgs.msgpack`), the
`task` text, and `stats.relative` for the actions. Rows, each the best of `--repeats`
(the loader rows of at most 3):

- each transform per sample on numpy, over the same `--samples` decoded windows (Normalize of joints
  and actions, RelativeActions, RandomResizedCrop(224), RandomShift(8), ColorJitter(0.4, 0.4, 0.4,
  0.1), Tokenize with its cache warm), against the read of one window (a whole `ShardDataset` pass
  without transform, per sample); Normalize also against the read of the same window without its
  camera (`fields=` the time series and the text), the cheapest window it can follow;
- crop + jitter of the 2-frame 224x224 window against the JPEG decode of those two frames through the
  reader's own function, interleaved (`reader/decode.py: decode_member("cam.jpgs.msgpack", ...)`);
- each transform's `.batch` on a collated batch of 32 on CPU torch (one thread, as in a worker), per
  sample; Normalize's also against the read without the camera;
- `ShardLoader(batch_size=32)` samples/s over whole epochs with the recipe (RelativeActions, Normalize,
  RandomResizedCrop + ColorJitter on the camera, Tokenize) and without, at 0 and 2 workers, interleaved.
"""

from __future__ import annotations

import contextlib
import io
import tarfile
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from robowds.export.cli.main import main as robowds
from robowds.export.cli.synth import write_synthetic_store
from robowds.reader import ShardDataset, ShardLoader
from robowds.reader.collation import collate
from robowds.reader.decode import decode_member
from robowds.reader.transforms import (ColorJitter, Compose, Normalize, RandomResizedCrop, RandomShift,
                                       RelativeActions, Tokenize)

import benchlib

BATCH = 32
SIZE = 224
CONFIG = """
fps: 10
window: {rate_hz: 10}
streams:
  joints:  {offset_s: -0.1, duration_s: 0.2}
  actions: {duration_s: 1.0}
  cam:     {offset_s: -0.1, duration_s: 0.2, encoding: jpg}
include: [joints, actions, cam, task]
stats: {relative: {actions: joints}}
"""


def add_camera(store: Path, episodes: int) -> None:
    """A 12 s, 10 fps, 224x224 mpeg4 video `cam` per episode: a smooth colour pattern that moves."""
    import av

    ys, xs = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) / SIZE  # [H, W]
    ids = [f"ep_{i:04d}" for i in range(episodes)]
    for e, eid in enumerate(ids):
        with av.open(str(store / f"{eid}.mp4"), "w") as video:
            stream = video.add_stream("mpeg4", rate=10)
            stream.width, stream.height, stream.pix_fmt = SIZE, SIZE, "yuv420p"
            stream.codec_context.time_base = Fraction(1, 10)
            for k in range(120):
                phase = 0.3 * k + e
                rgb = np.stack([np.sin(6 * xs + phase), np.cos(5 * ys - phase), np.sin(4 * (xs + ys) + phase)], -1)
                frame = ((rgb + 1) * 127.5).astype(np.uint8)  # [H, W, 3]
                video.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
            video.mux(stream.encode())
    cam = [{"path": f"{eid}.mp4", "fps": 10.0, "start_s": 0.0, "end_s": 12.0} for eid in ids]
    pq.write_table(pa.table({"episode_id": ids, "cam": cam}), store / "videos.parquet")


def tokenizer(store: Path) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers

    texts = pq.read_table(store / "text.parquet")["task"].to_pylist()
    words = sorted({w for t in texts for w in t.split()})
    tok = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(words)}},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def jpeg_members(out: Path, count: int) -> list[bytes]:
    """The first `count` `cam.jpgs.msgpack` members of the train shards, as stored."""
    found: list[bytes] = []
    for shard in sorted((out / "train").glob("*.tar")) or sorted(out.rglob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                if member.name.endswith(".cam.jpgs.msgpack"):
                    found.append(tar.extractfile(member).read())
                    if len(found) == count:
                        return found
    return found


def per_sample(fn: Callable[[Any], Any], items: list[Any], repeats: int) -> float:
    """Best seconds per item of `fn` over `items`."""
    def run() -> None:
        for item in items:
            fn(item)
    return benchlib.timed(run, repeats).best / len(items)


def read_per_sample(out: Path, repeats: int, **kwargs: Any) -> float:
    """Best seconds per sample of a whole in-process `ShardDataset` pass (no transform)."""
    def run() -> int:
        return sum(1 for _ in ShardDataset(out, "train", shuffle=False, **kwargs))
    timing = benchlib.timed(run, repeats)
    return timing.best / timing.result


def loader_rate(out: Path, transform: Any, workers: int, seconds: float) -> float:
    def epoch() -> int:
        loader = ShardLoader(ShardDataset(out, "train", seed=0, transform=transform), batch_size=BATCH,
                             num_workers=workers)
        return sum(len(batch["__key__"]) for batch in loader)
    return benchlib.throughput(epoch, seconds)


def main() -> None:
    parser = benchlib.parser(__doc__, repeats=5,
                             quick={"episodes": 2, "samples": 8, "seconds": 0.1, "repeats": 1})
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--stride", type=int, default=4, help="anchor stride of the export")
    parser.add_argument("--samples", type=int, default=64, help="decoded windows each transform runs over")
    parser.add_argument("--seconds", type=float, default=2.0, help="per loader rate (whole epochs)")
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_transforms", args)
    torch.set_num_threads(1)  # a DataLoader worker's setting; the CPU batch rows per core
    with tempfile.TemporaryDirectory(prefix="bench_transforms_") as tmp:
        store, out = Path(tmp) / "store", Path(tmp) / "out"
        with contextlib.redirect_stdout(io.StringIO()):
            write_synthetic_store(store, episodes=args.episodes, seed=0)
            add_camera(store, args.episodes)
            (Path(tmp) / "recipe.yaml").write_text(CONFIG)
            code = robowds(["export", str(store), str(out), "--quiet", "--workers", "2",
                            "--config", str(Path(tmp) / "recipe.yaml"), "--set", f"stride={args.stride}"])
        if code != 0:
            raise SystemExit(f"export failed with exit code {code}")

        stats = ShardDataset(out, "train").stats
        rel = RelativeActions.from_stats(stats, action="actions")
        norm = Normalize(rel.stats(stats), mode={"joints": "mean_std", "actions": "quantile"})
        crop = RandomResizedCrop(SIZE, scale=(0.6, 1.0), cameras=["cam"])
        shift = RandomShift(8, cameras=["cam"])
        jitter = ColorJitter(0.4, 0.4, 0.4, 0.1, cameras=["cam"])
        tokenize = Tokenize(tokenizer(store), field="task", max_length=16)
        crop_jitter = Compose([crop, jitter])
        recipe = Compose([rel, norm, crop, jitter, tokenize])

        samples = [s for _, s in zip(range(args.samples), ShardDataset(out, "train", shuffle=False))]
        print(f"{len(ShardDataset(out, 'train'))} windows; cam {samples[0]['cam'].shape}, "
              f"joints {samples[0]['joints'].shape}, actions {samples[0]['actions'].shape}")
        rng = np.random.default_rng(0)
        for sample in samples:
            tokenize(sample, rng)  # the cache warm, as after a worker's first window of each episode

        read = read_per_sample(out, args.repeats)
        read_small = read_per_sample(out, args.repeats, fields=["joints", "actions", "task"])
        times = {name: per_sample(lambda s, t=t: t(s, rng), samples, args.repeats)
                 for name, t in (("Normalize (joints, actions)", norm), ("RelativeActions", rel),
                                 ("RandomResizedCrop(224)", crop), ("RandomShift(8)", shift),
                                 ("ColorJitter(0.4, 0.4, 0.4, 0.1)", jitter), ("Tokenize (cached)", tokenize),
                                 ("the recipe (all of them)", recipe))}
        report.add("read of one window (whole), per sample", read * 1e6, "us")
        for name, seconds in times.items():
            target = "<= 0.05x" if name.startswith("Normalize") else ""
            report.add(f"{name}, per sample (vs the read)", seconds * 1e6, "us", baseline=read * 1e6, target=target)
        report.add("Normalize, per sample (vs the read without the camera)", times["Normalize (joints, actions)"] * 1e6,
                   "us", baseline=read_small * 1e6, target="<= 0.05x")

        members = jpeg_members(out, len(samples))
        decode, augment = float("inf"), float("inf")
        for _ in range(args.repeats):  # interleaved: a slow spell of the machine hits both
            decode = min(decode, per_sample(lambda m: decode_member("cam.jpgs.msgpack", m), members, 1))
            augment = min(augment, per_sample(lambda s: crop_jitter(s, rng), samples, 1))
        report.add("crop + jitter of 2x224x224 (vs its JPEG decode)", augment * 1e6, "us", baseline=decode * 1e6,
                   target="<= 1.00x")

        batch = collate(samples[:BATCH])
        generator = torch.Generator().manual_seed(0)
        for name, t in (("Normalize", norm), ("RelativeActions", rel), ("RandomResizedCrop(224)", crop),
                        ("RandomShift(8)", shift), ("ColorJitter", jitter), ("Tokenize", tokenize)):
            seconds = benchlib.timed(lambda t=t: t.batch(batch, generator), args.repeats).best / len(batch["__key__"])
            report.add(f"{name}.batch on CPU torch, per sample (vs numpy)", seconds * 1e6, "us",
                       baseline=times[next(k for k in times if k.startswith(name))] * 1e6)
            if name == "Normalize":  # the same bits as in the workers, for a fraction of numpy's per-call cost
                report.add("Normalize.batch, per sample (vs the read without the camera)", seconds * 1e6, "us",
                           baseline=read_small * 1e6, target="<= 0.05x")

        for workers in (0, 2):
            best = {"recipe": 0.0, "plain": 0.0}
            for _ in range(min(args.repeats, 3)):  # interleaved: a slow spell of the machine hits both
                best["recipe"] = max(best["recipe"], loader_rate(out, recipe, workers, args.seconds))
                best["plain"] = max(best["plain"], loader_rate(out, None, workers, args.seconds))
            report.add(f"ShardLoader with the recipe, workers={workers} (vs without)", best["recipe"], "samples/s",
                       baseline=best["plain"])
    report.finish()


if __name__ == "__main__":
    main()
