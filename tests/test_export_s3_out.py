"""`robowds export STORE s3://bucket/prefix`: the export written to a real S3 server (moto on loopback,
behind the fault proxy of tests/fault_proxy.py, which counts requests and injects upload faults).

Every object must equal, byte for byte, the file of a local export of the same store and config; a run
SIGKILLed after its first upload leaves no manifest, and its re-run (with the local work folder gone)
uploads only the shards not yet recorded, to the same bytes; faults on uploads are retried or end as one
message naming the URL; an existing export is replaced only with --overwrite and only its own objects."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.reader import Remote, ShardDataset

from fault_proxy import FaultProxy, moto_client, s3_behind_proxy

pytest.importorskip("moto")
pytest.importorskip("s3fs")

# val listed (the episode robowds drew from val: 0.34 before plan 2): the counts below are of 2 train episodes
SETTINGS = ["--workers", "1", "--quiet", "--stride", "8", "--set", "shard.max_samples=8",
            "--set", "shard.min_shards=1", "--set", "exclude=[overview]", "--set", "splits.val=[ep_0000]"]
BUCKET = "robots"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("s3out") / "store"
    write_synthetic_store(root, episodes=3, seed=2)
    return root


def local_export(store: Path, out: Path, *extra: str) -> dict[str, bytes]:
    assert main(["export", str(store), str(out), *SETTINGS, *extra]) == 0
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def expected(store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Every file of the local export: relative path -> bytes (2 splits: 4 shards of 28 samples, 1 of 8)."""
    return local_export(store, tmp_path_factory.mktemp("local") / "out")


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[FaultProxy, dict[str, Any]]]:
    with s3_behind_proxy({}, bucket=BUCKET) as (proxy, options):
        yield proxy, options


@pytest.fixture()
def proxy(s3: tuple[FaultProxy, dict[str, Any]]) -> Iterator[FaultProxy]:
    s3[0].configure(None)
    yield s3[0]
    s3[0].configure(None)


def remote_tree(proxy: FaultProxy, prefix: str) -> dict[str, bytes]:
    """Every object under s3://robots/<prefix>/ (read around the proxy): relative key -> bytes."""
    client = moto_client(proxy)
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/")
            for o in page.get("Contents", [])]
    return {k[len(prefix) + 1:]: client.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in sorted(keys)}


def puts(proxy: FaultProxy, suffix: str) -> list[str]:
    with proxy.lock:
        return sorted(path for (method, path), n in proxy.requests.items() for _ in range(n)
                      if method == "PUT" and path.endswith(suffix))


def export_s3(store: Path, url: str, options: dict[str, Any], work: Path, *extra: str) -> int:
    return main(["export", str(store), url, *SETTINGS, "--storage-options", json.dumps(options),
                 "--work-dir", str(work), *extra])


