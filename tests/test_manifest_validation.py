"""A malformed manifest is one ManifestError naming split, shard, key and what is wrong, for every
consumer: ShardDataset, `robowds verify`, `robowds inspect` and export's check of an existing OUT
(exit 2, one message, no traceback). It used to be a raw KeyError / IndexError / ValueError. Version 2
manifests (offsets in `<shard>.idx`, checked when read: tests/test_shard_index.py) and version 1 ones
(offsets inline, checked here) are both read."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from robowds.export.cli.main import main
from robowds.reader import ShardDataset, ShardLoader
from robowds.reader.manifest import ManifestError, parse_manifest, shards_of

from exports import export_synthetic
from offsets import downgrade_to_v1, shard_offsets

Doc = dict[str, Any]
SHARD0 = "split 'train', shard 0 (train/shard-000000.tar)"


def shard0(doc: Doc) -> Doc:
    return doc["splits"]["train"]["shards"][0]


def _set(target: Callable[[Doc], Doc], key: str, value: Any) -> Callable[[Doc], None]:
    def change(doc: Doc) -> None:
        target(doc)[key] = value
    return change


def _delete(target: Callable[[Doc], Doc], key: str) -> Callable[[Doc], None]:
    def change(doc: Doc) -> None:
        del target(doc)[key]
    return change


def _offset(index: int, value: Any) -> Callable[[Doc], None]:
    def change(doc: Doc) -> None:
        shard0(doc)["offsets"][index] = value
    return change


def _swap_offsets(doc: Doc) -> None:
    offsets = shard0(doc)["offsets"]
    offsets[1], offsets[2] = offsets[2], offsets[1]


def _more_samples(doc: Doc) -> None:
    shard0(doc)["samples"] += 1
    doc["splits"]["train"]["samples"] += 1


def _duplicate_path(doc: Doc) -> None:
    doc["splits"]["train"]["shards"][1]["path"] = shard0(doc)["path"]


def _bytes_below_last_offset(doc: Doc) -> None:
    shard = shard0(doc)
    doc["splits"]["train"]["bytes"] -= shard["bytes"] - shard["offsets"][-1]
    shard["bytes"] = shard["offsets"][-1]


def _train(doc: Doc) -> Doc:
    return doc["splits"]["train"]


def _joints(doc: Doc) -> Doc:
    return doc["schema"]["joints"]


# (case, manifest version, change, message after "<manifest path>: "); offsets of shard 0 start
# [0, 14848, 30208]: inline in version 1, in train/shard-000000.tar.idx in version 2
CASES: list[tuple[str, int, Callable[[Doc], None], str]] = [
    ("no offsets", 1, _delete(shard0, "offsets"), f"{SHARD0}: 'offsets' is missing"),
    ("no index_sha256", 2, _delete(shard0, "index_sha256"), f"{SHARD0}: 'index_sha256' is missing"),
    ("short index_sha256", 2, _set(shard0, "index_sha256", "abc"),
     f"{SHARD0}: 'index_sha256' must be 64 lowercase hex digits, got 'abc'"),
    ("index_sha256 not a string", 2, _set(shard0, "index_sha256", 7), f"{SHARD0}: 'index_sha256' must be a JSON string, got 7"),
    ("no path", 2, _delete(shard0, "path"), "split 'train', shard 0: 'path' is missing"),
    ("no sha256", 2, _delete(shard0, "sha256"), f"{SHARD0}: 'sha256' is missing"),
    ("samples > len(offsets)", 1, _more_samples, f"{SHARD0}: 'offsets' has 30 entries, 'samples' says 31"),
    ("string offset", 1, _offset(1, "14848"), f"{SHARD0}: 'offsets' must be integers, got \"14848\""),
    ("float offset", 1, _offset(1, 14848.0), f"{SHARD0}: 'offsets' must be integers, got 14848.0"),
    ("bool offset", 1, _offset(0, False), f"{SHARD0}: 'offsets' must be integers, got false"),
    ("null offset", 1, _offset(2, None), f"{SHARD0}: 'offsets' must be integers, got null"),
    ("huge offset", 1, _offset(29, 2 ** 70), f"{SHARD0}: 'offsets' must be integers below 2**63"),
    ("negative offset", 1, _offset(1, -512), f"{SHARD0}: 'offsets' must increase, offset 1 is -512 after 0"),
    ("unsorted offsets", 1, _swap_offsets, f"{SHARD0}: 'offsets' must increase, offset 2 is 14848 after 30208"),
    ("first offset not 0", 1, _offset(0, 512), f"{SHARD0}: 'offsets' must start at 0 (the first sample), got 512"),
    ("unaligned offset", 1, _offset(1, 14849), f"{SHARD0}: offset 1 (14849) is not a multiple of 512 (tar blocks)"),
    ("bytes below the last offset", 1, _bytes_below_last_offset,
     f"{SHARD0}: 'bytes' is 440320, too small for the last sample at offset 440320 "
     "(one 512-byte header and the 1024 end-of-archive bytes)"),
    ("odd bytes", 2, _set(shard0, "bytes", 456705),
     f"{SHARD0}: 'bytes' must be a multiple of 512 and >= 1024 (the end-of-archive blocks), got 456705"),
    ("samples as string", 2, _set(shard0, "samples", "30"), f"{SHARD0}: 'samples' must be an integer, got \"30\""),
    ("negative samples", 2, _set(shard0, "samples", -1), f"{SHARD0}: 'samples' must be >= 0, got -1"),
    ("offsets not a list", 1, _set(shard0, "offsets", {"0": 0}), f"{SHARD0}: 'offsets' must be a JSON list, got {{\"0\": 0}}"),
    ("short sha256", 2, _set(shard0, "sha256", "abc"), f"{SHARD0}: 'sha256' must be 64 lowercase hex digits, got 'abc'"),
    ("path escaping the root", 2, _set(shard0, "path", "../x.tar"),
     "split 'train', shard 0 (../x.tar): shard path '../x.tar' must be a plain relative path inside the dataset folder"),
    ("absolute path", 2, _set(shard0, "path", "/data/x.tar"),
     "split 'train', shard 0 (/data/x.tar): shard path '/data/x.tar' must be a plain relative path inside the dataset folder"),
    ("path listed twice", 2, _duplicate_path,
     "split 'train', shard 1: path 'train/shard-000000.tar' is already listed (split 'train')"),
    ("shard not an object", 2, lambda doc: _train(doc)["shards"].__setitem__(0, "x.tar"),
     "split 'train', shard 0: must be a JSON object, got str"),
    ("no shards", 2, _delete(_train, "shards"), "split 'train': 'shards' is missing"),
    ("split samples disagree", 2, _set(_train, "samples", 90), "split 'train': 'samples' is 90, its shards hold 91"),
    ("split bytes disagree", 2, _set(_train, "bytes", 1), "split 'train': 'bytes' is 1, its shards hold 1388544"),
    ("no schema", 2, lambda doc: doc.pop("schema"), "'schema' is missing"),
    ("schema field without member", 2, _delete(_joints, "member"), "schema field 'joints': 'member' is missing"),
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("manifests")
    # min_shards=1: shards cut by max_samples alone (4 of them), as the byte figures below were taken
    out = export_synthetic(root, 4, 1, "--stride", "3", "--set", "shard.max_samples=30", "--set", "shard.min_shards=1")
    doc = json.loads((out / "manifest.json").read_text())
    assert doc["format_version"] == 2 and "offsets" not in shard0(doc)
    offsets = shard_offsets(out, shard0(doc))
    assert offsets[:3] == [0, 14848, 30208] and shard0(doc)["bytes"] == 456704  # CASES rely on it
    assert offsets[-1] == 440320
    assert doc["splits"]["train"]["samples"] == 91 and doc["splits"]["train"]["bytes"] == 1388544
    return out


@pytest.fixture(scope="module")
def exported_v1(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same export as a version 1 export wrote it: offsets inline in the manifest, no `.idx`."""
    out = tmp_path_factory.mktemp("manifests_v1") / "out"
    shutil.copytree(exported, out)
    downgrade_to_v1(out)
    return out


