"""Key lookups in a split's key index (`reader/keys.py`) as the split grows: first and later lookups.

    python scripts/bench_by_key.py                   # 100k, 1M and 10M samples, ~1 minute on 2 cores
    python scripts/bench_by_key.py --quick

For each size it writes the key index of a split of that many samples (keys `ep_<episode>_<anchor>`,
1000 windows an episode, positions shuffled as an export shuffles them) into a temporary file, then
looks keys up through `KeyIndex` reading the file by `pread`, as `ShardIndex` does for a local export:
the first lookup of a fresh index (nothing cached: what a new DataLoader worker pays), and the mean
of `--lookups` random lookups after it, with the reads each needs. This times the search alone:
`ShardIndex.by_key` adds one shard's offset index on its first use and one 512-byte header read a
lookup, which do not depend on the split's size. Targets (issue 26): O(log n) lookups and a first
lookup independent of the export's size (before: 6.5 s for the first cold lookup and 23 ms a
lookup at 613k samples, from scanning tar headers past the key cache).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import benchlib
import numpy as np

from robowds.reader.keys import KeyIndex, encode_key_index, key_hashes


def key(i: int) -> str:
    """Sample i's key: 1000 windows an episode."""
    return f"ep_{i // 1000:05d}_{i % 1000:06d}"


def reader(path: Path):
    fd = os.open(path, os.O_RDONLY)
    return lambda start, stop: os.pread(fd, stop - start, start)


def main() -> None:
    described = benchlib.parser(__doc__, repeats=3, quick={"sizes": [10_000], "lookups": 100})
    described.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    described.add_argument("--lookups", type=int, default=10_000, help="random lookups timed after the first")
    args = benchlib.parse(described)
    report = benchlib.Report("bench_by_key", args)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="bench_by_key_") as tmp:
        for size in args.sizes:
            path = Path(tmp) / f"{size}.keys"
            path.write_bytes(encode_key_index(key_hashes(map(key, rng.permutation(size).tolist()))))
            read = reader(path)
            probe = [key(i) for i in rng.integers(0, size, args.lookups).tolist()]
            firsts, laters, reads = [], [], 0
            for _ in range(args.repeats):
                index = KeyIndex(path.name, size, read)
                began = time.perf_counter()
                assert len(index.candidates(probe[0])) == 1
                firsts.append(time.perf_counter() - began)
                first_reads = index.reads
                began = time.perf_counter()
                for wanted in probe:
                    index.candidates(wanted)
                laters.append((time.perf_counter() - began) / len(probe))
                reads = (index.reads - first_reads) / len(probe)
            report.add(f"{size:,} samples: first lookup ({first_reads} reads)", min(firsts) * 1e3, "ms",
                       target="independent of size")
            report.add(f"{size:,} samples: later lookups ({reads:.1f} reads each)", min(laters) * 1e6, "us",
                       target="O(log n)")
            os.unlink(path)
    report.finish()


if __name__ == "__main__":
    main()
