"""One rank of the DDP reader test (`tests/test_ddp.py`), started by `torchrun` on gloo.

Reads one epoch of a split with `ShardLoader(ShardDataset(...))`, taking rank and world size from the
initialised process group, and does one `all_reduce` per batch as DDP's gradient sync would: if the
ranks got different batch counts, the one with more batches blocks in its extra `all_reduce` (the test
fails on its timeout). Writes `<outdir>/rank<r>.json`: the batch count and every `__key__` in order.
With `--resume-from OLD --take K` (`tests/test_reader_append_resume.py`) it first reads K batches of
OLD, an export OUT was appended from, and loads that cursor on OUT: `head` is what OLD gave, `keys`
the rest of the epoch, `next` the following epoch.

usage: torchrun --nproc_per_node=2 tests/ddp_worker.py OUT OUTDIR --policy pad --batch-size 8 --workers 2
       [--also '[{"out": ..., "outdir": ..., "policy": "drop", "workers": 0}, ...]']   (more reads, one launch)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from robowds.reader.dataset import ShardDataset
from robowds.reader.loader import ShardLoader


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", help="export folder (holds manifest.json)")
    p.add_argument("outdir", type=Path, help="where rank<r>.json goes")
    p.add_argument("--split", default="train")
    p.add_argument("--policy", default="pad")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--resume-from", help="an export OUT was appended from: resume its cursor on OUT")
    p.add_argument("--take", type=int, default=1, help="batches of --resume-from read before its cursor is saved")
    p.add_argument("--also", default="[]", help="JSON list of more reads in this launch, each a dict of these "
                                                 "options (out, outdir, policy, batch_size, workers, seed)")
    args = p.parse_args()
    # one launch for several reads: a torchrun start (two interpreters importing torch) costs more than a read
    jobs = [args, *(argparse.Namespace(**{**vars(args), "resume_from": None, **extra, "outdir": Path(extra["outdir"])})
                    for extra in json.loads(args.also))]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    for job in jobs:
        read_epoch(job)
    dist.destroy_process_group()


def read_epoch(args: argparse.Namespace) -> None:
    """One epoch of `args.out` on this rank, recorded in `args.outdir/rank<r>.json`."""
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = ShardLoader(ShardDataset(args.out, args.split, seed=args.seed, policy=args.policy),
                         batch_size=args.batch_size, num_workers=args.workers)
    keys: list[str] = []
    batches = 0
    synced = torch.zeros(1)
    resumed: dict[str, object] = {}
    if args.resume_from:
        before = ShardLoader(ShardDataset(args.resume_from, args.split, seed=args.seed, policy=args.policy),
                             batch_size=args.batch_size, num_workers=args.workers)
        head = [batch["__key__"] for _, batch in zip(range(args.take), before)]  # range first: no extra batch
        state = json.loads(json.dumps(before.state_dict()))  # every rank's is the same: all plan the same shards
        loader.load_state_dict(state)
        resumed = {"head": [k for b in head for k in b], "generation_saved": state["generation"]}
    for batch in loader:
        keys.extend(batch["__key__"])
        batches += 1
        grad = torch.tensor([float(len(batch["__key__"]))])  # stands in for a gradient
        dist.all_reduce(grad)  # blocks forever (until the timeout) if another rank has no batch left
        synced += grad
    if args.resume_from:
        resumed["next"] = [k for batch in loader for k in batch["__key__"]]
    total = torch.tensor([float(batches)])
    dist.all_reduce(total, op=dist.ReduceOp.MAX)
    record = {"rank": rank, "world_size": world, "batches": batches, "max_batches": int(total.item()),
              "len": len(loader), "keys": keys, "synced_samples": int(synced.item()),
              "dataset_world": [loader.dataset.rank, loader.dataset.world_size], "pid": os.getpid(), **resumed}
    args.outdir.mkdir(parents=True, exist_ok=True)
    (args.outdir / f"rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()


if __name__ == "__main__":
    main()
