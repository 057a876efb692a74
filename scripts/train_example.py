"""A tiny behaviour-cloning policy trained on a robowds export: DDP on CPU (gloo), resumable.

An MLP reads the observation windows (`--obs`, time-series fields, padded steps zeroed, plus their
masks; optionally `--camera` video fields through a tiny conv encoder per frame) and predicts the action
window (`--action`); the loss is the MSE over the real action steps only (`<action>_mask`).

`--normalize MODE` (mean_std, the default; min_max; quantile) scales the observation and action fields
per dimension by the manifest's statistics of the split with `robowds.reader.transforms.Normalize`, in
the DataLoader workers: the model predicts normalised actions and the loss is in normalised units
(`norm.inverse(pred, action)` gives actions in the field's units). `--augment` adds a DrQ-style
`RandomShift(4)` and a `ColorJitter(0.2, 0.2, 0.2, 0.02)` on the `--camera` fields, one draw per window
from the sample's generator (seeded by the reader from (seed, epoch, key)): a resumed run augments the
remaining samples exactly as the uninterrupted run did. Without `--obs` / `--action` the fields are taken from the
manifest when the choice is obvious (`joints`/`actions`, `state`/`action`, `observation.state`/...),
else the script lists the time-series fields to choose from. Batches come from `ShardLoader`, which splits the epoch across ranks and DataLoader
workers and has a cursor (`state_dict()`), so a resumed run reads exactly the batches the killed run
would have read next.

    # one process
    python scripts/train_example.py --data OUT --epochs 2 --checkpoint ckpt.pt --every 50 --log-file log.jsonl
    # two ranks on one machine (gloo, CPU)
    python -m torch.distributed.run --nproc_per_node=2 scripts/train_example.py --data OUT ...
    # killed? run the same command with --resume: continues from the last checkpoint
    python -m torch.distributed.run --nproc_per_node=2 scripts/train_example.py --data OUT ... --resume
    # quantile normalisation and camera augmentation
    python scripts/train_example.py --data OUT --camera cam --normalize quantile --augment

Every `--every` steps rank 0 writes the checkpoint atomically (temp file, fsync, os.replace): model,
optimizer, step, the torch RNG state and the loader cursor (as a JSON string; the cursor does not
depend on the rank, and every rank has the same one). The checkpoint is read back with
`torch.load(weights_only=True)`. Steps after the last checkpoint are redone on resume, with the same
batches and the same results. `--max-steps N` stops after step N without a final checkpoint, as a kill
would. Rank 0 appends one JSON line per step to `--log-file` (alias `--log`, which torchrun's own
argument parser refuses as an ambiguous abbreviation of its `--log-dir`/`--logs-specs`): step, epoch,
loss (mean over ranks) and the first `__key__` of each rank's batch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from robowds.reader.dataset import ShardDataset
from robowds.reader.loader import ShardLoader
from robowds.reader.transforms import ColorJitter, Compose, Normalize, RandomShift


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="export folder (holds manifest.json) or its URL")
    p.add_argument("--split", default="train")
    p.add_argument("--obs", nargs="+", help="observation time-series field(s) (default: from the manifest)")
    p.add_argument("--action", help="action time-series field to predict (default: from the manifest)")
    p.add_argument("--camera", nargs="*", default=[], help="video field(s) to encode with a tiny conv net")
    p.add_argument("--normalize", default="mean_std", choices=("mean_std", "min_max", "quantile"),
                   help="Normalize mode of the observation and action fields (manifest statistics); the loss is "
                        "in normalised units")
    p.add_argument("--augment", action="store_true",
                   help="RandomShift(4) + ColorJitter on the --camera fields, drawn per sample")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=0, help="model init and the reader's epoch plan")
    p.add_argument("--checkpoint", type=Path, help="checkpoint file (written by rank 0)")
    p.add_argument("--every", type=int, default=0, help="checkpoint every N steps (0: only at the end)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this global step, without a checkpoint")
    p.add_argument("--log-file", "--log", dest="log", type=Path,
                   help="JSONL log, one line per step (appended; rank 0). Under torchrun spell it --log-file: "
                        "torchrun's own parser rejects --log as an ambiguous abbreviation of its --log-dir")
    args = p.parse_args(argv)
    if (args.every or args.resume) and args.checkpoint is None:
        p.error("--every and --resume need --checkpoint")
    if args.augment and not args.camera:
        p.error("--augment augments the --camera fields: name them with --camera FIELD [FIELD ...]")
    if args.resume and not args.checkpoint.is_file():
        p.error(f"--resume: no checkpoint at {args.checkpoint}")
    return args


OBS_NAMES = ("joints", "state", "observation.state", "observation_state", "obs", "qpos", "proprio")
ACTION_NAMES = ("actions", "action")


def choose_fields(schema: dict[str, Any], obs: list[str] | None, action: str | None) -> tuple[list[str], str]:
    """The observation and action fields: as given, else the obvious ones in the manifest's schema."""
    series = sorted(n for n, s in schema.items() if s["kind"] == "timeseries")
    action = action or next((n for n in ACTION_NAMES if n in series), None)
    obs = obs or next(([n] for n in OBS_NAMES if n in series), None)
    for name in [*(obs or []), *([action] if action else [])]:
        if name not in series:
            raise SystemExit(f"train_example: {name!r} is not a time-series field of the export; "
                             f"time-series fields: {', '.join(series)}")
    if obs is None or action is None:
        raise SystemExit(f"train_example: pass --obs FIELD [FIELD ...] and --action FIELD; time-series fields: "
                         f"{', '.join(series)}")
    return obs, action


