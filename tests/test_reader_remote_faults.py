"""Coalesced remote reads through faults: a real moto S3 server behind the fault-injecting proxy of
tests/fault_proxy.py that resets every Nth connection, adds latency and answers some requests 503.
Every sample arrives exactly once, in plan order, equal to a local read, with fewer GETs than samples;
the retry waits are reproducible; a sample-per-request read still works the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from robowds.reader import Remote, RetryPolicy, ShardDataset, ShardLoader
from robowds.reader.remote import RangeReader, RemoteReadError
from robowds.reader.source import ShardReadError, remote_filesystem

from fault_proxy import FaultProxy
from remote_export import exported, s3  # noqa: F401 (fixtures)
from test_reader_remote import canonical

pytest.importorskip("moto")
pytest.importorskip("s3fs")

FAST = RetryPolicy(attempts=8, backoff_s=0.01, max_backoff_s=0.05, timeout_s=2.0)
URL = "s3://robots/ds/manifest.json"


def batches(source: Any, workers: int = 0, **kwargs: Any) -> list[Any]:
    return [canonical(b) for b in ShardLoader(ShardDataset(source, "train", seed=4, **kwargs), batch_size=3,
                                              num_workers=workers)]


@pytest.fixture(scope="module")
def local(exported: Path) -> list[Any]:
    return batches(exported)


def test_unshuffled_reads_are_one_request_per_shard_and_bounded(s3: tuple[FaultProxy, dict[str, Any]],
                                                                exported: Path) -> None:
    proxy, options = s3
    ds = ShardDataset(exported, "train", shuffle=False)
    local = [canonical(s) for s in ds]
    proxy.configure(None)
    assert [canonical(s) for s in ShardDataset(URL, "train", shuffle=False,
                                               remote=Remote(storage_options=options))] == local
    assert proxy.gets(".tar") == len(ds.shards)  # 8 samples of ~12 KB: one GET each shard
    bound = 3 * min(s.bytes for s in ds.shards if s.samples == 8) // 8  # about 3 samples
    proxy.configure(None)
    assert [canonical(s) for s in ShardDataset(URL, "train", shuffle=False,
                                               remote=Remote(storage_options=options, max_request_bytes=bound))] == local
    fewest = sum(-(-(s.bytes - 1024) // bound) for s in ds.shards)  # requests filled to the bound
    assert fewest <= proxy.gets(".tar") <= sum(-(-s.samples // 2) for s in ds.shards)  # >= 2 samples each
    proxy.configure(None)
    assert [canonical(s) for s in ShardDataset(URL, "train", shuffle=False,
                                               remote=Remote(storage_options=options, max_request_bytes=0))] == local
    assert proxy.gets(".tar") == len(local)  # one request per sample


@pytest.mark.parametrize("workers", [0, 2])
def test_resets_latency_and_throttling_every_sample_once_in_order(
        s3: tuple[FaultProxy, dict[str, Any]], local: list[Any], workers: int) -> None:
    """Every 4th connection reset, 20 ms added to every request, every 3rd request answered 503
    SlowDown (each request at most twice): the epoch equals the local one, batch for batch."""
    proxy, options = s3
    proxy.configure("503", every=3, per_target=2, latency_s=0.02, reset_every=4)
    assert batches(URL, workers, remote=Remote(storage_options=options, retry=FAST)) == local
    assert proxy.faults > 0
    samples = sum(len(dict(b)["__key__"]) for b in local)
    assert proxy.gets(".tar") < samples  # coalesced: fewer GETs than samples, faulty ones included


@pytest.mark.parametrize("mode", ["reset", "cut"])
def test_one_request_per_sample_through_faults(s3: tuple[FaultProxy, dict[str, Any]], local: list[Any],
                                               mode: str) -> None:
    proxy, options = s3
    proxy.configure(mode, every=3, only=".tar")
    assert batches(URL, remote=Remote(storage_options=options, retry=FAST, max_request_bytes=0)) == local
    assert proxy.faults >= len(local) // 3


def test_access_denied_is_permanent_and_named(s3: tuple[FaultProxy, dict[str, Any]], exported: Path) -> None:
    """A 403 on a shard is not retried (one request, where a retry would wait >= 10 s): one error
    naming shard, byte range, length, URL, the status and that it is permanent."""
    proxy, options = s3
    shard = ShardDataset(exported, "train").shards[0]
    ds = ShardDataset(URL, "train", shuffle=False,
                      remote=Remote(storage_options=options, retry=RetryPolicy(attempts=4, backoff_s=20.0)))
    end = shard.bytes - 1024  # one request: all 8 samples, up to the end-of-archive blocks
    proxy.configure("403", every=1, only=shard.path, suffix=".tar", per_target=10**9)  # not its index
    with pytest.raises(ShardReadError) as info:
        next(iter(ds))
    assert str(info.value) == (f"shard {shard.path}: bytes 0-{end} ({end} bytes) of s3://robots/ds/{shard.path}: "
                               "HTTP 403 AccessDenied: Access Denied (permanent: not retried)")
    assert proxy.faults == 1


def test_backoff_waits_are_reproducible_and_spread(s3: tuple[FaultProxy, dict[str, Any]], exported: Path) -> None:
    """The jitter comes from a generator seeded by (reader key, object, range): the same read waits
    the same in another run, different reads or readers do not wait in lock step."""
    proxy, options = s3
    url = "s3://robots/ds/" + ShardDataset(exported, "train").shards[0].path
    policy = RetryPolicy(attempts=4, backoff_s=1.0, max_backoff_s=8.0, timeout_s=2.0)

    def waits(key: str, start: int) -> list[float]:
        slept: list[float] = []
        reader = RangeReader(remote_filesystem(url, options), policy, sleep=slept.append, jitter_key=key)
        with pytest.raises(RemoteReadError, match=r"HTTP 503 SlowDown.*\(gave up after 4 attempts"):
            reader.read(url, start, start + 512)
        return slept

    proxy.configure("503", every=1, only=".tar", per_target=10**9)
    first = waits("0/0", 0)
    assert len(first) == 3 and all(0.5 * 2**k <= w <= 2**k for k, w in enumerate(first))
    assert waits("0/0", 0) == first
    assert waits("0/1", 0) != first
    assert waits("0/0", 512) != first
