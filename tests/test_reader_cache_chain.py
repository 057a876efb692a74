"""fsspec cache chains (`simplecache::`, `filecache::`, `blockcache::` + `s3://`) read by several
threads and processes: every sample equal to a local read.

Before the fix (reader/remote.py, `CacheChainGuard`) the range-read test failed for all three chains,
with and without cut downloads, and the dataset test for blockcache: a whole-file cache only checks
that the local file exists while another thread still downloads into it, and a second download
truncates it under the first (silently wrong bytes); a download cut by the network left a partial
copy that every retry read again; the block cache marks blocks present before their bytes arrive (and
keeps them marked when the fetch fails: zeros, "no sample here"); and `RangeReader` sent blockcache's
`_cat_file` straight to s3fs with the chained URL. A real moto server on loopback, behind the proxy
of tests/fault_proxy.py (a little latency, so that downloads overlap)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fsspec.implementations.cache_mapper import create_cache_mapper

from robowds.reader import Remote, RetryPolicy, ShardDataset, ShardLoader

from fault_proxy import FaultProxy, moto_client
from remote_export import exported, s3  # noqa: F401 (fixtures)
from test_reader_remote import canonical

pytest.importorskip("moto")
pytest.importorskip("s3fs")

FAST = RetryPolicy(attempts=4, backoff_s=0.01, max_backoff_s=0.05, timeout_s=5.0)
CHAINS = ["simplecache", "filecache", "blockcache"]


@pytest.fixture(scope="module")
def local(exported: Path) -> list[Any]:
    return [canonical(s) for s in ShardDataset(exported, "train", seed=4)]


def chained(chain: str, options: dict[str, Any], storage: Path) -> dict[str, Any]:
    inner = {k: v for k, v in options.items() if k != "skip_instance_cache"}
    return {"s3": inner, chain: {"cache_storage": str(storage)}}


@pytest.mark.parametrize("chain", CHAINS)
def test_cache_chain_with_eight_read_threads(s3: tuple[FaultProxy, dict[str, Any]], local: list[Any],
                                             tmp_path: Path, chain: str) -> None:
    """Two passes, each with an empty cache folder (the first read of every shard races) and
    per-sample requests (the most concurrent reads of one object), then one warm pass."""
    proxy, options = s3
    proxy.configure(None, latency_s=0.01)
    for run in range(2):
        storage = tmp_path / f"cache{run}"
        ds = ShardDataset(f"{chain}::s3://robots/ds/manifest.json", "train", seed=4,
                          remote=Remote(storage_options=chained(chain, options, storage), retry=FAST, max_request_bytes=0))
        assert [canonical(s) for s in ds] == local, f"pass {run}"
    ds.set_epoch(0)  # a dataset iterated to its end moved on to epoch 1
    assert [canonical(s) for s in ds] == local  # from the cache
    assert not any(p.name.endswith(".part") for p in storage.iterdir())


def test_shared_cache_folder_across_dataloader_workers(s3: tuple[FaultProxy, dict[str, Any]], local: list[Any],
                                                       exported: Path, tmp_path: Path) -> None:
    """Two worker processes (8 read threads each) share one simplecache folder: each waits for the
    other's download of a shard instead of reading the half-written file."""
    proxy, options = s3
    proxy.configure(None, latency_s=0.01)
    storage = tmp_path / "shared"
    for _ in range(2):
        ds = ShardDataset("simplecache::s3://robots/ds/manifest.json", "train", seed=4,
                          remote=Remote(storage_options=chained("simplecache", options, storage), retry=FAST,
                                        max_request_bytes=0))
        batches = [canonical(b) for b in ShardLoader(ds, batch_size=1, num_workers=2)]
        keys = [dict(b)["__key__"][0] for b in batches]
        assert keys == [dict(s)["__key__"] for s in local]
    mapper = create_cache_mapper(False)  # simplecache's default file names
    for shard in ds.shards:  # each cached copy whole (no second download truncated it)
        assert (storage / mapper(f"robots/ds/{shard.path}")).read_bytes() == (exported / shard.path).read_bytes()


@pytest.mark.parametrize("fault", [None, "cut"])
@pytest.mark.parametrize("chain", CHAINS)
def test_range_reads_through_a_cache_chain_from_eight_threads(s3: tuple[FaultProxy, dict[str, Any]],
                                                              tmp_path: Path, chain: str, fault: str | None) -> None:
    """Random 12 KB ranges of four 2 MiB objects, 8 threads at once, empty cache: every range exact;
    also when every 2nd download is cut short (the cache must not keep the partial copy)."""
    from robowds.reader.remote import RangeReader
    from robowds.reader.source import remote_filesystem

    proxy, options = s3
    proxy.configure(None)
    rng = np.random.default_rng(7)
    blobs = [rng.integers(0, 256, 2 << 20, dtype=np.uint8).tobytes() for _ in range(4)]
    client = moto_client(proxy)
    for i, blob in enumerate(blobs):
        client.put_object(Bucket="robots", Key=f"blobs/{chain}/{i}", Body=blob)
    proxy.configure(fault, every=2, only="/blobs/", per_target=1)
    url = f"{chain}::s3://robots/blobs/{chain}"
    reader = RangeReader(remote_filesystem(url, chained(chain, options, tmp_path / "c")), FAST)
    reads = [(int(i), int(a)) for i, a in zip(rng.integers(0, 4, 240), rng.integers(0, (2 << 20) - 12000, 240))]

    def one(read: tuple[int, int]) -> bool:
        i, a = read
        return reader.read(f"{url}/{i}", a, a + 12000) == blobs[i][a:a + 12000]

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(one, reads))
    assert proxy.faults > 0 or fault is None
