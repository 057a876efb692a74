"""`robowds export STORE s3://bucket/prefix --append` (issue 25, item 1): the append into an S3 OUT, on
the real S3 server of tests/test_export_s3_out.py (moto on loopback behind the fault proxy, its fixtures).

A store of 4 episodes is exported into S3 and the grown store (7 episodes, the first 4 the same) is
appended. No request ever writes an old shard or index object (their ETag and LastModified stay); the
appended URL equals a local append of the same stores byte for byte and holds, per split, the samples
of a full export of the grown store into S3, with its statistics and side files byte for byte. A
refused append (the URL locked, an episode changed) writes nothing. A failed append resumes as a full
export does: the re-run uploads only the shards not yet there, and a publish that failed after its
journal is finished by the next run, to the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store

from fault_proxy import FaultProxy, moto_client
from test_export_append import SETTINGS, _samples, changed_store
from test_export_s3_out import BUCKET, proxy, puts, remote_tree, s3  # noqa: F401 - fixtures: one server a module

pytest.importorskip("moto")
pytest.importorskip("s3fs")

FLAGS = ["--quiet", "--workers", "1"]


def _options(options: dict[str, Any], work: Path) -> list[str]:
    return ["--storage-options", json.dumps(options), "--work-dir", str(work)]


def _copy(proxy: FaultProxy, src: str, dst: str) -> dict[str, tuple[str, Any]]:
    """Every object under prefix `src` copied to prefix `dst` (server-side, around the proxy); returns
    the copies' `_heads`."""
    client = moto_client(proxy)
    for rel in _heads(proxy, src):
        client.copy_object(Bucket=BUCKET, Key=f"{dst}/{rel}", CopySource={"Bucket": BUCKET, "Key": f"{src}/{rel}"})
    return _heads(proxy, dst)


def _heads(proxy: FaultProxy, prefix: str) -> dict[str, tuple[str, Any]]:
    """relative key -> (ETag, LastModified) of every object under the prefix (one LIST)."""
    client = moto_client(proxy)
    return {o["Key"][len(prefix) + 1:]: (o["ETag"], o["LastModified"])
            for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])}


def _etags(tree: dict[str, bytes]) -> dict[str, str]:
    """The ETag S3 gives each file of `tree` uploaded in one PUT (every object here: they are small):
    the MD5 of its bytes, so comparing ETags compares bytes without reading the objects back."""
    return {rel: f'"{hashlib.md5(data).hexdigest()}"' for rel, data in tree.items()}


def _writes(proxy: FaultProxy) -> list[tuple[str, str]]:
    """(method, path) of every request that changes an object (a server-side copy is a PUT)."""
    with proxy.lock:
        return sorted((m, p) for (m, p) in proxy.requests if m in ("PUT", "POST", "DELETE"))


def _folder(tree: dict[str, bytes], root: Path) -> Path:
    for rel, data in tree.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _append(store: Path, url: str, options: dict[str, Any], work: Path) -> int:
    return main(["export", str(store), url, "--append", *FLAGS, *_options(options, work)])


