"""A soak run of the reader: `ShardLoader` epochs with 2 workers over a ~1 GB export for 30 minutes,
the loader rebuilt from its saved cursor every 5 minutes (what a training job's restart does), with
what a long run leaks sampled every minute. Not a CI test: it takes as long as it is told to.

    python scripts/soak_reader.py                      # 30 minutes, ~1 GB export, 2 workers
    python scripts/soak_reader.py --minutes 6 --resume-every 2 --episodes 8   # a short check

Sampled each minute (and at the start, after the first batch): the main process's and its children's
(DataLoader workers, multiprocessing's helpers) anonymous and file-backed RSS (/proc/PID/status RssAnon, RssFile), open file descriptors
(/proc/PID/fd), threads, and the shared-memory segments under /dev/shm that this run's processes hold
(torch's and robowds' batch slots). "Flat" is judged between the first sample and the last: a leak
of a few KB per batch grows by MBs over 30 minutes of batches. The export is the bench_read_rss one
(raw ~500 KB samples read as zero-copy views, the case whose mapped pages used to pile up). Every
resume must carry on exactly where the cursor was: the batch after a rebuild is checked against the
uninterrupted sequence of the epoch's keys (same seed, so the same plan).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib
from bench_read_rss import export_zero_copy

MB = 1e6


def _status(pid: int) -> dict[str, int]:
    found = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                name, _, value = line.partition(":")
                if name in ("RssAnon", "RssFile", "Threads"):
                    found[name] = int(value.split()[0]) * (1024 if name != "Threads" else 1)
        found["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return {}
    return found


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(c) for c in fh.read().split()]
    except FileNotFoundError:
        return []


def _shm_segments(pids: list[int]) -> int:
    """Files under /dev/shm any of `pids` has open or mapped."""
    held = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as fh:
                held |= {line.split()[-1] for line in fh if "/dev/shm/" in line}
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("/dev/shm/"):
                        held.add(target)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return len(held)


def sample(started: float, batches: int, resumes: int) -> dict[str, Any]:
    """One row: this process, its workers (summed), /dev/shm segments held."""
    me = os.getpid()
    workers = _children(me)
    main = _status(me)
    kids = [_status(p) for p in workers]
    return {"minute": round((time.perf_counter() - started) / 60, 2), "batches": batches, "resumes": resumes,
            "main_anon_mb": main.get("RssAnon", 0) / MB, "main_file_mb": main.get("RssFile", 0) / MB,
            "main_fds": main.get("fds", 0), "main_threads": main.get("Threads", 0),
            "workers": len(workers), "workers_anon_mb": sum(k.get("RssAnon", 0) for k in kids) / MB,
            "workers_file_mb": sum(k.get("RssFile", 0) for k in kids) / MB,
            "shm_segments": _shm_segments([me, *workers])}


def main() -> None:
    described = benchlib.parser(__doc__, repeats=1, quick={"minutes": 1.0, "resume_every": 0.5, "episodes": 3})
    described.add_argument("--minutes", type=float, default=30.0)
    described.add_argument("--resume-every", type=float, default=5.0, help="minutes between loader rebuilds")
    described.add_argument("--episodes", type=int, default=22, help="synthetic episodes (22: ~1 GB)")
    described.add_argument("--workers", type=int, default=2)
    args = benchlib.parse(described)
    report = benchlib.Report("soak_reader", args)
    from robowds.reader import ShardDataset, ShardLoader

    with tempfile.TemporaryDirectory(prefix="soak_reader_") as tmp:
        out = export_zero_copy(Path(tmp), args.episodes)  # bench_read_rss's export
        size = sum(p.stat().st_size for p in out.rglob("*.tar"))
        print(f"export: {size / MB:.0f} MB; {args.minutes} minutes, a rebuild every {args.resume_every} minutes")

        def loader(state: dict[str, Any] | None) -> ShardLoader:
            ds = ShardDataset(out, "train", seed=0)
            made = ShardLoader(ds, batch_size=16, num_workers=args.workers)
            if state is not None:
                made.load_state_dict(state)
            return made

        # each epoch's batches' keys read uninterrupted in this process (no field decoded: cheap), to
        # check every batch of the soak against, resumed or not (the same seed: the same plan)
        reference: dict[int, list[list[str]]] = {}

        def expected(epoch: int) -> list[list[str]]:
            if epoch not in reference:
                reference.clear()  # one epoch's keys at a time: the soak itself must not grow
                plain = ShardLoader(ShardDataset(out, "train", seed=0, fields=[]), batch_size=16)
                plain.set_epoch(epoch)
                reference[epoch] = [list(b["__key__"]) for b in plain]
            return reference[epoch]

        def keys_of(batch: Any) -> list[str]:
            return list(batch["__key__"])  # collated: a list of the batch's sample keys

        started = time.perf_counter()
        rows, batches, resumes, mismatches = [], 0, 0, 0
        current, state = loader(None), None
        next_sample, next_resume = 0.0, args.resume_every * 60
        end = args.minutes * 60
        while time.perf_counter() - started < end:
            seen = expected(current.dataset.epoch)
            at = current.dataset.start // 16  # the batch this pass starts at
            rebuilt = False
            for i, batch in enumerate(current, start=at):
                mismatches += keys_of(batch) != seen[i]
                batches += 1
                now = time.perf_counter() - started
                if now >= next_sample:
                    rows.append(sample(started, batches, resumes))
                    print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in rows[-1].items()}),
                          flush=True)
                    next_sample += 60
                if now >= next_resume or now >= end:
                    state = current.state_dict()
                    rebuilt = True
                    break
            if rebuilt and time.perf_counter() - started < end:
                del current
                current = loader(state)
                resumes += 1
                next_resume += args.resume_every * 60
        del current
        # the first minute's sample against the last, both taken while the workers ran (the one after
        # the first batch is before the caches and the workers' imports settle)
        first, last = rows[1] if len(rows) > 2 else rows[0], rows[-1]
        print(f"{batches} batches, {resumes} rebuilds from the cursor, {mismatches} batches differing "
              "from the uninterrupted order", flush=True)
        for key, unit in (("main_anon_mb", "MB"), ("main_file_mb", "MB"), ("workers_anon_mb", "MB"),
                          ("workers_file_mb", "MB"), ("main_fds", "fds"), ("main_threads", "threads"),
                          ("shm_segments", "segments")):
            report.add(f"{key}: last sample (first: {first[key]:.1f})", last[key], unit,
                       baseline=first[key] or None, target="flat")
        report.add("batches differing from the uninterrupted order", mismatches, "batches", target="0")
        if args.json:
            args.json.with_suffix(".rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    report.finish()


if __name__ == "__main__":
    main()
