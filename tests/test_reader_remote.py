"""Remote reads through a faulty network: a real moto S3 server on loopback behind a fault-injecting
HTTP proxy (tests/fault_proxy.py). Every 3rd response is reset, cut, delayed past the timeout, answered 503
SlowDown, or served without honouring `Range`: each sample must still arrive exactly once, in plan
order, equal to a local read. A fault on every response is one `ShardReadError` naming shard, byte
range and URL, and `on_error="skip"` skips exactly the samples of the affected shard."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from robowds.reader import Remote, RetryPolicy, ShardDataset, ShardLoader
from robowds.reader.source import ShardReadError

from offsets import shard_offsets
from fault_proxy import FaultProxy, moto_client
from remote_export import exported, s3  # noqa: F401 (fixtures)

pytest.importorskip("moto")
pytest.importorskip("boto3")
pytest.importorskip("s3fs")

FAST = RetryPolicy(attempts=6, backoff_s=0.01, max_backoff_s=0.05, timeout_s=1.0)  # short waits in tests


URL = "s3://robots/ds/manifest.json"


def canonical(item: Any) -> Any:
    """Exact, comparable content of a sample or batch (arrays and tensors as dtype, shape, bytes)."""
    if isinstance(item, torch.Tensor):
        item = item.numpy()
    if isinstance(item, np.ndarray):
        return ("array", item.dtype.str, item.shape, item.tobytes())
    if isinstance(item, dict):
        return tuple((k, canonical(v)) for k, v in sorted(item.items()))
    if isinstance(item, (list, tuple)):
        return tuple(canonical(v) for v in item)
    return item


def read(source: Any, workers: int = 0, **kwargs: Any) -> list[Any]:
    """Every batch of 3 of one epoch (seed 4, shuffled) through ShardLoader, canonical."""
    return [canonical(b) for b in ShardLoader(ShardDataset(source, "train", seed=4, **kwargs), batch_size=3,
                                              num_workers=workers)]


@pytest.fixture(scope="module")
def local(exported: Path) -> list[Any]:
    return read(exported)


MODES = ["reset", "cut", "short", "delay", "503", "ignore_range", "extra"]


@pytest.mark.parametrize("mode", MODES)
def test_every_third_response_faulty_reads_each_sample_once_in_order(
        s3: tuple[FaultProxy, dict[str, Any]], local: list[Any], mode: str) -> None:
    proxy, options = s3
    proxy.configure(mode)
    remote = read(URL, remote=Remote(storage_options=options, retry=FAST))
    assert proxy.faults >= proxy.gets() // 3 > 0  # the faults really happened
    assert remote == local
    assert sum(len(b[0][1]) for b in remote) > 0


@pytest.mark.parametrize("mode", ["cut"])
def test_faulty_responses_with_two_dataloader_workers(s3: tuple[FaultProxy, dict[str, Any]], local: list[Any],
                                                       mode: str) -> None:
    proxy, options = s3
    proxy.configure(mode)
    assert read(URL, workers=2, remote=Remote(storage_options=options, retry=FAST)) == local
    assert proxy.faults > 0


def test_verify_hashes_through_faults(s3: tuple[FaultProxy, dict[str, Any]], local: list[Any]) -> None:
    proxy, options = s3
    proxy.configure("cut", only=".tar")
    assert read(URL, remote=Remote(storage_options=options, retry=FAST), verify=True) == local


def _shard(exported: Path, index: int) -> dict[str, Any]:
    return json.loads((exported / "manifest.json").read_text())["splits"]["train"]["shards"][index]


@pytest.mark.parametrize("target", ["shard", "index"])
@pytest.mark.parametrize("mode", ["503", "reset"])
def test_permanent_fault_names_shard_range_and_url_and_is_skipped(
        s3: tuple[FaultProxy, dict[str, Any]], exported: Path, local: list[Any], mode: str, target: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`target`: the shard's bytes fail (its index, read first, stays reachable), or its index does."""
    proxy, options = s3
    shard = _shard(exported, 1)
    proxy.configure(mode, every=1, only=shard["path"], per_target=10**9)
    if target == "shard":
        spoil = proxy.fault_for
        monkeypatch.setattr(proxy, "fault_for", lambda method, path, headers: None if ".idx" in path
                            else spoil(method, path, headers))
    ds = ShardDataset(URL, "train", shuffle=False, remote=Remote(storage_options=options, retry=FAST))
    first = next(i for i, s in enumerate(ds.shards) if s.path == shard["path"])
    before = sum(ds.counts[:first])
    start, stop = shard_offsets(exported, shard)[0], shard["bytes"] - 1024  # one request: all its samples
    url = f"s3://robots/ds/{shard['path']}"
    began = time.monotonic()
    with pytest.raises(ShardReadError) as info:
        for i, _ in enumerate(ds):
            assert i < before  # the samples before the broken shard arrive
    message = str(info.value)
    assert message.startswith(f"shard {shard['path']}: bytes {start}-{stop} ({stop - start} bytes) of {url}: "
                              if target == "shard" else
                              f"shard {shard['path']}: index {shard['path']}.idx: {url}.idx cannot be read: ")
    assert re.search(rf" \(gave up after {FAST.attempts} attempts in [0-9.]+ s\)$", message)
    if mode == "503" and target == "shard":  # (the index's whole-object read names the status only)
        assert "HTTP 503 SlowDown: Please reduce your request rate." in message
    assert time.monotonic() - began < FAST.bound_s() + 5

    # skipped (in DataLoader workers): the epoch without exactly that shard's samples, in the same order.
    # Once per target: how the fault looks (503 or reset) changes the message above, not the skipping
    # (~10 s of worker start and reads each under load)
    if mode != "503":
        return
    skipping = ShardLoader(ShardDataset(URL, "train", seed=4, on_error="skip",
                                        # a 20 s request timeout: the broken shard fails at once (503s), and a
                                        # healthy read on a loaded CI machine must not pass 1 s and be skipped too
                                        remote=Remote(storage_options=options,
                                                      retry=RetryPolicy(attempts=3, backoff_s=0.0, timeout_s=20.0))),
                           batch_size=3, num_workers=2)
    got = [canonical(b) for b in skipping]
    keys = [k for b in got for k in dict(b)["__key__"]]
    local_keys = [k for b in local for k in dict(b)["__key__"]]
    lost = set(local_keys) - set(keys)
    assert keys == [k for k in local_keys if k not in lost] and len(got) == len(local)
    assert len(lost) == shard["samples"] == skipping.skipped