@pytest.fixture(scope="module")
def grown(s3: tuple[FaultProxy, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Stores of 4 and 7 episodes; s3://robots/base: an export of the 4; s3://robots/full7: a full export
    of the 7; `appended`: every file (relative path -> bytes) of a local export of the 4 after a local
    append of the 7."""
    proxy, options = s3
    root = tmp_path_factory.mktemp("append_s3")
    write_synthetic_store(root / "s4", episodes=4)
    write_synthetic_store(root / "s7", episodes=7)
    settings = [a for s in SETTINGS for a in ("--set", s)]
    for store, url in (("s4", "s3://robots/base"), ("s7", "s3://robots/full7")):
        assert main(["export", str(root / store), url, *settings, *FLAGS, *_options(options, root / "work")]) == 0
    local = root / "local"
    assert main(["export", str(root / "s4"), str(local), *settings, *FLAGS]) == 0
    assert main(["export", str(root / "s7"), str(local), "--append", *FLAGS]) == 0
    appended = {p.relative_to(local).as_posix(): p.read_bytes() for p in sorted(local.rglob("*")) if p.is_file()}
    return {"s4": root / "s4", "s7": root / "s7", "appended": appended}


def test_append_into_s3_writes_only_new_objects_and_equals_a_full_export(
        grown: dict[str, Any], proxy: FaultProxy, s3: tuple[FaultProxy, dict[str, Any]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    options, work = s3[1], tmp_path / "work"
    heads = _copy(proxy, "base", "app")
    old_manifest = json.loads(moto_client(proxy).get_object(Bucket=BUCKET, Key="app/manifest.json")["Body"].read())
    proxy.configure(None)
    capsys.readouterr()
    assert _append(grown["s7"], "s3://robots/app", options, work) == 0
    assert capsys.readouterr().out.startswith("appended 3 episodes (0 rejected) -> ")
    got = remote_tree(proxy, "app")
    assert sorted(got) == sorted(grown["appended"])  # no .robowds-work/, no lock left
    assert {k for k, v in got.items() if v != grown["appended"][k]} == set()  # the local append's bytes
    old_shards = [k for k in heads if k.endswith((".tar", ".tar.idx"))]
    now = _heads(proxy, "app")
    assert old_shards and {k: now[k] for k in old_shards} == {k: heads[k] for k in old_shards}
    written = {p.split("?")[0] for _, p in _writes(proxy)}
    assert not written & {f"/robots/app/{k}" for k in old_shards}  # no PUT, copy or delete reached them
    manifest, full = json.loads(got["manifest.json"]), remote_tree(proxy, "full7")
    full_manifest = json.loads(full["manifest.json"])
    new_shards = set()
    for split, entry in manifest["splits"].items():
        before = old_manifest["splits"].get(split, {"shards": []})["shards"]
        assert entry["shards"][:len(before)] == before  # old shards first, as they were
        numbers = [int(s["path"].split("-")[-1].split(".")[0]) for s in entry["shards"]]
        assert numbers == list(range(len(numbers)))  # numbered on after the split's last
        new_shards |= {s["path"] for s in entry["shards"][len(before):]}
    assert new_shards and {k for k in got if k.endswith((".tar", ".tar.idx")) and k not in heads} == \
        new_shards | {p + ".idx" for p in new_shards}
    assert (manifest["generation"], [g["generation"] for g in manifest["generations"]]) == (2, [1, 2])
    assert manifest["stats"] == full_manifest["stats"] and manifest["schema"] == full_manifest["schema"]
    for name in ("stats-state.msgpack", "episodes.msgpack", "episode-facts.msgpack"):
        assert got[name] == full[name], name
    for key in ("episodes", "windows", "splits", "repairs"):
        assert manifest["report"][key] == full_manifest["report"][key]
    assert _samples(_folder(got, tmp_path / "got")) == _samples(_folder(full, tmp_path / "full"))
    assert list(work.iterdir()) == []  # the job's local staging is gone
    proxy.configure(None)
    assert _append(grown["s7"], "s3://robots/app", options, work) == 0  # up to date: only its lock
    assert "export is up to date" in capsys.readouterr().out
    assert _writes(proxy) == [("DELETE", "/robots/app/.robowds-lock"), ("PUT", "/robots/app/.robowds-lock")]
    assert _heads(proxy, "app") == now


def test_a_refused_append_into_s3_writes_nothing(grown: dict[str, Any], proxy: FaultProxy,
                                                 s3: tuple[FaultProxy, dict[str, Any]], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Another export holding the URL's lock (the full export's lock object), then a changed episode."""
    from robowds.export.output.out_lock import LockOwner, pid_namespace

    options, work, client = s3[1], tmp_path / "work", moto_client(proxy)
    heads = _copy(proxy, "base", "ref")
    live = LockOwner(os.getpid(), socket.gethostname(), time.time(), pid_namespace(), "b2").to_bytes()
    client.put_object(Bucket=BUCKET, Key="ref/.robowds-lock", Body=live)  # a running append on this machine
    proxy.configure(None)
    capsys.readouterr()
    assert _append(grown["s7"], "s3://robots/ref", options, work) == 2
    err = capsys.readouterr().err
    assert f"error: another robowds export is writing s3://robots/ref (pid {os.getpid()} on host " in err
    assert {k: v for k, v in _heads(proxy, "ref").items() if k != ".robowds-lock"} == heads
    assert [w for w in _writes(proxy) if w[0] != "PUT" or not w[1].endswith(".robowds-lock")] == []
    client.delete_object(Bucket=BUCKET, Key="ref/.robowds-lock")
    store = changed_store(grown["s7"], tmp_path / "s")  # one value of one row of ep_0001
    proxy.configure(None)
    assert _append(store, "s3://robots/ref", options, work) == 2
    err = capsys.readouterr().err
    assert ("error: cannot append: 1 episode(s) of the export changed or were removed from the store: "
            "ep_0001 (changed); nothing was written") in err
    assert _heads(proxy, "ref") == heads
    assert _writes(proxy) == [("DELETE", "/robots/ref/.robowds-lock"), ("PUT", "/robots/ref/.robowds-lock")]
    assert not work.exists()


def test_a_failed_append_into_s3_resumes_and_finishes_its_publish(
        grown: dict[str, Any], proxy: FaultProxy, s3: tuple[FaultProxy, dict[str, Any]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A new shard's upload denied: the old export stays whole; the re-run (its local work folder lost)
    uploads only the new shards not yet there, then its manifest's PUT is denied after the journal; the
    next run finishes that publish, uploading no shard, to the bytes of an uninterrupted append."""
    options = s3[1]
    old = _copy(proxy, "base", "res")
    appended = grown["appended"]
    new = sorted(k for k in appended if k.endswith(".tar") and k not in old)
    assert len(new) >= 2
    proxy.configure("403", every=1, only=f"/robots/res/{new[-1]}", suffix=".tar", method="PUT")
    assert _append(grown["s7"], "s3://robots/res", options, tmp_path / "w1") == 2
    assert f"cannot write s3://robots/res/{new[-1]}: access denied" in capsys.readouterr().err
    failed = _heads(proxy, "res")
    assert {k: failed.get(k) for k in old} == old  # the old export, manifest included, untouched
    uploaded = [k for k in new if k in failed]
    assert new[-1] not in uploaded
    proxy.configure("403", every=1, only="/robots/res/manifest.json", method="PUT")
    assert _append(grown["s7"], "s3://robots/res", options, tmp_path / "w2") == 2
    assert "cannot write s3://robots/res/manifest.json: access denied" in capsys.readouterr().err
    assert puts(proxy, ".tar") == [f"/robots/res/{k}" for k in new if k not in uploaded]
    after = _heads(proxy, "res")
    assert "manifest.json" not in after and ".robowds-work/publish.json" in after
    proxy.configure(None)
    assert _append(grown["s7"], "s3://robots/res", options, tmp_path / "w3") == 0
    assert puts(proxy, ".tar") == []
    assert {k: etag for k, (etag, _) in _heads(proxy, "res").items()} == _etags(appended)