class FrameEncoder(nn.Module):
    """[B, T, H, W, C] uint8 frames -> [B, T * 16] features: two strided convs and a global mean per frame."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(channels, 8, 5, stride=4), nn.GELU(), nn.Conv2d(8, 16, 3, stride=2),
                                 nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t = frames.shape[:2]
        x = frames.flatten(0, 1).permute(0, 3, 1, 2).float() / 255.0  # [B*T, C, H, W]
        return (self.net(x).view(b, t, -1) * mask[..., None]).flatten(1)  # padded frames contribute 0


class Policy(nn.Module):
    """Observation windows ([B, T, N] + [B, T] mask each) and camera windows -> [B, Ta, Na] actions."""

    def __init__(self, obs_shapes: list[tuple[int, int]], camera_shapes: list[tuple[int, ...]],
                 action_shape: tuple[int, int], hidden: int) -> None:
        super().__init__()
        self.action_shape = tuple(action_shape)
        self.cameras = nn.ModuleList(FrameEncoder(shape[-1]) for shape in camera_shapes)
        width = sum(t * n + t for t, n in obs_shapes) + sum(shape[0] * 16 for shape in camera_shapes)
        ta, na = action_shape
        self.net = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, ta * na))

    def forward(self, obs: list[tuple[torch.Tensor, torch.Tensor]],
                cameras: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        parts = [torch.cat([(x * m[..., None]).flatten(1), m.float()], dim=1) for x, m in obs]  # [B, T*N + T]
        parts += [encoder(frames, m) for encoder, (frames, m) in zip(self.cameras, cameras)]
        return self.net(torch.cat(parts, dim=1)).view(-1, *self.action_shape)


def build_transform(stats: dict[str, Any], fields: list[str], mode: str, cameras: list[str],
                    augment: bool) -> Compose:
    """Per sample, in the DataLoader workers: Normalize the time-series fields by the split's
    statistics, then (with `augment`) shift and colour-jitter the camera windows, one draw per window
    from the sample's generator (so a resume or another worker count draws the same)."""
    steps: list[Any] = [Normalize(stats, mode={name: mode for name in fields})]
    if augment:
        steps += [RandomShift(4, cameras=cameras), ColorJitter(0.2, 0.2, 0.2, 0.02, cameras=cameras)]
    return Compose(steps)


