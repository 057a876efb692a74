"""The per-shard offset index `<shard>.tar.idx` (manifest version 2): Energon's layout, written by the
exporter next to each shard and published with it, read lazily (only when its shard is first read),
refused with one message naming shard, index and fix when it is not the one the manifest lists, and
checked by `robowds verify`."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import re
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from robowds.export.cli.main import main
from robowds.reader import ShardDataset, ShardLoader
from robowds.reader.manifest import (INDEX_SUFFIX, ShardIndexError, ShardInfo, decode_index, encode_index,
                                     parse_manifest, shards_of)
from robowds.reader.source import ShardReadError, ShardSource

from exports import export_synthetic
from offsets import downgrade_to_v1, rewrite_index, shard_offsets


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 100 samples per shard: a read-ahead window (64 samples) stays inside the first shard
    return export_synthetic(tmp_path_factory.mktemp("index"), 6, 5, "--set", "shard.max_samples=100",
                            "--set", "shard.min_shards=1")


@pytest.fixture()
def copy(exported: Path, tmp_path: Path) -> Path:
    shutil.copytree(exported, tmp_path / "out")
    return tmp_path / "out"


def entries(out: Path) -> list[dict]:
    return json.loads((out / "manifest.json").read_text())["splits"]["train"]["shards"]


def energon_index(tar_path: Path) -> bytes:
    """What Megatron-Energon's `energon prepare` writes as `<shard>.tar.idx`, computed independently
    with Python's tarfile as its preparator does: the offset of each sample's first member (a new
    base name: the name up to its first dot), then `tar.offset` after the walk (where the
    end-of-archive blocks start), each a little-endian uint64."""
    offsets, last = [], None
    with tarfile.open(tar_path, mode="r:") as tar:
        for member in tar:
            base = member.name.split(".", 1)[0]
            if member.isreg() and base != last:
                offsets.append(member.offset)
                last = base
        offsets.append(tar.offset)
    return np.asarray(offsets, dtype="<u8").tobytes()


def test_export_writes_energon_tar_indexes(exported: Path) -> None:
    """Every shard has `<shard>.tar.idx` byte-equal to Energon's, listed by sha256 in the manifest,
    which holds no per-sample data (kilobytes per shard, not bytes per sample)."""
    manifest = json.loads((exported / "manifest.json").read_text())
    assert manifest["format_version"] == 2
    shards = [s for split in manifest["splits"].values() for s in split["shards"]]
    assert len(shards) >= 3 and sum(s["samples"] for s in shards) > 300
    for entry in shards:
        assert set(entry) == {"path", "samples", "bytes", "sha256", "index_sha256"}
        data = (exported / (entry["path"] + ".idx")).read_bytes()
        assert data == energon_index(exported / entry["path"])
        assert len(data) == 8 * (entry["samples"] + 1) and hashlib.sha256(data).hexdigest() == entry["index_sha256"]
    per_shard = len(json.dumps([s for split in manifest["splits"].values() for s in split["shards"]])) / len(shards)
    assert per_shard < 300
    assert sorted(p.relative_to(exported).as_posix() for p in exported.rglob("*.idx")) == sorted(
        s["path"] + ".idx" for s in shards)


def test_indexes_are_read_lazily_one_shard_at_a_time(exported: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening the dataset reads no index; reading the first samples (unshuffled: shard 0's) reads
    shard 0's index once, and no other; a whole pass reads each index once."""
    read: list[str] = []
    original = ShardSource._read_index

    def spy(self: ShardSource, path: str, size: int) -> bytes:
        read.append(path)
        return original(self, path, size)

    monkeypatch.setattr(ShardSource, "_read_index", spy)
    ds = ShardDataset(exported, "train", shuffle=False)
    assert read == []
    first = [s["__key__"] for s in itertools.islice(iter(ds), 5)]
    assert len(first) == 5 and read == [ds.shards[0].path + INDEX_SUFFIX]
    read.clear()
    assert len(list(ShardDataset(exported, "train", seed=1))) == sum(ds.counts)
    assert sorted(read) == sorted(s.path + INDEX_SUFFIX for s in ds.shards)


