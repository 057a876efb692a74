"""Reader errors name shard and byte offset; on_error="skip" keeps the plan's accounting; nothing is
ever unpickled; pipe: URLs and escaping paths are refused; reading from S3 (moto on loopback)."""

from __future__ import annotations

import io
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from robowds.reader import Remote, ShardDataset, ShardLoader
from robowds.reader.format import encode_member, group_samples, iter_members
from robowds.reader.manifest import ManifestError
from robowds.reader.source import ShardReadError

from exports import export_synthetic
from offsets import shard_offsets


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_synthetic(tmp_path_factory.mktemp("errs"), 4, 1, "--stride", "3",
                            "--set", "shard.max_samples=30", "--set", "exclude=[overview]")


@pytest.fixture()
def copy(exported: Path, tmp_path: Path) -> Path:
    shutil.copytree(exported, tmp_path / "out")
    return tmp_path / "out"


def shard_info(out: Path, index: int = 1) -> tuple[Path, list[int], str]:
    manifest = json.loads((out / "manifest.json").read_text())
    shard = manifest["splits"]["train"]["shards"][index]
    return out / shard["path"], shard_offsets(out, shard), shard["path"]


def read_all(out: Path, **kwargs: object) -> list[str]:
    return [s["__key__"] for s in ShardDataset(out, "train", shuffle=False, **kwargs)]


def test_truncated_shard_names_shard_and_offset(copy: Path) -> None:
    path, offsets, rel = shard_info(copy)
    data = path.read_bytes()
    path.write_bytes(data[: offsets[5] + 700])  # cut inside sample 5
    with pytest.raises(ShardReadError, match=rf"shard {rel}: byte {offsets[5] + 700}: shard is truncated"):
        read_all(copy)


def test_corrupt_header_names_shard_and_offset(copy: Path) -> None:
    path, offsets, rel = shard_info(copy)
    data = bytearray(path.read_bytes())
    data[offsets[3] + 124: offsets[3] + 136] = b"zzzzzzzzzzz\0"  # size field of sample 3's first header
    path.write_bytes(bytes(data))
    with pytest.raises(ShardReadError, match=rf"{rel}: bad tar header at byte {offsets[3]}"):
        read_all(copy)


def test_sha256_mismatch_is_caught_when_verifying(copy: Path) -> None:
    path, offsets, rel = shard_info(copy)
    data = bytearray(path.read_bytes())
    data[offsets[2] + 512 + 200] ^= 0x01  # inside a member's payload: still a valid tar
    path.write_bytes(bytes(data))
    assert len(read_all(copy)) == json.loads((copy / "manifest.json").read_text())["splits"]["train"]["samples"]
    with pytest.raises(ShardReadError, match=rf"shard {rel}: byte 0: sha256 does not match"):
        read_all(copy, verify=True)


def test_skip_counts_and_keeps_the_plan(copy: Path, exported: Path) -> None:
    path, offsets, _ = shard_info(copy)
    data = bytearray(path.read_bytes())
    data[offsets[4]: offsets[4] + 512] = b"\xff" * 512  # destroy sample 4's first header
    path.write_bytes(bytes(data))
    good = ShardLoader(ShardDataset(exported, "train", seed=5), batch_size=4)
    bad = ShardLoader(ShardDataset(copy, "train", seed=5, on_error="skip"), batch_size=4)
    good_batches, bad_batches = list(good), list(bad)
    assert len(good_batches) == len(bad_batches) == len(good)
    good_keys = [k for b in good_batches for k in b["__key__"]]
    bad_keys = [k for b in bad_batches for k in b["__key__"]]
    assert bad.skipped == 1 and len(bad_keys) == len(good_keys) - 1 and set(bad_keys) < set(good_keys)
    assert bad.state_dict() == good.state_dict()  # the cursor counts planned positions, not successes