def masked_mse(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the real steps only: pred/target [B, T, N], mask [B, T] bool."""
    m = mask[..., None].to(pred.dtype)  # [B, T, 1]
    return ((pred - target) ** 2 * m).sum() / (m.sum() * pred.shape[-1]).clamp_min(1.0)


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Atomic: a reader (or a resume after a kill) sees the old checkpoint or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ  # started by torchrun
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.manual_seed(args.seed)  # same init on every rank (DDP also broadcasts rank 0's weights)

    dataset = ShardDataset(args.data, args.split, seed=args.seed, policy="pad")  # rank/world from the group
    schema = dataset.manifest["schema"]
    obs_fields, action = choose_fields(schema, args.obs, args.action)
    for name in args.camera:
        if schema.get(name, {}).get("kind") != "video":
            raise SystemExit(f"train_example: {name!r} is not a video field of the export; video fields: "
                             f"{', '.join(sorted(n for n, s in schema.items() if s['kind'] == 'video')) or 'none'}")
    # the transform needs the fields and statistics the dataset has just read from the manifest
    dataset.transform = build_transform(dataset.stats, [*obs_fields, action], args.normalize, args.camera,
                                        args.augment)
    loader = ShardLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)
    model = Policy([tuple(schema[n]["shape"]) for n in obs_fields], [tuple(schema[n]["shape"]) for n in args.camera],
                   tuple(schema[action]["shape"]), args.hidden)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    step = 0
    if args.resume:
        state = torch.load(args.checkpoint, map_location="cpu", weights_only=True)  # tensors and plain data only
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(json.loads(state["loader"]))
        torch.set_rng_state(state["rng"])
        step = int(state["step"])
        if rank == 0:
            print(f"resumed from {args.checkpoint}: step {step}, epoch {dataset.epoch}, "
                  f"{loader.state_dict()['consumed']} samples of it consumed per rank", flush=True)
    net = DistributedDataParallel(model) if distributed else model

    def checkpoint() -> None:
        if rank == 0:
            save_checkpoint(args.checkpoint, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                              "step": step, "loader": json.dumps(loader.state_dict()),
                                              "rng": torch.get_rng_state(), "world_size": world})
        if distributed:
            dist.barrier()  # nobody runs ahead of a checkpoint that is still being written

    log = open(args.log, "a", encoding="utf-8") if (args.log and rank == 0) else None
    start, stopped, saved_at = time.perf_counter(), False, step
    try:
        for epoch in range(dataset.epoch, args.epochs):
            loader.set_epoch(epoch)  # no-op when resuming inside this epoch
            for batch in loader:
                pred = net([(batch[n], batch[f"{n}_mask"]) for n in obs_fields],  # normalised in the workers
                           [(batch[n], batch[f"{n}_mask"]) for n in args.camera])
                loss = masked_mse(pred, batch[action], batch[f"{action}_mask"])  # in normalised units
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # DDP averages the gradients over ranks here
                optimizer.step()
                step += 1
                mean_loss = loss.detach().clone()
                first_keys = [batch["__key__"][0]]
                if distributed:
                    dist.all_reduce(mean_loss)
                    mean_loss /= world
                    first_keys = [None] * world
                    dist.all_gather_object(first_keys, batch["__key__"][0])
                if log is not None:
                    log.write(json.dumps({"step": step, "epoch": epoch, "loss": float(mean_loss),
                                          "first_keys": first_keys, "batch": len(batch["__key__"])}) + "\n")
                    log.flush()
                if args.every and step % args.every == 0:
                    checkpoint()
                    saved_at = step
                if args.max_steps and step >= args.max_steps:
                    stopped = True
                    break
            if stopped:
                break
        if args.checkpoint is not None and not stopped and saved_at != step:
            checkpoint()
        if rank == 0:
            how = f"stopped at --max-steps {args.max_steps}" if stopped else "done"
            print(f"{how}: step {step}, epoch {dataset.epoch}, {world} rank(s), "
                  f"{time.perf_counter() - start:.1f} s", flush=True)
    finally:
        if log is not None:
            log.close()
        if distributed:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
