"""The node-local shard cache (`ShardDataset(..., cache_dir=, cache_limit_bytes=)`, reader/shard_cache.py)
against a real moto S3 server behind the proxy of tests/fault_proxy.py: shards downloaded once and
then read locally, equal to a local read; two DataLoader worker processes sharing an empty cache
download each shard once and never read a partial file; the folder never exceeds its limit by more
than one shard; files the cache did not write are never deleted; a dead download's leftovers are."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from robowds.reader import Remote, RetryPolicy, ShardDataset, ShardLoader
from robowds.reader.shard_cache import SHARD, ShardCache
from robowds.reader.source import ShardReadError

from fault_proxy import FaultProxy, moto_client
from remote_export import exported, s3  # noqa: F401 (fixtures)
from test_reader_remote import canonical

pytest.importorskip("moto")
pytest.importorskip("s3fs")

FAST = RetryPolicy(attempts=6, backoff_s=0.01, max_backoff_s=0.05, timeout_s=2.0)
URL = "s3://robots/ds/manifest.json"


@pytest.fixture(scope="module")
def local(exported: Path) -> list[Any]:
    return batches(exported)


def batches(source: Any, workers: int = 0, **kwargs: Any) -> list[Any]:
    return [canonical(b) for b in ShardLoader(ShardDataset(source, "train", seed=4, **kwargs), batch_size=1,
                                              num_workers=workers)]


def published(folder: Path, kind: str = "tar") -> list[str]:
    """The cache's own shards (or indexes: "idx") in `folder` (robowds-<sha256>.<kind>)."""
    return sorted(p.name for p in folder.iterdir() if (m := SHARD.match(p.name)) and m["kind"] == kind)


def test_shards_download_once_then_read_locally(s3: tuple[FaultProxy, dict[str, Any]], local: list[Any],
                                                tmp_path: Path) -> None:
    proxy, options = s3
    shards = ShardDataset(URL, "train", remote=Remote(storage_options=options)).shards
    proxy.configure(None)
    assert batches(URL, remote=Remote(storage_options=options, retry=FAST, cache_dir=tmp_path)) == local
    assert proxy.gets(".tar") == len(shards)  # one ranged read per shard (each < 8 MiB)
    assert published(tmp_path) == sorted(f"robowds-{s.sha256}.tar" for s in shards)
    assert published(tmp_path, "idx") == sorted({f"robowds-{s.index_sha256}.idx" for s in shards})  # by content
    proxy.configure(None)
    assert batches(URL, remote=Remote(storage_options=options, retry=FAST, cache_dir=tmp_path)) == local  # a new run
    assert proxy.gets(".tar") == proxy.gets(".idx") == 0  # all from the node cache


def test_two_worker_processes_share_an_empty_cache(s3: tuple[FaultProxy, dict[str, Any]], local: list[Any],
                                                   tmp_path: Path) -> None:
    """Batches of 1 dealt to 2 workers alternately: both want every shard at the same moment (with
    50 ms per request, the downloads overlap); each is downloaded once, and both read it whole."""
    proxy, options = s3
    proxy.configure(None, latency_s=0.05)
    assert batches(URL, 2, remote=Remote(storage_options=options, retry=FAST, cache_dir=tmp_path)) == local
    shards = ShardDataset(URL, "train", remote=Remote(storage_options=options)).shards
    assert proxy.gets(".tar") == len(shards)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".part")]