def message_for(shard: dict, problem: str) -> str:
    index = shard["path"] + ".idx"
    return (f"shard {shard['path']}: index {index}{problem}; fix: restore {index} from the export it came with "
            "(export writes it next to the shard), or export again")


@pytest.mark.parametrize("damage, problem", [
    (lambda p: p.unlink(), " is missing"),
    (lambda p: p.write_bytes(p.read_bytes()[:-8]), ": sha256 does not match the manifest's index_sha256 "
                                                   "(changed, truncated or replaced since the export)"),
    (lambda p: p.write_bytes(p.read_bytes()[8:] + p.read_bytes()[:8]),
     ": sha256 does not match the manifest's index_sha256 (changed, truncated or replaced since the export)"),
])
def test_a_damaged_index_is_one_error_naming_shard_and_fix(copy: Path, exported: Path, damage, problem: str) -> None:
    """Raised when its shard is first read (not when the dataset opens); `on_error="skip"` skips
    exactly that shard's samples, with 0 and 2 DataLoader workers, and asks for the index once."""
    shard = entries(copy)[1]
    damage(copy / (shard["path"] + ".idx"))
    ds = ShardDataset(copy, "train", shuffle=False)
    with pytest.raises(ShardReadError) as info:
        list(ds)
    assert str(info.value) == message_for(shard, problem)
    good = [s["__key__"] for s in ShardDataset(exported, "train", shuffle=False)]
    first = sum(s["samples"] for s in entries(copy)[:1])
    lost = set(good[first:first + shard["samples"]])
    skipped = [s["__key__"] for s in ShardDataset(copy, "train", shuffle=False, on_error="skip")]
    assert skipped == [k for k in good if k not in lost]
    for workers in (0, 2):
        loader = ShardLoader(ShardDataset(copy, "train", seed=2, on_error="skip"), batch_size=7, num_workers=workers)
        keys = [k for b in loader for k in b["__key__"]]
        reference = [k for b in ShardLoader(ShardDataset(exported, "train", seed=2), batch_size=7) for k in b["__key__"]]
        assert keys == [k for k in reference if k not in lost] and loader.skipped == len(lost)