def damaged(exported: Path, tmp_path: Path, change: Callable[[Doc], None]) -> Path:
    out = tmp_path / "out"
    shutil.copytree(exported, out)
    doc = json.loads((out / "manifest.json").read_text())
    change(doc)
    (out / "manifest.json").write_text(json.dumps(doc))
    return out


def export_of(version: int, request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue("exported_v1" if version == 1 else "exported")


@pytest.mark.parametrize("version, change, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_manifest_is_one_manifest_error(request: pytest.FixtureRequest, tmp_path: Path, version: int,
                                                  change: Callable[[Doc], None], message: str) -> None:
    out = damaged(export_of(version, request), tmp_path, change)
    manifest = out / "manifest.json"
    with pytest.raises(ManifestError) as info:
        ShardDataset(out, "train")
    assert str(info.value) == f"{manifest}: {message}"


@pytest.mark.parametrize("version, change, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_manifest_in_the_cli(request: pytest.FixtureRequest, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str], version: int,
                                       change: Callable[[Doc], None], message: str) -> None:
    out = damaged(export_of(version, request), tmp_path, change)
    manifest = out / "manifest.json"
    assert main(["verify", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == (f"robowds verify: error: {manifest}: {message}\n  fix: the manifest is not as robowds wrote it "
                   "(edited or damaged): export again into a new folder\n")
    assert main(["inspect", str(out)]) == 2
    assert capsys.readouterr().err == (f"robowds inspect: error: {manifest}: {message}\n  fix: the manifest is not as "
                                       "robowds wrote it (edited or damaged): export again into a new folder\n")


def test_export_over_a_malformed_manifest_is_refused(exported: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Export's check of what OUT holds reads the manifest through the same validation."""
    out = damaged(exported, tmp_path, _delete(shard0, "index_sha256"))
    store = exported.parent / "store"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--stride", "3",
                 "--set", "shard.max_samples=30", "--set", "shard.min_shards=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"robowds export: error: {out / 'manifest.json'}: {SHARD0}: 'index_sha256' is missing: "
                          "robowds replaces only an export it wrote and can read\n  fix: ")
    assert err.count("error:") == 1 and "Traceback" not in err


def test_large_manifest_validates_in_numpy_time() -> None:
    """10M samples in 1000 shards: validation is one numpy pass per shard (measured ~0.15 s here, of a
    load dominated by json.loads); the bound only catches a per-sample Python loop creeping back."""
    per_shard = 10_000
    offsets = list(range(0, per_shard * 1024, 1024))  # [10000] two blocks per sample
    shard = {"samples": per_shard, "bytes": per_shard * 1024 + 1024, "sha256": "0" * 64, "offsets": offsets}
    shards = [{**shard, "path": f"train/{i:06d}.tar"} for i in range(1000)]
    doc = {"format": "robowds-manifest", "format_version": 1, "schema": {},
           "splits": {"train": {"samples": per_shard * 1000, "shards": shards}}}
    text = json.dumps(doc)
    began = time.process_time()
    parsed = parse_manifest(text)
    total = time.process_time() - began
    assert sum(len(s.offsets) for s in shards_of(parsed, "train")) == 10_000_000
    assert total < 30, total


@pytest.mark.parametrize("version", [4, 0, True, "2", None])
def test_unknown_format_version_is_refused(exported: Path, tmp_path: Path, version: object) -> None:
    out = damaged(exported, tmp_path, _set(lambda doc: doc, "format_version", version))
    with pytest.raises(ManifestError) as info:
        ShardDataset(out, "train")
    assert str(info.value) == (f"{out / 'manifest.json'} has format_version {version!r}; this robowds reads "
                               "versions 1, 2, 3")


def test_version_1_export_reads_verifies_and_inspects(exported: Path, exported_v1: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A version 1 export (offsets inline, no `.idx` files) reads exactly as the version 2 export of
    the same shards, sample by sample, and passes verify; inspect finds a window by index."""
    doc = json.loads((exported_v1 / "manifest.json").read_text())
    assert doc["format_version"] == 1 and not list(exported_v1.rglob("*.idx"))
    for workers in (0, 2):
        keys = [[k for k in b["__key__"]] for b in ShardLoader(ShardDataset(exported_v1, "train", seed=4),
                                                               batch_size=5, num_workers=workers)]
        assert keys == [[k for k in b["__key__"]] for b in ShardLoader(ShardDataset(exported, "train", seed=4),
                                                                       batch_size=5)]
    assert main(["verify", str(exported_v1), "--quiet"]) == 0
    assert main(["inspect", str(exported_v1), "--index", "40"]) == 0
    assert "key " in capsys.readouterr().out