@pytest.mark.parametrize("mode", ["ignore_range", "extra"])
def test_server_ignoring_range_is_reported_as_such(s3: tuple[FaultProxy, dict[str, Any]], exported: Path,
                                                   mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy, options = s3
    shard = _shard(exported, 0)
    proxy.configure(mode, every=1, only=".tar", per_target=10**9)
    spoil = proxy.fault_for  # the shards' ranged reads only: their indexes stay intact
    monkeypatch.setattr(proxy, "fault_for", lambda method, path, headers: None if ".idx" in path
                        else spoil(method, path, headers))
    # a whole object through the proxy takes longer than FAST's 1 s under load (CI once timed out 6 times)
    patient = RetryPolicy(attempts=3, backoff_s=0.01, max_backoff_s=0.05, timeout_s=20.0)
    ds = ShardDataset(URL, "train", shuffle=False, remote=Remote(storage_options=options, retry=patient))
    start, stop = shard_offsets(exported, shard)[0], shard["bytes"] - 1024  # one request: all its samples
    with pytest.raises(ShardReadError) as info:
        next(iter(ds))
    message = str(info.value)
    what = (f"the server ignored the byte range: it returned the whole object ({shard['bytes']} bytes) for a "
            f"range of {stop - start} bytes" if mode == "ignore_range"
            else f"the server returned {stop - start + 100} bytes for a range of {stop - start} bytes")
    assert message.startswith(f"shard {shard['path']}: bytes {start}-{stop} ({stop - start} bytes) of "
                              f"s3://robots/ds/{shard['path']}: {what}")
    assert "truncated" not in message


def test_truncated_remote_object_is_reported_at_once(s3: tuple[FaultProxy, dict[str, Any]],
                                                     exported: Path) -> None:
    """A consistently short object is the shard's fault, not the network's: no retries, its size named."""
    proxy, options = s3
    proxy.configure(None)
    shard = _shard(exported, 0)
    cut = shard_offsets(exported, shard)[3] + 100
    client = moto_client(proxy)  # moto itself
    client.put_object(Bucket="robots", Key=f"cut/{shard['path']}",
                      Body=(exported / shard["path"]).read_bytes()[:cut])
    client.put_object(Bucket="robots", Key="cut/manifest.json", Body=(exported / "manifest.json").read_bytes())
    client.put_object(Bucket="robots", Key=f"cut/{shard['path']}.idx", Body=(exported / f"{shard['path']}.idx").read_bytes())
    slow = RetryPolicy(attempts=4, backoff_s=20.0)  # a retry would wait >= 10 s
    ds = ShardDataset("s3://robots/cut/", "train", shuffle=False, remote=Remote(storage_options=options, retry=slow))
    began = time.monotonic()
    with pytest.raises(ShardReadError, match=rf"shard {shard['path']}: byte {cut}: shard is truncated "
                                             rf"\(wanted bytes {shard_offsets(exported, shard)[3]}-{shard_offsets(exported, shard)[4]} of "
                                             rf"s3://robots/cut/{shard['path']}, the object has {cut} bytes; "
                                             r"permanent, not retried\)"):
        list(ds)
    assert time.monotonic() - began < 5  # no retry (and room for a loaded machine)


def test_manifest_read_is_retried_and_fails_clearly(s3: tuple[FaultProxy, dict[str, Any]]) -> None:
    from robowds.reader.manifest import ManifestError

    proxy, options = s3
    proxy.configure("reset", every=1, only="manifest.json", per_target=2)
    assert ShardDataset(URL, "train", remote=Remote(storage_options=options, retry=FAST)).counts  # third attempt succeeds
    proxy.configure("reset", every=1, only="manifest.json", per_target=10**9)
    with pytest.raises(ManifestError, match=rf"^{URL}: cannot be read: .* \(gave up after 6 attempts"):
        ShardDataset(URL, "train", remote=Remote(storage_options=options, retry=FAST))


def test_retry_policy_is_validated_and_bounded() -> None:
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        RetryPolicy(attempts=0)
    assert RetryPolicy().bound_s() == 0.5 + 1 + 2 + 4 + 5 * 60


def test_missing_object_fails_at_once_naming_it(s3: tuple[FaultProxy, dict[str, Any]], exported: Path) -> None:
    """A 404 is not transient: no retries (a 10 s backoff would show), the status and code named; a
    missing index (read before its shard) is named with the fix."""
    proxy, options = s3
    proxy.configure(None)
    shard = _shard(exported, 0)
    client = moto_client(proxy)
    client.put_object(Bucket="robots", Key="gone/manifest.json", Body=(exported / "manifest.json").read_bytes())
    slow = RetryPolicy(attempts=4, backoff_s=20.0)  # a retry would wait >= 10 s
    ds = ShardDataset("s3://robots/gone", "train", shuffle=False, remote=Remote(storage_options=options, retry=slow))
    start, stop = shard_offsets(exported, shard)[0], shard["bytes"] - 1024  # one request: all its samples
    began = time.monotonic()
    with pytest.raises(ShardReadError) as info:
        next(iter(ds))
    assert str(info.value) == (f"shard {shard['path']}: index {shard['path']}.idx is missing; fix: restore "
                               f"{shard['path']}.idx from the export it came with (export writes it next to the "
                               "shard), or export again")
    client.put_object(Bucket="robots", Key=f"gone/{shard['path']}.idx", Body=(exported / f"{shard['path']}.idx").read_bytes())
    with pytest.raises(ShardReadError) as info:
        next(iter(ds))
    assert str(info.value) == (f"shard {shard['path']}: bytes {start}-{stop} ({stop - start} bytes) of "
                               f"s3://robots/gone/{shard['path']}: "
                               "HTTP 404 NoSuchKey: The specified key does not exist. (permanent: not retried)")
    assert time.monotonic() - began < 5  # no retry (and room for a loaded machine)


def test_transient_faults_are_told_from_permanent_ones() -> None:
    import aiohttp
    from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
    from fsspec.exceptions import FSTimeoutError
    from s3fs.errors import translate_boto_error

    from robowds.reader.remote import describe, is_transient

    def client_error(status: int, code: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": f"m{status}"},
                            "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")

    def response_error(status: int) -> aiohttp.ClientResponseError:
        return aiohttp.ClientResponseError(None, (), status=status)  # type: ignore[arg-type]

    def raised_from(error: BaseException, cause: BaseException) -> BaseException:
        error.__cause__ = cause
        return error

    transient = [client_error(503, "SlowDown"), client_error(500, "InternalError"), client_error(429, "TooManyRequests"),
                 client_error(400, "RequestTimeout"), raised_from(translate_boto_error(client_error(500, "InternalError")),
                                                              client_error(500, "InternalError")),
                 aiohttp.ClientPayloadError("Response payload is not completed"),
                 aiohttp.ServerDisconnectedError(), EndpointConnectionError(endpoint_url="http://x"),
                 ReadTimeoutError(endpoint_url="http://x"), ConnectionResetError(), ConnectionRefusedError(),
                 FSTimeoutError(), TimeoutError(), response_error(502), response_error(429)]
    permanent = [client_error(404, "NoSuchKey"), client_error(403, "AccessDenied"), client_error(400, "InvalidArgument"),
                 raised_from(translate_boto_error(client_error(404, "NoSuchKey")), client_error(404, "NoSuchKey")),
                 FileNotFoundError("x"), PermissionError("x"), ValueError("x"), response_error(404)]
    assert [is_transient(e) for e in transient] == [True] * len(transient)
    assert [is_transient(e) for e in permanent] == [False] * len(permanent)
    assert describe(client_error(503, "SlowDown")) == "HTTP 503 SlowDown: m503"
    assert describe(ConnectionResetError(104, "Connection reset by peer")) == \
        "ConnectionResetError: [Errno 104] Connection reset by peer"


def test_an_object_that_failed_for_good_gets_one_attempt_until_it_reads_again(
        s3: tuple[FaultProxy, dict[str, Any]], exported: Path) -> None:
    """Skipping a dead shard must not cost each of its samples a full round of retries."""
    from robowds.reader.remote import RangeReader, RemoteReadError
    from robowds.reader.source import remote_filesystem

    proxy, options = s3
    shard = _shard(exported, 2)
    url = f"s3://robots/ds/{shard['path']}"
    data = (exported / shard["path"]).read_bytes()
    reader = RangeReader(remote_filesystem(url, options), RetryPolicy(attempts=3, backoff_s=0.0))
    spans = list(zip(shard_offsets(exported, shard), shard_offsets(exported, shard)[1:]))
    proxy.configure("503", every=1, only=shard["path"], per_target=10**9)
    with pytest.raises(RemoteReadError, match=r"gave up after 3 attempts"):
        reader.read(url, *spans[0])
    assert proxy.faults == 3
    with pytest.raises(RemoteReadError, match=r"\(1 attempt: an earlier read of this object failed"):
        reader.read(url, *spans[1])
    assert proxy.faults == 4
    proxy.configure(None)
    assert reader.read(url, *spans[2]) == data[spans[2][0]:spans[2][1]]  # it answers again: forgiven
    proxy.configure("503", every=1, only=shard["path"], per_target=10**9)
    with pytest.raises(RemoteReadError, match=r"gave up after 3 attempts"):
        reader.read(url, *spans[3])
    assert proxy.faults == 3
