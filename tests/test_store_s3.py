"""An episode store in object storage: `validate` and `export` read `s3://...` from a real moto server on
loopback (behind the counting proxy of fault_proxy.py) and give exactly what they give for the same
store in a folder: the same export bytes (manifest included), the same report. Media are read by range,
and the errors of a store that cannot be reached name the URL and the fix."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.store.location import StoreLocation, drop_media_blocks, media_rel, store_location
from robowds.export.store.media_paths import MediaPathError, safe_media_path

from fault_proxy import FaultProxy, moto_client, s3_behind_proxy
from videos import write_frames, write_video

pytest.importorskip("moto")
pytest.importorskip("s3fs")

BLOCK = 32768  # a small read block: the test videos (~130-160 KB of noise) take 5 ranged GETs, all kept (MEDIA_BLOCKS)
EXPORT = ["--stride", "8", "--set", "shard.max_samples=16", "--set", "shard.min_shards=1", "--quiet"]


def camera_table(root: Path, ids: list[str], durations: list[float]) -> None:
    """A `cam` video column for the synthetic store: one mp4 per episode at 10 fps over its duration
    (PyAV's mp4 muxer puts the moov index at the end, which the reader must fetch by range too)."""
    paths = []
    rng = np.random.default_rng(0)
    for ep, seconds in zip(ids, durations):
        rel = f"media/cam/{ep}.mp4"
        frames = rng.integers(0, 256, (int(seconds * 10) + 1, 96, 128, 3), dtype=np.uint8)  # [F, H, W, 3]
        write_frames(root / rel, frames, codec="mpeg4")
        paths.append({"path": rel, "fps": 10.0})
    column = pa.array(paths, type=pa.struct([("path", pa.string()), ("fps", pa.float64())]))
    pq.write_table(pa.table({"episode_id": ids, "cam": column}), root / "cameras.parquet")


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("s3store")
    summary = write_synthetic_store(base / "store", episodes=3, seed=7)
    camera_table(summary.root, list(summary.episode_ids), [4.0, 5.0, 4.5])
    escape = base / "escape"  # a table whose video path leaves the store
    escape.mkdir()
    write_video(escape / "ok.mp4", [0, 100, 200])
    column = pa.array([{"path": "../store/media/cam/ep_0000.mp4", "fps": 10.0}],
                      type=pa.struct([("path", pa.string()), ("fps", pa.float64())]))
    pq.write_table(pa.table({"episode_id": ["e"], "cam": column}), escape / "cameras.parquet")
    (escape / "store.yaml").write_text("media_roots: [/tmp]\n")
    return {"store": summary.root, "escape": escape}


@pytest.fixture(scope="module")
def s3(stores: dict[str, Path]) -> Iterator[tuple[FaultProxy, dict[str, Any]]]:
    with s3_behind_proxy(stores) as (proxy, options):
        yield proxy, {**options, "default_block_size": BLOCK}


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_export_from_s3_is_byte_identical_to_the_local_export(
        s3: tuple[FaultProxy, dict[str, Any]], stores: dict[str, Path], tmp_path: Path) -> None:
    proxy, options = s3
    local, remote = tmp_path / "local", tmp_path / "remote"
    assert main(["export", str(stores["store"]), str(local), "--workers", "1", *EXPORT]) == 0
    proxy.configure(None)
    # two worker processes: each opens its own filesystem (an s3fs event loop does not survive a fork)
    assert main(["export", "s3://robots/store/", str(remote), "--workers", "2", *EXPORT,
                 "--storage-options", json.dumps(options)]) == 0
    want, got = files(local), files(remote)
    assert sorted(got) == sorted(want) and any(name.endswith(".tar") for name in got)
    for name in want:
        assert got[name] == want[name], name  # manifest.json too: same fingerprint and source size
    manifest = json.loads(want["manifest.json"])
    assert manifest["schema"]["cam"]["kind"] == "video" and manifest["report"]["episodes"]["exported"] == 3
    # media were streamed by range, in blocks, and each block crossed the network once although a video
    # is opened twice (probed, then decoded): the blocks are kept for the next open
    sizes = {f"/robots/store/{rel}": len(data) for rel, data in files(stores["store"]).items()}
    fetched: dict[str, list[tuple[int, int]]] = {}
    for method, path, rng in proxy.ranges:
        if method == "GET" and path.split("?")[0].endswith(".mp4"):
            first, last = map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", rng).groups())
            fetched.setdefault(path.split("?")[0], []).append((first, last + 1))
    assert len(fetched) == 3
    for path, ranges in fetched.items():
        size = sizes[path]  # the last block's range may run past the end: the server stops there
        assert [(a, min(b, size)) for a, b in sorted(ranges)] == [(k, min(k + BLOCK, size))
                                                                  for k in range(0, size, BLOCK)], path


def test_validate_of_s3_store_reports_what_the_local_one_does(
        s3: tuple[FaultProxy, dict[str, Any]], stores: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, options = s3
    assert main(["validate", str(stores["store"]), "--json"]) == 0
    local = json.loads(capsys.readouterr().out)
    assert main(["validate", "s3://robots/store", "--json", "--storage-options", json.dumps(options)]) == 0
    remote = json.loads(capsys.readouterr().out)
    assert remote.pop("store") == "s3://robots/store" and local.pop("store") == str(stores["store"])
    assert remote == local
    assert local["fields"]["cam"]["rate_hz"] == {"ep_0000": 10.0, "ep_0001": 10.0, "ep_0002": 10.0}


def test_media_paths_cannot_leave_a_remote_store_and_media_roots_are_refused(
        s3: tuple[FaultProxy, dict[str, Any]], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _, options = s3
    assert main(["validate", "s3://robots/escape", "--json", "--storage-options", json.dumps(options)]) == 1
    problems = {(p["field"], p["message"]) for p in json.loads(capsys.readouterr().out)["problems"]}
    assert problems == {
        (None, "store.yaml: media_roots is for a store in a local folder; a store in object storage reads "
               "media under its own URL only (s3://robots/escape)"),
        ("cam", "media path '../store/media/cam/ep_0000.mp4' must be relative to the store and stay inside it")}
    for bad in ("../x.mp4", "a/../../x.mp4", "/etc/passwd", "s3://other/x.mp4", ""):
        with pytest.raises(ValueError):
            media_rel(bad)
    assert media_rel("./media//cam/a.mp4") == "media/cam/a.mp4"
    # a local store refuses a URL with digits in its scheme too (it used to resolve to a missing file
    # "s3:/other/x.mp4" inside the store)
    with pytest.raises(MediaPathError, match="must be relative to the store"):
        safe_media_path(tmp_path, "s3://other/x.mp4")


@pytest.mark.parametrize("case", ["no_bucket", "no_prefix", "denied", "no_server", "no_credentials"])
def test_a_store_that_cannot_be_read_is_one_error_naming_the_url_and_the_fix(
        s3: tuple[FaultProxy, dict[str, Any]], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        case: str) -> None:
    proxy, options = s3
    url = {"no_bucket": "s3://nobucket/store", "no_prefix": "s3://robots/nothing-here"}.get(case, "s3://robots/store")
    if case == "no_server":
        from fault_proxy import free_port

        options = {**options, "client_kwargs": {**options["client_kwargs"],
                                                "endpoint_url": f"http://127.0.0.1:{free_port()}"},
                   "config_kwargs": {"connect_timeout": 1, "retries": {"total_max_attempts": 1}}}
    if case == "no_credentials":  # none in the options, the environment or a config file; no metadata server
        options = {k: v for k, v in options.items() if k not in ("key", "secret")}
        for name in [n for n in os.environ if n.startswith("AWS_")]:
            monkeypatch.delenv(name)
        for name, value in (("AWS_EC2_METADATA_DISABLED", "true"), ("AWS_CONFIG_FILE", "/nonexistent"),
                            ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")):
            monkeypatch.setenv(name, value)
    proxy.configure("403" if case == "denied" else None, every=1, per_target=1000)
    try:
        code = main(["validate", url, "--storage-options", json.dumps(options)])
    finally:
        proxy.configure(None)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    first, fix = err.strip().splitlines()[0], err.strip().splitlines()[-1]
    assert url in first, err
    expected = {"no_bucket": ("not found", "check the bucket and prefix"),
                "no_prefix": ("is not a URL with objects under it", "pass the URL of the prefix"),
                "denied": ("access denied", "use credentials that may read the bucket"),
                "no_server": ("cannot be reached", "check the network and the endpoint"),
                "no_credentials": ("no credentials to read it", "set AWS_ACCESS_KEY_ID")}[case]
    assert expected[0] in first and fix.strip().startswith("fix: " + expected[1]), err


def test_store_location_parses_folders_file_urls_and_fsspec_urls(tmp_path: Path) -> None:
    assert store_location(tmp_path) == StoreLocation(str(tmp_path))
    assert store_location(f"file://{tmp_path}").path == tmp_path
    remote = store_location("s3://bucket/a/store/", {"anon": True})
    assert (remote.url, remote.storage_options, remote.local) == ("s3://bucket/a/store", {"anon": True}, False)
    assert remote.join("media/x.mp4") == "s3://bucket/a/store/media/x.mp4"
    assert store_location(remote) is remote


def test_a_video_that_cannot_be_read_fails_the_export_naming_episode_field_and_url(
        s3: tuple[FaultProxy, dict[str, Any]], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    proxy, options = s3
    drop_media_blocks()  # the validate test read these videos in this process: their blocks are kept
    proxy.configure("403", every=1, per_target=1000, suffix=".mp4")  # the tables read, every video denied
    try:
        code = main(["export", "s3://robots/store", str(tmp_path / "out"), "--workers", "1", *EXPORT,
                     "--storage-options", json.dumps(options)])
    finally:
        proxy.configure(None)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "output folder" not in err, err
    assert "3 episode(s) cannot be exported" in err, err
    for k in range(3):
        assert (f"episode 'ep_000{k}', field 'cam': video file 'media/cam/ep_000{k}.mp4': ep_000{k}.mp4 cannot be "
                f"read: s3://robots/store/media/cam/ep_000{k}.mp4: access denied (HTTP 403 AccessDenied") in err, err
    assert "fix: check the store's credentials and permissions" in err and "re-encode" not in err, err
