"""Remote reads: GETs per sample and samples/s of per-sample requests, coalesced requests and a warm
node-local shard cache, from a real S3 server (moto) behind a proxy that adds a round-trip latency.

    python scripts/bench_remote.py                      # ~2 minutes on 2 cores
    python scripts/bench_remote.py --latency-ms 50

What it does: exports one synthetic store (camera image excluded: ~12 KB samples, the size in issue
15's "625 GETs for 625 samples of 12 KB"), uploads it to a moto S3 server on loopback and reads the
train split through tests/fault_proxy.py's proxy, which holds every request `--latency-ms` before
forwarding it (the first-byte latency of an object store; loopback bandwidth is otherwise unlimited)
and counts the GETs of shard bytes. Each row iterates one whole epoch of `ShardDataset(s3://...,
seed=0)` in this process (8 read threads; no DataLoader workers, so the rows measure the read path
alone) and checks that the samples equal a local read of the same export:

  (a) per-sample: `max_request_bytes=0`, one ranged GET per sample (what the reader did before);
  (b) coalesced:  the default `max_request_bytes` (4 MiB), the default shuffled plan (blocks of 4096);
  (b') coalesced, `shuffle=False`: consecutive samples, the best case;
  (c) node cache, cold: `cache_dir=` empty, whole shards downloaded once, then mapped;
  (c') node cache, warm: a second epoch (a new dataset, as a new job would) with every shard cached.

samples/s counts decoded samples over the epoch, dataset construction (manifest read) excluded;
ratios are against (a). The machine is shared: compare the ratios of one run.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the fault proxy and the moto server the tests use

from fault_proxy import FaultProxy, s3_behind_proxy  # noqa: E402

import benchlib  # noqa: E402

from robowds.export.cli.main import main as robowds  # noqa: E402
from robowds.export.cli.synth import write_synthetic_store  # noqa: E402
from robowds.reader import Remote, ShardDataset  # noqa: E402

URL = "s3://robots/ds/manifest.json"


def fingerprint(sample: dict[str, Any]) -> tuple[Any, ...]:
    """Exact content of a sample, comparable across reads."""
    return tuple((k, v.tobytes() if isinstance(v, np.ndarray) else repr(v)) for k, v in sorted(sample.items()))


def row(name: str, proxy: FaultProxy, expected: list[tuple[Any, ...]], latency_s: float,
        **kwargs: Any) -> dict[str, Any]:
    """One epoch through the proxy: samples/s and GETs of shard bytes per sample."""
    ds = ShardDataset(URL, "train", **kwargs)
    proxy.configure(None, latency_s=latency_s)
    began = time.perf_counter()
    got = [fingerprint(s) for s in ds]
    seconds = time.perf_counter() - began
    if sorted(got) != sorted(expected) or (kwargs.get("shuffle", True) and got != expected):
        raise SystemExit(f"{name}: the samples differ from a local read")
    result = {"name": name, "samples": len(got), "s": seconds, "rate": len(got) / seconds,
              "gets": proxy.gets(".tar")}
    print(f"{name:<38} {len(got):>6} samples in {seconds:6.2f} s = {result['rate']:8,.0f} samples/s, "
          f"{result['gets']:>6} GETs = {result['gets'] / len(got):.4f} GETs/sample", flush=True)
    return result


def main() -> None:
    # --repeats: unused (one pass per row); kept for one option set
    parser = benchlib.parser(__doc__, repeats=1, quick={"episodes": 4, "latency_ms": 1.0})
    parser.add_argument("--episodes", type=int, default=60, help="synthetic episodes (default 60)")
    parser.add_argument("--stride", type=int, default=2, help="anchor every N grid frames (default 2)")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added to every request (default 20)")
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_remote", args)
    latency = args.latency_ms / 1000

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_synthetic_store(root / "store", episodes=args.episodes, seed=0)
        with contextlib.redirect_stdout(io.StringIO()):
            assert robowds(["export", str(root / "store"), str(root / "out"), "--quiet", "--workers", "1",
                            "--stride", str(args.stride), "--set", "exclude=[overview]"]) == 0
        local = ShardDataset(root / "out", "train", seed=0)
        expected = [fingerprint(s) for s in local]
        ordered = [fingerprint(s) for s in ShardDataset(root / "out", "train", shuffle=False)]
        size = sum(s.bytes for s in local.shards) / len(expected)
        print(f"export: {len(expected)} train samples of {size / 1024:.1f} KB (tar bytes / samples) in "
              f"{len(local.shards)} shards; proxy latency {args.latency_ms:g} ms per request\n", flush=True)

        with s3_behind_proxy({"ds": root / "out"}) as (proxy, options):
            common = {"remote": Remote(storage_options=options), "seed": 0}
            cached = {**common, "remote": Remote(storage_options=options, cache_dir=root / "cache")}
            plain = row("(a) per-sample requests", proxy, expected, latency,
                        **{**common, "remote": Remote(storage_options=options, max_request_bytes=0)})
            rows = [
                row("(b) coalesced (4 MiB), shuffled", proxy, expected, latency, **common),
                row("(b') coalesced (4 MiB), shuffle=False", proxy, ordered, latency, shuffle=False, **common),
                row("(c) node cache, cold", proxy, expected, latency, **cached),
                row("(c') node cache, warm", proxy, expected, latency, **cached),
            ]
        print("\nagainst (a) per-sample requests:")
        for r in rows:
            gets = f"{plain['gets'] / r['gets']:.0f}x fewer GETs" if r["gets"] else "no GETs"
            print(f"  {r['name']:<38} {r['rate'] / plain['rate']:6.1f}x samples/s, {gets}")
            report.add(f"{r['name']} (vs (a) per-sample requests)", r["rate"], "samples/s", baseline=plain["rate"])
    report.finish()


if __name__ == "__main__":
    main()
