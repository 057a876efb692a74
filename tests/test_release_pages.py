"""Mapped shard pages are let go of once read (reader/release.py): RSS stays flat over an epoch of
large zero-copy samples, and arrays still viewing dropped pages keep their values."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.reader import ShardDataset, ShardIndex, ShardLoader
from robowds.reader.sample_reads import READ_AHEAD_BYTES
from robowds.reader.release import FAULT_AROUND, RELEASE_CHUNK_BYTES, RELEASE_LAG_BYTES, ReleaseBehind
from robowds.reader.source import ShardSource

MB = 1 << 20


def rss_file() -> int:
    """This process's file-backed resident pages in bytes (/proc/self/status RssFile)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssFile:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


def touch_pages(sample: dict) -> int:
    """One byte per 4 KiB page of every array: what a consumer of zero-copy views reads."""
    total = 0
    for value in sample.values():
        if isinstance(value, np.ndarray) and value.nbytes >= 4096:
            flat = value.reshape(-1).view(np.uint8)
            total += int(flat[::4096].sum())
    return total


@pytest.fixture(scope="module")
def large_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~90 MB of ~500 KB samples (a 100 s IMU window at 200 Hz: stored as is, read as views, like raw
    camera frames), several shards, one split."""
    root = tmp_path_factory.mktemp("release")
    write_synthetic_store(root / "store", episodes=4, seed=0)
    assert main(["export", str(root / "store"), str(root / "out"), "--quiet", "--workers", "1",
                 "--set", "exclude=[overview]", "--set", "streams.imu.rate_hz=200",
                 "--set", "streams.imu.duration_s=100", "--set", "stride=2", "--set", "shard.max_samples=64"]) == 0
    return root / "out"


def test_dropped_pages_still_read_as_the_file(tmp_path: Path) -> None:
    """MADV_DONTNEED on the read-only shared mapping removes the pages from RSS, and an array that
    still views them reads exactly the file's bytes again (they fault back in from the page cache)."""
    data = np.random.default_rng(0).integers(0, 256, size=8 * MB, dtype=np.uint8)  # [8 MiB]
    (tmp_path / "s.tar").write_bytes(data.tobytes())
    source = ShardSource(str(tmp_path))
    buf, offset = source.span("s.tar", 0, len(data))
    view = np.frombuffer(buf, dtype=np.uint8, count=len(data), offset=offset)  # kept, like a sample's array
    before = rss_file()
    assert int(view[::4096].astype(np.int64).sum()) == int(data[::4096].astype(np.int64).sum())  # every page
    mapped = rss_file()
    assert mapped - before >= 7 * MB
    source.release("s.tar", 0, len(data))
    assert rss_file() <= mapped - 7 * MB
    assert np.array_equal(view, data)  # every byte, after the drop


def test_release_behind_keeps_the_lag_and_releases_one_span_per_shard() -> None:
    """Once lag + chunk bytes are behind, the oldest samples go until the lag is left (and at least
    `keep` samples), one FAULT_AROUND-aligned span per shard."""
    released: list[tuple[str, int, int]] = []
    behind = ReleaseBehind(lambda path, start, stop: released.append((path, start, stop)), lag_bytes=2 * MB, keep=2,
                           chunk_bytes=MB)
    behind.consumed("a", 5 * MB + 100, 6 * MB + 100)  # [5 MiB, 6 MiB + 64 KiB) once aligned
    behind.consumed("a", MB, 2 * MB)
    behind.consumed("b", 0, MB)
    assert released == []  # 3 MiB behind: not more than lag + chunk
    behind.consumed("b", 4 * MB, 5 * MB)
    assert released == [("a", MB, 6 * MB + FAULT_AROUND)]  # down to 2 MiB: shard a's two samples, one span
    assert behind.released == 5 * MB + FAULT_AROUND
    released.clear()
    keeping = ReleaseBehind(lambda path, start, stop: released.append((path, start, stop)), lag_bytes=0, keep=3,
                            chunk_bytes=0)
    for i in range(4):
        keeping.consumed("c", 2 * i * MB, (2 * i + 1) * MB)
    assert released == [("c", 0, MB)]  # the last 3 samples stay, whatever the lag


def test_rss_stays_flat_over_an_epoch_of_large_samples(large_export: Path) -> None:
    """Reading the whole export (workers 0, batches of raw zero-copy collation, then samples touched
    page by page) never holds more than the read-ahead and release lag of mapped pages, whatever the
    export's size; before, every page read stayed resident until the epoch ended."""
    export_bytes = sum(s["bytes"] for s in json.loads((large_export / "manifest.json").read_text())
                       ["splits"]["train"]["shards"])
    assert export_bytes > 80 * MB
    bound = RELEASE_LAG_BYTES + RELEASE_CHUNK_BYTES + READ_AHEAD_BYTES + 8 * MB  # 56 MiB
    ds = ShardDataset(large_export, "train", seed=0)
    samples = iter(ds)
    touch_pages(next(samples))  # imports and first mappings done
    base, peak, count = rss_file(), 0, 1
    for sample in samples:
        touch_pages(sample)
        peak = max(peak, rss_file() - base)
        count += 1
    assert count == ds.epoch_length()
    assert peak < bound, f"mapped pages grew by {peak / MB:.0f} MiB reading {export_bytes / MB:.0f} MB"

    loader = ShardLoader(ShardDataset(large_export, "train", seed=0), batch_size=8, num_workers=0)
    batches = iter(loader)
    next(batches)
    base, peak = rss_file(), 0
    for batch in batches:
        peak = max(peak, rss_file() - base)
    assert peak < bound, f"mapped pages grew by {peak / MB:.0f} MiB reading batches of {export_bytes / MB:.0f} MB"


def test_random_access_lets_go_of_what_it_read(large_export: Path) -> None:
    """`ShardIndex[i]` in a random order (a sampler's) holds no more mapped pages than the lag."""
    ds = ShardIndex(large_export, "train")
    order = np.random.default_rng(0).permutation(len(ds)).tolist()
    touch_pages(ds[order[0]])
    base, peak = rss_file(), 0
    for i in order[1:]:
        touch_pages(ds[i])
        peak = max(peak, rss_file() - base)
    assert peak < RELEASE_LAG_BYTES + RELEASE_CHUNK_BYTES + 8 * MB, f"mapped pages grew by {peak / MB:.0f} MiB"


def test_the_benchmarks_switch_keeps_every_page_read(large_export: Path) -> None:
    """`_release_pages = False` (internal: bench_read's paired A/B of what releasing costs) reads the
    same samples and lets the mapped pages grow to the export's size, as before reader/release.py."""
    ds = ShardDataset(large_export, "train", seed=0)
    ds._release_pages = False
    samples = iter(ds)
    touch_pages(next(samples))
    base, peak = rss_file(), 0
    for sample in samples:
        touch_pages(sample)
        peak = max(peak, rss_file() - base)
    assert peak > RELEASE_LAG_BYTES + RELEASE_CHUNK_BYTES + READ_AHEAD_BYTES + 8 * MB  # the bound released reads keep