def test_pickled_npy_member_is_refused(copy: Path) -> None:
    path, offsets, rel = shard_info(copy, 0)
    data = path.read_bytes()
    key, start, members = list(group_samples(iter_members(data)))[0]
    buf = io.BytesIO()
    np.save(buf, np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    evil = encode_member(f"{key}.zzevil.npy", buf.getvalue())
    end = offsets[1]
    path.write_bytes(data[:end] + evil + data[end + len(evil):])  # overwrite the start of sample 1
    with pytest.raises(ShardReadError) as caught:
        read_all(copy)
    # the shard is named once (it was "shard X: byte N: X: byte M: ..."), with the byte of the member
    # that does not fit: the rest of sample 1, after the planted member
    assert str(caught.value).startswith(f"shard {rel}: byte {end + len(evil)}: member ")
    assert str(caught.value).count(rel) == 1


def test_pipe_urls_and_escaping_paths_are_refused(copy: Path) -> None:
    with pytest.raises(ManifestError, match="pipe: URL"):
        ShardDataset("pipe:cat /etc/passwd", "train")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["splits"]["train"]["shards"][0]["path"] = "../../etc/passwd"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="must be a plain relative path"):
        ShardDataset(copy, "train")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_reads_and_resumes_from_s3(exported: Path) -> None:
    pytest.importorskip("moto")
    boto3 = pytest.importorskip("boto3")
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        creds = {"aws_access_key_id": "test", "aws_secret_access_key": "test", "region_name": "us-east-1"}
        s3 = boto3.client("s3", endpoint_url=endpoint, **creds)
        s3.create_bucket(Bucket="robots")
        for path in exported.rglob("*"):
            if path.is_file():
                s3.upload_file(str(path), "robots", f"ds/{path.relative_to(exported).as_posix()}")
        options = {"key": "test", "secret": "test", "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
        url = "s3://robots/ds/manifest.json"
        local = ShardLoader(ShardDataset(exported, "train", seed=9), batch_size=4)
        remote = ShardLoader(ShardDataset(url, "train", seed=9, verify=True, remote=Remote(storage_options=options)),
                             batch_size=4)
        local_batches = [(b["__key__"], b["joints"].numpy().tobytes()) for b in local]
        head = []
        for i, b in enumerate(remote):
            head.append((b["__key__"], b["joints"].numpy().tobytes()))
            if i == 2:
                break
        resumed = ShardLoader(ShardDataset(url, "train", seed=9, remote=Remote(storage_options=options)), batch_size=4,
                              num_workers=2)
        resumed.load_state_dict(json.loads(json.dumps(remote.state_dict())))
        tail = [(b["__key__"], b["joints"].numpy().tobytes()) for b in resumed]
        assert head + tail == local_batches
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.parametrize("workers", [0, 2])
def test_fully_skipped_batch_keeps_step_count_order_and_cursor(copy: Path, exported: Path, workers: int) -> None:
    path, offsets, _ = shard_info(copy)
    data = bytearray(path.read_bytes())
    data[offsets[4]: offsets[4] + 512] = b"\xff" * 512
    path.write_bytes(bytes(data))
    good = ShardLoader(ShardDataset(exported, "train", seed=5), batch_size=1, num_workers=workers)
    bad = ShardLoader(ShardDataset(copy, "train", seed=5, on_error="skip"), batch_size=1, num_workers=workers)
    good_keys = [b["__key__"] for b in good]
    bad_keys, states = [], []
    for b in bad:
        bad_keys.append(b["__key__"])
        states.append(bad.state_dict()["consumed"])
    assert len(bad_keys) == len(good_keys) == len(good)  # one step per planned batch: DDP stays in step
    assert [k for k in bad_keys if k] == [k for k in good_keys if k != good_keys[bad_keys.index([])]]
    assert bad_keys.count([]) == 1 and bad.skipped == 1
    assert states[:-1] == list(range(1, len(good_keys)))  # the cursor counts planned positions


def test_rank_without_world_size_is_refused(exported: Path) -> None:
    with pytest.raises(ValueError, match="both rank and world_size"):
        ShardDataset(exported, "train", rank=1)


def test_large_samples_with_read_ahead_hints_and_a_truncated_shard(tmp_path: Path) -> None:
    from robowds.reader.format import decode_npy
    from robowds.reader.source import PREFETCH_MIN

    out = export_synthetic(tmp_path, 2, 3, "--stride", "20", "--set", "streams.imu.rate_hz=200",
                           "--set", "streams.imu.duration_s=30", "--set", "exclude=[overview]")
    manifest = json.loads((out / "manifest.json").read_text())
    shard = manifest["splits"]["train"]["shards"][0]
    data = (out / shard["path"]).read_bytes()
    direct = {k: decode_npy(m["imu.npy"]) for k, _, m in group_samples(iter_members(data))}
    assert min(np.diff(shard_offsets(out, shard))) >= PREFETCH_MIN  # every sample gets a read-ahead hint
    read = {s["__key__"]: s["imu"] for s in ShardDataset(out, "train", shuffle=False)}
    assert read.keys() == direct.keys()
    for key, imu in read.items():
        np.testing.assert_array_equal(imu, direct[key])
    cut = shard_offsets(out, shard)[2] + 5000
    (out / shard["path"]).write_bytes(data[:cut])
    with pytest.raises(ShardReadError, match=rf"shard {shard['path']}: byte {cut}: shard is truncated"):
        list(ShardDataset(out, "train", shuffle=False))