def test_refused_index_is_asked_once_per_source(copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shard = entries(copy)[0]
    (copy / (shard["path"] + ".idx")).write_bytes(b"\0" * 8)
    calls: list[str] = []
    original = ShardSource._read_index
    monkeypatch.setattr(ShardSource, "_read_index", lambda self, path, size: calls.append(path) or original(self, path, size))
    keys = [s["__key__"] for s in ShardDataset(copy, "train", shuffle=False, on_error="skip")]
    assert len(keys) == sum(s["samples"] for s in entries(copy)[1:])
    assert calls.count(shard["path"] + ".idx") == 1


def shard_info(samples: int, size: int, index: bytes) -> ShardInfo:
    return ShardInfo("train/s.tar", samples, size, "0" * 64, hashlib.sha256(index).hexdigest())


@pytest.mark.parametrize("entries_, size, problem", [
    ([0, 1024, 2048], 3072, None),  # two samples of two blocks; the end at 3072 - 1024
    ([0, 1024], 3072, "it holds 2 entries, the shard has 2 samples (+1 for the end)"),
    ([512, 1024, 2048], 3072, "its first entry is 512, not 0 (the first sample)"),
    ([0, 1024, 1024], 3072, "entry 2 (1024) leaves no tar header after entry 1 (1024)"),
    ([0, 1000, 2048], 3072, "entry 1 (1000) is not a multiple of 512 (tar blocks)"),
    ([0, 1024, 2560], 3072, "its last entry is 2560, the shard's samples end at 2048 ('bytes' - 1024)"),
    ([0, 2**63, 2048], 3072, "an entry is 2**63 or more"),
])
def test_decode_index_checks_its_structure(entries_: list[int], size: int, problem: str | None) -> None:
    """An index whose sha256 matches (a manifest edited to match) is still checked entry by entry."""
    data = np.asarray(entries_, dtype="<u8").tobytes()
    shard = shard_info(2, size, data)
    if problem is None:
        assert decode_index(shard, data).tolist() == entries_
        assert encode_index(entries_[:-1], entries_[-1]) == data
        return
    with pytest.raises(ShardIndexError) as info:
        decode_index(shard, data)
    assert info.value.problem == f"shard train/s.tar: index train/s.tar.idx: {problem}"
    assert info.value.fix.startswith("restore train/s.tar.idx from the export it came with")


def test_decode_index_refuses_partial_entries() -> None:
    data = b"\0" * 20
    with pytest.raises(ShardIndexError, match=r"20 bytes is not a whole number of uint64 entries"):
        decode_index(shard_info(1, 2048, data), data)


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_verify_checks_the_indexes(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Missing, changed, and consistent-but-wrong (index and its hash rewritten together) indexes are
    verify failures naming shard and index; a clean export verifies."""
    assert run_cli(["verify", str(copy), "--quiet"], capsys)[0] == 0
    shards = entries(copy)
    (copy / (shards[0]["path"] + ".idx")).unlink()
    (copy / (shards[1]["path"] + ".idx")).write_bytes(b"\1" + (copy / (shards[1]["path"] + ".idx")).read_bytes()[1:])
    doc = json.loads((copy / "manifest.json").read_text())
    original = shard_offsets(copy, shards[2])
    wrong = [*original[:2], original[2] - 512, *original[3:]]  # sample 2 one block early: a valid index
    rewrite_index(copy, doc["splits"]["train"]["shards"][2], wrong)
    (copy / "manifest.json").write_text(json.dumps(doc))
    rc, out, _ = run_cli(["verify", str(copy), "--json"], capsys)
    assert rc == 1
    failures = json.loads(out)["failures"]
    assert message_for(shards[0], " is missing") in failures
    assert message_for(shards[1], ": sha256 does not match the manifest's index_sha256 (changed, truncated or "
                                  "replaced since the export)") in failures
    pattern = rf"shard {shards[2]['path']}: sample 2 \(\S+\) at byte {original[2]}, index {shards[2]['path']}\.idx says {wrong[2]}"
    assert [f for f in failures if re.fullmatch(pattern, f)], failures
    assert len(failures) == 3, failures


def test_inspect_names_a_missing_index(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shard = entries(copy)[0]
    (copy / (shard["path"] + ".idx")).unlink()
    rc, _, err = run_cli(["inspect", str(copy), "--index", "3"], capsys)
    assert rc == 2
    assert err == (f"robowds inspect: error: shard {shard['path']}: index {shard['path']}.idx is missing\n"
                   f"  fix: restore {shard['path']}.idx from the export it came with (export writes it next to the "
                   "shard), or export again\n")


def test_reexport_over_a_v1_export_replaces_energon_indexes(exported: Path, tmp_path: Path) -> None:
    """A version 1 export next to which `energon prepare` wrote `<shard>.tar.idx` files: re-exporting
    into it replaces them with ours (they index shards being replaced) and leaves the rest alone."""
    out = tmp_path / "out"
    shutil.copytree(exported, out)
    downgrade_to_v1(out)
    for entry in entries(out):
        (out / (entry["path"] + ".idx")).write_bytes(energon_index(out / entry["path"]))
    (out / "NOTES.md").write_text("mine\n")
    store = exported.parent / "store"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--overwrite",
                 "--set", "shard.max_samples=100", "--set", "shard.min_shards=1"]) == 0
    assert json.loads((out / "manifest.json").read_text())["format_version"] == 2
    for path in exported.rglob("*"):
        if path.is_file():
            assert (out / path.relative_to(exported)).read_bytes() == path.read_bytes(), path
    assert (out / "NOTES.md").read_text() == "mine\n"


def test_manifest_of_a_large_split_stays_small() -> None:
    """10M samples in 1000 shards: the version 2 manifest is ~230 KB (two sha256s per shard) and parses in milliseconds
    (version 1 held every offset inline: ~90 MB of JSON for the same split)."""
    shard = {"samples": 10_000, "bytes": 10_000 * 1024 + 1024, "sha256": "0" * 64, "index_sha256": "1" * 64}
    doc = {"format": "robowds-manifest", "format_version": 2, "schema": {},
           "splits": {"train": {"samples": 10_000_000, "shards": [{**shard, "path": f"train/{i:06d}.tar"}
                                                                   for i in range(1000)]}}}
    text = json.dumps(doc)
    assert len(text) < 250 * 1000  # ~230 bytes per shard
    shards = shards_of(parse_manifest(text), "train")
    assert sum(s.samples for s in shards) == 10_000_000 and shards[0].offsets is None


def test_reexport_never_deletes_what_the_old_manifest_does_not_list(exported: Path, tmp_path: Path) -> None:
    """A version 1 export (its manifest lists no `.idx`) prepared with Energon's own preparator
    (`energon prepare --tar-index-only`: a `<shard>.tar.idx` per tar, the user's own tar included, and
    `.nv-meta/index.sqlite`, `index.uuid`), re-exported with fewer shards. The dropped shards are
    robowds' (listed): gone. Energon's index of each dropped shard is not listed: it stays, byte for
    byte, as do the user's tar, its index and Energon's files; the index of a shard the new export
    writes again is replaced by the new one (it described the replaced shard)."""
    energon = pytest.importorskip("megatron.energon")
    out = tmp_path / "out"
    shutil.copytree(exported, out)
    old = downgrade_to_v1(out)
    with tarfile.open(out / "train" / "mine.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for name in ("mine_a.txt", "mine_b.txt"):
            info = tarfile.TarInfo(name)
            info.size = 5
            tar.addfile(info, io.BytesIO(b"hello"))
    paths = [s["path"] for s in old["splits"]["train"]["shards"]]
    energon.BaseWebdatasetFactory.prepare_dataset(out, [*paths, "train/mine.tar"], tar_index_only=True, workers=1,
                                                  split_parts_ratio=[("train", 1.0)])
    listed = {"manifest.json", "train.wids.json", *paths, "episodes.msgpack", "stats-state.msgpack",
              "episode-facts.msgpack", "train.keys"} | {
        f".nv-meta/{n}" for n in ("dataset.yaml", "split.yaml", ".info.json")}  # the side files: listed in `files`
    unlisted = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*")
                if p.is_file() and p.relative_to(out).as_posix() not in listed}
    assert {"train/mine.tar.idx", ".nv-meta/index.sqlite", ".nv-meta/index.uuid"} <= unlisted.keys()
    assert {p + ".idx" for p in paths} <= unlisted.keys()  # the premise: Energon wrote every shard's index
    store = exported.parent / "store"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", "--overwrite", "--stride", "4",
                 "--set", "shard.max_samples=100", "--set", "shard.min_shards=1"]) == 0
    new = {s["path"] for s in json.loads((out / "manifest.json").read_text())["splits"]["train"]["shards"]}
    dropped = [p for p in paths if p not in new]
    assert dropped and not any((out / p).exists() for p in dropped)  # the premise: shards dropped, ours gone
    rewritten = {p + INDEX_SUFFIX for p in new}
    assert {rel: (out / rel).read_bytes() if (out / rel).is_file() else None for rel in unlisted
            if rel not in rewritten} == {rel: data for rel, data in unlisted.items() if rel not in rewritten}
    for rel in rewritten:
        assert (out / rel).read_bytes() == energon_index(out / rel[:-len(INDEX_SUFFIX)])