@pytest.fixture(scope="module")
def same(store: Path, s3: tuple[FaultProxy, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[Path, list[str]]:
    """The export at s3://robots/same: (its --work-dir, the shard PUTs it made)."""
    proxy, options = s3
    proxy.configure(None)
    work = tmp_path_factory.mktemp("same") / "work"
    assert export_s3(store, "s3://robots/same", options, work) == 0
    return work, puts(proxy, ".tar")


def test_export_to_s3_equals_a_local_export_byte_for_byte(store: Path, expected: dict[str, bytes], proxy: FaultProxy,
                                                        s3: tuple[FaultProxy, dict[str, Any]],
                                                        same: tuple[Path, list[str]]) -> None:
    options, (work, shard_puts) = s3[1], same
    got = remote_tree(proxy, "same")
    assert sorted(got) == sorted(expected)  # no .robowds-work/ left, nothing more, nothing less
    assert {"manifest.json", "episodes.msgpack", "stats-state.msgpack", "episode-facts.msgpack",
            "train.wids.json"} <= set(got)
    assert {k for k, v in got.items() if v != expected[k]} == set()
    shards = [k for k in expected if k.endswith(".tar")]
    assert len(shards) == 5 and shard_puts == sorted(f"/robots/same/{k}" for k in shards)  # each once
    assert list(work.iterdir()) == []  # the job's local work folder is gone, DIR is kept
    proxy.configure(None)
    assert export_s3(store, "s3://robots/same", options, work) == 0  # up to date: writes only its lock
    assert sorted((m, p) for (m, p) in proxy.requests if m in ("PUT", "POST", "DELETE")) == [
        ("DELETE", "/robots/same/.robowds-lock"), ("PUT", "/robots/same/.robowds-lock")]
    # the reader trains from the URL: each split yields as many samples as its shards hold
    for split, count in (("train", 28), ("val", 8)):
        remote = [s["__key__"] for s in ShardDataset("s3://robots/same", split, shuffle=False,
                                                     remote=Remote(storage_options=options))]
        assert len(remote) == count
        manifest = json.loads(expected["manifest.json"])
        assert sum(s["samples"] for s in manifest["splits"][split]["shards"]) == count


def test_reader_reads_the_exported_url_like_the_local_folder(expected: dict[str, bytes],
                                                             s3: tuple[FaultProxy, dict[str, Any]],
                                                             same: tuple[Path, list[str]], tmp_path: Path) -> None:
    options = s3[1]
    local = tmp_path / "local"
    for rel, data in expected.items():
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(data)

    def samples(source: str) -> list[tuple[str, list[tuple[str, bytes]]]]:
        ds = ShardDataset(source, "train", seed=3, remote=Remote(storage_options=options), verify=True)
        return [(s["__key__"], sorted((k, v.tobytes() if hasattr(v, "tobytes") else repr(v).encode())
                                      for k, v in s.items())) for s in ds]
    remote = samples("s3://robots/same/manifest.json")
    assert len(remote) == 28 and remote == samples(str(local))


def kill_when(proxy: FaultProxy, prefix: str, cmd: list[str],
              landed: Callable[[list[str]], bool]) -> tuple[dict[str, bytes], list[str]]:
    """Run the CLI `cmd` with 100 ms on every request, SIGKILL it as soon as the keys under `prefix`
    satisfy `landed`; returns (every object under `prefix` once the proxy has forwarded its last
    request, the shard PUTs the killed run made)."""
    client = moto_client(proxy)
    proxy.configure(None, latency_s=0.1)  # the kill lands between two requests
    proc = subprocess.Popen([sys.executable, "-m", "robowds.export", *cmd], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])
            if landed([o["Key"][len(prefix) + 1:] for o in listed]):
                break
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode() if proc.stderr else ""  # not finished
    after_kill: dict[str, bytes] = {}
    while after_kill != (after_kill := remote_tree(proxy, prefix)):  # the proxy may still forward a request
        time.sleep(0.5)
    shard_puts = puts(proxy, ".tar")
    proxy.configure(None)
    return after_kill, shard_puts


def test_killed_runs_leave_a_complete_export_or_none_and_each_rerun_uploads_only_the_rest(
        store: Path, expected: dict[str, bytes], proxy: FaultProxy, s3: tuple[FaultProxy, dict[str, Any]],
        tmp_path: Path) -> None:
    options = s3[1]

    def command(work: str) -> list[str]:
        return [str(store), "s3://robots/kill", *SETTINGS, "--storage-options", json.dumps(options),
                "--work-dir", str(tmp_path / work)]
    shards = sorted(k for k in expected if k.endswith(".tar"))
    # killed once a first shard is uploaded
    after_kill, _ = kill_when(proxy, "kill", command("first"), lambda keys: any(k.endswith(".tar") for k in keys))
    assert "manifest.json" not in after_kill
    assert ".robowds-lock" in after_kill  # a SIGKILLed run's lock stays: the re-runs here take it over
    for rel in ("train.wids.json", ".nv-meta/split.yaml", "episodes.msgpack", "stats-state.msgpack",
                "episode-facts.msgpack"):
        assert rel not in after_kill  # published only with the manifest
    uploaded = sorted(k for k in after_kill if k.endswith(".tar"))
    assert 1 <= len(uploaded) <= 5, sorted(after_kill)  # usually 1-4; on a loaded machine all 5 may be up
    for path in uploaded:  # a shard under its final key is complete, and so is its index; both recorded
        assert after_kill[path] == expected[path] and after_kill[path + ".idx"] == expected[path + ".idx"]
        assert f".robowds-work/uploaded/{path.replace('/', '__')}.json" in after_kill
    # re-run with the local work folder lost, killed once its publish began: it uploaded only the rest
    after_kill, shard_puts = kill_when(proxy, "kill", command("second"),
                                       lambda keys: ".robowds-work/publish.json" in keys)
    assert shard_puts == sorted(f"/robots/kill/{k}" for k in shards if k not in uploaded)
    assert ".robowds-work/publish.json" in after_kill
    if "manifest.json" in after_kill:  # a manifest a reader finds lists exactly what is there
        manifest = json.loads(after_kill["manifest.json"])
        for split in manifest["splits"].values():
            for shard in split["shards"]:
                assert hashlib.sha256(after_kill[shard["path"]]).hexdigest() == shard["sha256"]
                assert hashlib.sha256(after_kill[shard["path"] + ".idx"]).hexdigest() == shard["index_sha256"]
    # the next run finishes that publish, uploading nothing again, to the bytes of a local export
    assert export_s3(store, "s3://robots/kill", options, tmp_path / "third") == 0
    assert puts(proxy, ".tar") == []
    got = remote_tree(proxy, "kill")
    assert sorted(got) == sorted(expected) and {k for k, v in got.items() if v != expected[k]} == set()


def test_transient_upload_faults_are_retried_with_a_process_pool(
        store: Path, expected: dict[str, bytes], proxy: FaultProxy, s3: tuple[FaultProxy, dict[str, Any]],
        tmp_path: Path) -> None:
    proxy.configure("reset", every=1, suffix=".tar", per_target=1)  # each shard's first PUT: connection reset
    assert export_s3(store, "s3://robots/flaky", s3[1], tmp_path / "work", "--workers", "2") == 0
    assert proxy.faults == 5
    assert len(puts(proxy, ".tar")) == 2 * 5  # each shard PUT once more
    got = remote_tree(proxy, "flaky")
    assert sorted(got) == sorted(expected) and {k for k, v in got.items() if v != expected[k]} == set()


def test_permanent_failures_are_one_message_naming_the_url(store: Path, proxy: FaultProxy,
                                                           s3: tuple[FaultProxy, dict[str, Any]], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    proxy.configure("403", every=1, suffix=".tar")
    assert export_s3(store, "s3://robots/denied", s3[1], tmp_path / "work") == 2
    err = capsys.readouterr().err
    assert "error: cannot write s3://robots/denied/train/shard-00000" in err and "access denied" in err
    assert "fix: use credentials that may list, read, write and delete objects" in err
    assert "manifest.json" not in (denied := remote_tree(proxy, "denied"))
    assert ".robowds-lock" not in denied  # released when the export failed
    proxy.configure(None)
    assert export_s3(store, "s3://nobucket/x", s3[1], tmp_path / "work") == 2
    err = capsys.readouterr().err
    assert "the bucket 'nobucket' does not exist" in err and "aws s3 mb s3://nobucket" in err
    assert "Traceback" not in err
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.setenv(name, str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    anonymous = {k: v for k, v in s3[1].items() if k not in ("key", "secret")}
    assert export_s3(store, "s3://robots/nocreds", anonymous, tmp_path / "work") == 2
    err = capsys.readouterr().err
    assert "error: cannot write s3://robots/nocreds/.robowds-lock: no credentials (NoCredentialsError" in err
    assert "fix: set AWS_ACCESS_KEY_ID" in err


def test_overwrite_replaces_only_objects_robowds_wrote(store: Path, expected: dict[str, bytes], proxy: FaultProxy,
                                                       s3: tuple[FaultProxy, dict[str, Any]], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    options, client = s3[1], moto_client(proxy)
    client.put_object(Bucket=BUCKET, Key="over/notes.txt", Body=b"mine")
    assert export_s3(store, "s3://robots/over", options, tmp_path / "work") == 2  # not empty, no export
    assert "is not empty and holds no robowds export" in capsys.readouterr().err
    client.delete_object(Bucket=BUCKET, Key="over/notes.txt")
    assert export_s3(store, "s3://robots/over", options, tmp_path / "work", "--set", "splits.val=0") == 0
    client.put_object(Bucket=BUCKET, Key="over/notes.txt", Body=b"mine")
    assert export_s3(store, "s3://robots/over", options, tmp_path / "work") == 2  # another config
    assert "pass --overwrite" in capsys.readouterr().err
    client.put_object(Bucket=BUCKET, Key="over/val/shard-000000.tar", Body=b"not ours")
    proxy.configure(None)
    assert export_s3(store, "s3://robots/over", options, tmp_path / "work", "--overwrite") == 2
    assert "in the way of the new export" in (err := capsys.readouterr().err) and "val/shard-000000.tar" in err
    assert not [p for (m, p) in proxy.requests if m == "PUT" and p.endswith(".tar")]  # refused before uploading
    client.delete_object(Bucket=BUCKET, Key="over/val/shard-000000.tar")
    assert export_s3(store, "s3://robots/over", options, tmp_path / "work", "--overwrite") == 0
    got = remote_tree(proxy, "over")
    assert got.pop("notes.txt") == b"mine"
    assert sorted(got) == sorted(expected) and {k for k, v in got.items() if v != expected[k]} == set()


def test_failed_overwrite_keeps_the_old_export_and_a_rerun_finishes_the_publish(
        store: Path, expected: dict[str, bytes], proxy: FaultProxy, s3: tuple[FaultProxy, dict[str, Any]],
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    options = s3[1]
    assert export_s3(store, "s3://robots/keep", options, tmp_path / "work", "--set", "splits.val=0") == 0
    old = remote_tree(proxy, "keep")
    assert "train/shard-000004.tar" in old  # 5 train shards: the new export has 4, so one is removed
    # a shard upload denied for good: the old export stays complete, byte for byte (new shards are staged)
    proxy.configure("403", every=1, only="/robots/keep/.robowds-work/ready/train/shard-000002.tar", method="PUT")
    assert export_s3(store, "s3://robots/keep", options, tmp_path / "work", "--overwrite") == 2
    assert "access denied" in capsys.readouterr().err
    now = remote_tree(proxy, "keep")
    assert {k: now.get(k) for k in old} == old  # what the old manifest lists (and it) untouched
    assert {k.split("/")[0] for k in set(now) - set(old)} <= {".robowds-work", "val"}  # new keys it never reads
    # the new manifest's PUT denied, after the journal: no manifest at all (never a half state) ...
    proxy.configure("403", every=1, only="/robots/keep/manifest.json", method="PUT")
    assert export_s3(store, "s3://robots/keep", options, tmp_path / "work", "--overwrite") == 2
    assert "cannot write s3://robots/keep/manifest.json: access denied" in capsys.readouterr().err
    now = remote_tree(proxy, "keep")
    assert "manifest.json" not in now and ".robowds-work/publish.json" in now
    # ... and the next run finishes that publish (uploading nothing again), to the local export's bytes
    proxy.configure(None)
    assert export_s3(store, "s3://robots/keep", options, tmp_path / "work", "--overwrite") == 0
    assert [p for (m, p) in proxy.requests if m == "PUT" and "/ready/" in p] == []
    got = remote_tree(proxy, "keep")
    assert sorted(got) == sorted(expected) and {k for k, v in got.items() if v != expected[k]} == set()


def test_partial_upload_of_another_config_is_replaced_without_overwrite(
        store: Path, expected: dict[str, bytes], proxy: FaultProxy, s3: tuple[FaultProxy, dict[str, Any]],
        tmp_path: Path) -> None:
    options = s3[1]
    # every shard uploaded, then publish's first step (the staged manifest) denied: no manifest, no journal
    proxy.configure("403", every=1, only="/robots/part/.robowds-work/ready/manifest.json", method="PUT")
    assert export_s3(store, "s3://robots/part", options, tmp_path / "work", "--set", "splits.val=0") == 2
    partial = remote_tree(proxy, "part")
    assert "manifest.json" not in partial and ".robowds-work/publish.json" not in partial
    assert "train/shard-000004.tar" in partial  # 5 train shards; this config has 4
    proxy.configure(None)
    assert export_s3(store, "s3://robots/part", options, tmp_path / "work") == 0  # its objects are robowds'
    got = remote_tree(proxy, "part")  # train/shard-000004.tar of the other config is gone
    assert sorted(got) == sorted(expected) and {k for k, v in got.items() if v != expected[k]} == set()



def test_verify_and_inspect_read_an_export_at_a_url(store: Path, s3: tuple[FaultProxy, dict[str, Any]],
                                                    same: tuple[Path, list[str]],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`verify s3://... --store` checks every shard and recomputes windows from the store, like a local
    folder; a flipped byte in one shard object is reported by name; `inspect` prints a window."""
    proxy, options = s3
    opts = ["--storage-options", json.dumps(options)]
    capsys.readouterr()
    assert main(["verify", "s3://robots/same", "--store", str(store), "--json", *opts]) == 0
    good = json.loads(capsys.readouterr().out)
    assert (good["ok"], good["shards"], good["samples"], good["recomputed"], good["failures"]) == (True, 5, 36, 36, [])  # 32 per split, at most: all 28 + 8
    client = moto_client(proxy)
    tree = remote_tree(proxy, "same")
    shard = sorted(k for k in tree if k.endswith(".tar"))[1]
    for rel, data in tree.items():
        if rel == shard:
            data = data[:1000] + bytes([data[1000] ^ 1]) + data[1001:]
        client.put_object(Bucket=BUCKET, Key=f"damaged/{rel}", Body=data)
    assert main(["verify", "s3://robots/damaged", "--json", *opts]) == 1
    bad = json.loads(capsys.readouterr().out)
    assert bad["failures"] == [f"shard {shard}: sha256 does not match the manifest"]
    assert main(["inspect", "s3://robots/same", "--split", "val", *opts]) == 0
    assert capsys.readouterr().out.startswith("key ep_")
    assert main(["verify", "s3://robots/nothing-here", *opts]) == 2
    assert "s3://robots/nothing-here has no manifest.json" in capsys.readouterr().err


def test_the_local_disk_needs_room_only_for_the_shards_in_flight(
        store: Path, s3: tuple[FaultProxy, dict[str, Any]], proxy: FaultProxy, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """OUT at a URL: each shard is deleted from the --work-dir once uploaded, and uploads are queued
    at most UPLOADS_QUEUED deep, so the disk holds at most that many shards plus the tasks' in flight.
    The space check asks for room for those only, not for the whole export (which it refused before
    on a disk smaller than the export); slow uploads hold the reduce back instead of piling up shards."""
    import threading
    from collections import namedtuple

    from robowds.export.job.remote_job import UPLOADS_QUEUED

    small = ["--set", "shard.max_samples=2"]
    local = local_export(store, tmp_path / "local", *small)
    sizes = sorted((len(v) for k, v in local.items() if k.endswith(".tar")), reverse=True)
    at_once = 1 + UPLOADS_QUEUED  # one worker: one task in flight
    assert len(sizes) >= 2 * at_once  # the whole export would need twice the room
    usage = namedtuple("usage", "total used free")
    options, work = s3[1], tmp_path / "work"
    free = sum(sizes[:at_once]) - 1
    monkeypatch.setattr("robowds.export.job.shards.shutil.disk_usage", lambda path: usage(10**12, 0, free))
    assert export_s3(store, "s3://robots/room", options, work, *small) == 2
    err = capsys.readouterr().err
    assert "writing the shards needs" in err and "Traceback" not in err, err
    free += 1
    proxy.configure(None, latency_s=0.03)  # uploads slower than the reduce
    most, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                most[0] = max(most[0], sum(1 for _ in work.rglob("*.tar")))
            except FileNotFoundError:  # the job removed a folder while rglob walked it: count again
                pass
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        assert export_s3(store, "s3://robots/room", options, work, *small) == 0
    finally:
        stop.set()
        watcher.join()
    assert remote_tree(proxy, "room") == local
    assert 0 < most[0] <= at_once, most[0]


def test_a_locked_url_is_refused_a_dead_owners_lock_is_taken_over_and_break_lock_frees_it(
        store: Path, expected: dict[str, bytes], proxy: FaultProxy, s3: tuple[FaultProxy, dict[str, Any]],
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 9 of issue 22 for an output URL: the lock object `.robowds-lock`, made by a conditional put."""
    import socket

    from robowds.export.output.out_lock import LockOwner, pid_namespace

    options, client, key = s3[1], moto_client(proxy), "locked/.robowds-lock"
    here, ns = socket.gethostname(), pid_namespace()
    elsewhere = LockOwner(4242, "gpu-7", time.time() - 3 * 3600, "pid:[1]", "a1").to_bytes()
    client.put_object(Bucket=BUCKET, Key=key, Body=elsewhere)  # a crashed export on another machine
    capsys.readouterr()
    assert export_s3(store, "s3://robots/locked", options, tmp_path / "work") == 2
    err = capsys.readouterr().err
    assert "error: another robowds export is writing s3://robots/locked (pid 4242 on host gpu-7, since " in err
    assert "(3.0 h ago)); two exports into one output would mix their shards" in err
    assert ("fix: wait for that export to finish, or export to another URL; if it is no longer running (killed, "
            "or its machine crashed), re-run with --break-lock, which deletes s3://robots/locked/.robowds-lock") in err
    assert remote_tree(proxy, "locked") == {".robowds-lock": elsewhere}  # nothing written
    live = LockOwner(os.getpid(), here, time.time(), ns, "b2").to_bytes()  # a running export on this machine
    client.put_object(Bucket=BUCKET, Key=key, Body=live)
    assert export_s3(store, "s3://robots/locked", options, tmp_path / "work") == 2
    assert f"(pid {os.getpid()} on host {here}, since " in capsys.readouterr().err
    client.put_object(Bucket=BUCKET, Key=key, Body=elsewhere)
    assert export_s3(store, "s3://robots/locked", options, tmp_path / "work", "--break-lock") == 0
    got = remote_tree(proxy, "locked")  # the lock is released with the export: nothing but the export
    assert sorted(got) == sorted(expected) and {k for k, v in got.items() if v != expected[k]} == set()
    gone = subprocess.Popen(["true"])
    gone.wait()
    client.put_object(Bucket=BUCKET, Key=key, Body=LockOwner(gone.pid, here, time.time(), ns, "c3").to_bytes())
    assert export_s3(store, "s3://robots/locked", options, tmp_path / "work") == 0  # provably dead: taken over
    assert sorted(remote_tree(proxy, "locked")) == sorted(expected)
    client.put_object(Bucket=BUCKET, Key=key, Body=b"mine")  # not robowds': never deleted
    assert export_s3(store, "s3://robots/locked", options, tmp_path / "work", "--break-lock") == 2
    assert "fix: s3://robots/locked/.robowds-lock is not a robowds lock: move it away and re-run" in \
        capsys.readouterr().err
    assert remote_tree(proxy, "locked")[".robowds-lock"] == b"mine"
    assert main(["export", str(store), str(tmp_path / "local"), *SETTINGS, "--break-lock"]) == 2
    assert "--break-lock is for an output URL" in capsys.readouterr().err


def test_ctrl_c_releases_the_lock_object(store: Path, proxy: FaultProxy, s3: tuple[FaultProxy, dict[str, Any]],
                                         tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A real SIGINT (Ctrl-C) to this process the moment the export's lock object appears (its PUT's
    answer may still be on its way): the export stops, publishes nothing, and deletes its lock."""
    import threading

    client = moto_client(proxy)  # around the proxy: sees the object as soon as moto has it
    proxy.configure(None, latency_s=0.05)  # the export has seconds of requests left when the signal lands
    fired = threading.Event()

    def interrupt() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not fired.is_set():
            if client.list_objects_v2(Bucket=BUCKET, Prefix="intr/.robowds-lock").get("KeyCount"):
                fired.set()
                os.kill(os.getpid(), signal.SIGINT)  # Python raises KeyboardInterrupt in the main thread
            time.sleep(0.005)

    watcher = threading.Thread(target=interrupt, daemon=True)
    watcher.start()
    try:
        code = export_s3(store, "s3://robots/intr", s3[1], tmp_path / "work")
    except KeyboardInterrupt:  # only if the export had already returned: the test fails, the session goes on
        code = -1
    finally:
        fired.set()
        watcher.join()
        proxy.configure(None)
    assert code == 130  # main's exit for Ctrl-C
    assert "interrupted; re-run the same command to resume" in capsys.readouterr().err
    got = remote_tree(proxy, "intr")
    assert "manifest.json" not in got and ".robowds-lock" not in got


def test_a_store_changed_during_an_export_to_a_url_leaves_nothing_there(
        proxy: FaultProxy, s3: tuple[FaultProxy, dict[str, Any]], tmp_path: Path) -> None:
    """Item 10 of issue 22 for an output URL: the shards it uploaded (read from both versions of the
    store) are deleted with its work prefix and its lock; no manifest."""
    from robowds.export.errors import UserError
    from robowds.export.job.config import load_config
    from robowds.export.job.run import run_export

    from test_out_lock import RewritesTheStore

    root = tmp_path / "store"
    write_synthetic_store(root, episodes=3, seed=2)
    config = load_config(None, ["stride=8", "shard.max_samples=8", "shard.min_shards=1", "exclude=[overview]"])
    with pytest.raises(UserError, match=f"^store {root} changed during the export"):
        run_export(root, "s3://robots/changed", config, progress=False, out_storage_options=s3[1],
                   work_dir=tmp_path / "work", executor=RewritesTheStore(table=str(root / "trajectories.parquet")))
    assert [p for (m, p) in proxy.requests if m == "PUT" and p.endswith(".tar")]  # it had uploaded shards
    assert remote_tree(proxy, "changed") == {}
    assert list((tmp_path / "work").iterdir()) == []