@pytest.mark.parametrize("workers", [0, 2])
def test_limit_is_exceeded_by_at_most_the_shard_landing(s3: tuple[FaultProxy, dict[str, Any]], local: list[Any],
                                                        tmp_path: Path, workers: int) -> None:
    """A limit of 2.5 shards: at every sample (checked in the reading processes, by the transform)
    the shards and downloads in the folder stay under limit + one shard; files that are not the
    cache's own survive every eviction, and a dead download's temporary file is removed."""
    proxy, options = s3
    shards = ShardDataset(URL, "train", remote=Remote(storage_options=options)).shards
    largest = max(s.bytes for s in shards)
    limit = int(2.5 * largest)
    foreign = {"notes.txt": b"mine", "robowds-0123.tar": b"x" * 10, "other.tar": b"y" * largest,
               f"robowds-{'a' * 64}.tar.part": b"z"}
    for name, data in foreign.items():
        (tmp_path / name).write_bytes(data)
    dead = tmp_path / f"robowds-{'b' * 64}.tar.12345-0badcafe.part"  # no process holds its lock
    dead.write_bytes(b"\0" * largest)
    cache = ShardCache(str(tmp_path), limit)

    def check(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        assert cache.usage() <= limit + largest, cache.usage()
        return sample

    proxy.configure(None, latency_s=0.01)
    got = batches(URL, workers, transform=check,
                  remote=Remote(storage_options=options, retry=FAST, cache_dir=tmp_path, cache_limit_bytes=limit))
    assert got == local
    assert cache.usage() <= limit and len(published(tmp_path)) == 2  # the others were evicted
    assert {name: (tmp_path / name).read_bytes() for name in foreign} == foreign
    assert not dead.exists()


def test_a_live_download_is_counted_and_kept(s3: tuple[FaultProxy, dict[str, Any]], exported: Path,
                                             tmp_path: Path) -> None:
    """Another process's download in flight (its temporary file locked) is never removed, and counts
    against the limit at its full size: with it the limit has no room, so a read waits for it."""
    proxy, options = s3
    shard = ShardDataset(URL, "train", remote=Remote(storage_options=options)).shards[0]
    live = tmp_path / f"robowds-{'c' * 64}.tar.{os.getpid()}-0000beef.part"
    fd = os.open(live, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 1000)
        cache = ShardCache(str(tmp_path), 1000 + shard.bytes)
        data = (exported / shard.path).read_bytes()
        with cache.open(shard.sha256, shard.bytes, lambda a, b: data[a:b]) as fh:  # fits beside it
            assert fh.read() == data
        assert live.exists() and cache.usage() == 1000 + shard.bytes
    finally:
        os.close(fd)
    other = ShardDataset(URL, "train", remote=Remote(storage_options=options)).shards[1]
    data = (exported / other.path).read_bytes()
    with ShardCache(str(tmp_path), 0).open(other.sha256, other.bytes, lambda a, b: data[a:b]) as fh:
        assert fh.read() == data  # alone over the limit: it lands anyway, everything else evicted
    assert not live.exists()  # its owner let go: abandoned, removed by the next download's eviction
    assert published(tmp_path) == [f"robowds-{other.sha256}.tar"]


def test_a_corrupt_remote_shard_is_never_published(s3: tuple[FaultProxy, dict[str, Any]], exported: Path,
                                                   tmp_path: Path) -> None:
    proxy, options = s3
    proxy.configure(None)
    ds = ShardDataset(exported, "train", shuffle=False)
    shard = ds.shards[0]
    client = moto_client(proxy)
    for path in exported.rglob("*"):
        if path.is_file():
            body = path.read_bytes()
            if path.name == Path(shard.path).name:
                body = body[:5000] + bytes([body[5000] ^ 1]) + body[5001:]  # one bit flipped, same size
            client.put_object(Bucket="robots", Key=f"flip/{path.relative_to(exported).as_posix()}", Body=body)
    remote = ShardDataset("s3://robots/flip/", "train", shuffle=False,
                          remote=Remote(storage_options=options, retry=FAST, cache_dir=tmp_path))
    with pytest.raises(ShardReadError, match=rf"^shard {shard.path}: byte 0: s3://robots/flip/{shard.path}: "
                                             r"the downloaded copy does not match the manifest"):
        next(iter(remote))
    assert not [p for p in os.listdir(tmp_path) if p.startswith(f"robowds-{shard.sha256}.tar")]


def test_local_exports_are_read_in_place(exported: Path, local: list[Any], tmp_path: Path) -> None:
    assert batches(exported, remote=Remote(cache_dir=tmp_path / "unused")) == local
    assert not (tmp_path / "unused").exists()
    with pytest.raises(ValueError, match="cache_limit_bytes must be >= 0"):
        ShardDataset(exported, "train", remote=Remote(cache_dir=tmp_path, cache_limit_bytes=-1))


def test_a_download_publishes_only_under_the_folder_lock(tmp_path: Path) -> None:
    """The rename from the temporary name to the published one waits for the folder lock, which every
    scan that makes room holds: a scan racing the rename could otherwise list the temporary name, find
    it gone at stat, and count the shard under neither name (CI drew a folder over its limit that way)."""
    import hashlib
    import threading

    data = bytes(range(256)) * 40
    sha = hashlib.sha256(data).hexdigest()
    cache = ShardCache(str(tmp_path), 10 * len(data))
    downloading, locked = threading.Event(), threading.Event()

    def download(start: int, stop: int) -> bytes:
        downloading.set()
        assert locked.wait(5)
        return data[start:stop]

    opened: list[bytes] = []
    fd = os.open(tmp_path / "robowds-cache.lock", os.O_RDWR | os.O_CREAT)
    try:
        worker = threading.Thread(target=lambda: opened.append(cache.open(sha, len(data), download).read()))
        worker.start()
        assert downloading.wait(5)  # its room is reserved; now the test holds the folder lock
        fcntl.flock(fd, fcntl.LOCK_EX)
        locked.set()
        worker.join(0.5)
        assert worker.is_alive() and not Path(cache.path(sha)).exists()  # the download waits to publish
    finally:
        os.close(fd)
    worker.join(5)
    assert opened == [data] and Path(cache.path(sha)).read_bytes() == data


def test_the_least_recently_used_shard_is_the_one_evicted(tmp_path: Path) -> None:
    """Room for two shards: A and B land, A is opened again (a use), C lands: B, used least recently,
    is evicted, and A, although downloaded first, stays. Uses are the files' modification times; the
    landing times are set apart explicitly, since the file system's clock may stamp two quick
    downloads alike."""
    import hashlib
    import time

    blobs = {name: bytes([i]) * 4096 for i, name in enumerate("ABC")}
    sha = {name: hashlib.sha256(data).hexdigest() for name, data in blobs.items()}
    cache = ShardCache(str(tmp_path), 2 * 4096)

    def fetch(name: str) -> bytes:
        with cache.open(sha[name], 4096, lambda start, stop: blobs[name][start:stop]) as fh:
            return fh.read()

    def no_download(start: int, stop: int) -> bytes:
        raise AssertionError("a published shard was downloaded again")

    assert fetch("A") == blobs["A"] and fetch("B") == blobs["B"]
    now = time.time()
    os.utime(cache.path(sha["A"]), (now - 300, now - 300))  # A landed first ...
    os.utime(cache.path(sha["B"]), (now - 200, now - 200))  # ... then B
    with cache.open(sha["A"], 4096, no_download) as fh:  # ... then A was used again
        assert fh.read() == blobs["A"]
    assert fetch("C") == blobs["C"]
    assert published(tmp_path) == sorted(f"robowds-{sha[n]}.tar" for n in "AC")
    assert cache.usage() == 2 * 4096
