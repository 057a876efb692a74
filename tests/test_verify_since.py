"""`robowds verify OUT --since GENERATION` (issue 25, item 8): after an append, only the shards the
generations after G added are read; the manifest, side files, `<split>.wids.json`, `.nv-meta/.info.json`
and the report's counts are checked in full, as plain verify does.

One export of 4 episodes plus one append of 3 (generation 2: train 2 -> 3 shards, val 2 -> 3), made
once per module; each test works on its own copy.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from robowds.export.check.verify import verify_export
from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.output.publish import wids_index
from robowds.reader.manifest import dump_manifest

SETTINGS = ["splits={train: rest, val: 0.3}", "window.duration_s=0.4", "stride=8", "shard.min_shards=2"]
OLD = ["train/shard-000000.tar", "train/shard-000001.tar", "val/shard-000000.tar", "val/shard-000001.tar"]
NEW = ["train/shard-000002.tar", "val/shard-000002.tar"]


def _export(store: Path, out: Path, *extra: str) -> None:
    assert main(["export", str(store), str(out), *[a for s in SETTINGS for a in ("--set", s)], "--quiet",
                 "--workers", "1", *extra]) == 0


@pytest.fixture(scope="module")
def appended(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`out`: an export of 4 episodes (a copy in `gen1`), then the store grown to 7 (`s7`) and appended:
    generation 2."""
    root = tmp_path_factory.mktemp("since")
    write_synthetic_store(root / "s4", episodes=4)
    write_synthetic_store(root / "s7", episodes=7)  # synth draws episode i from (seed, i): the first 4 equal
    _export(root / "s4", root / "out")
    shutil.copytree(root / "out", root / "gen1")  # as it was before the append
    _export(root / "s7", root / "out", "--append")
    return root


@pytest.fixture
def out(appended: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "out"
    shutil.copytree(appended / "out", copy)
    return copy


def _verify(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["verify", *argv, "--quiet"])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 1
    path.write_bytes(bytes(data))


def test_since_skips_a_corrupt_old_shard_and_plain_verify_names_it(out: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    manifest = json.loads((out / "manifest.json").read_bytes())  # the layout the tests name shards by:
    assert manifest["generation"] == 2
    assert [g["shards"] for g in manifest["generations"]] == [{"train": 2, "val": 2}, {"train": 3, "val": 3}]
    assert sorted(s["path"] for e in manifest["splits"].values() for s in e["shards"]) == sorted(OLD + NEW)
    new_samples = sum(s["samples"] for e in manifest["splits"].values() for s in e["shards"] if s["path"] in NEW)
    _flip(out / OLD[1], 700)  # inside the first member's bytes: size and tar headers stay as they were
    rc, text, err = _verify(capsys, str(out), "--since", "1")
    assert (rc, err) == (0, "")
    assert text == f"verified 2 of 6 shards (--since 1: 4 older shards not read), {new_samples} samples: OK\n"
    rc, text, _ = _verify(capsys, str(out))
    assert rc == 1
    assert text.startswith("verified 6 shards, 79 samples: ")
    assert f"  shard {OLD[1]}: sha256 does not match the manifest" in text.splitlines()
    assert all(OLD[1] in line for line in text.splitlines()[1:])  # no other shard named


def test_since_names_a_corrupt_new_shard(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _flip(out / NEW[1], 700)
    rc, text, _ = _verify(capsys, str(out), "--since", "1", "--json")
    doc = json.loads(text)
    assert rc == 1
    assert (doc["ok"], doc["shards"], doc["since"], doc["generation"], doc["skipped"]) == (False, 2, 1, 2, 4)
    assert f"shard {NEW[1]}: sha256 does not match the manifest" in doc["failures"]
    assert all(NEW[1] in failure for failure in doc["failures"])
    # the text output: same head and failure lines as plain verify (which finds the same problems)
    rc, since, _ = _verify(capsys, str(out), "--since", "1")
    _, plain, _ = _verify(capsys, str(out))
    assert rc == 1
    assert since.splitlines()[0] == f"verified 2 of 6 shards (--since 1: 4 older shards not read), " \
                                    f"{doc['samples']} samples: {len(doc['failures'])} problem(s)"
    assert since.splitlines()[1:] == plain.splitlines()[1:] == [f"  {f}" for f in doc["failures"]]


def test_since_never_opens_the_old_shards_and_recomputes_from_the_new(appended: Path, out: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """With the old shards and indexes gone, --since passes; with --store its windows are picked
    from the shards it read (3 per split), so none of the missing files is opened either."""
    for rel in OLD:
        (out / rel).unlink()
        (out / f"{rel}.idx").unlink()
    result = verify_export(out, store=appended / "s7", check_windows=3, progress=False, since=1)
    assert result.failures == []
    assert (result.shards, result.skipped, result.recomputed) == (2, 4, 6)
    rc, text, _ = _verify(capsys, str(out))
    assert rc == 1 and f"  shard {OLD[0]}: missing" in text


def test_since_at_a_url_reads_only_the_new_shard_objects(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`verify URL --since 1` takes the same path as a remote export (fsspec, not the local disk): the
    old shard objects are deleted, a new one damaged, and only that one is named. fsspec's in-process
    `memory://` file system keeps this fast; the S3 path of the same code is tested (moto) in
    test_export_s3_out.py."""
    import fsspec

    _flip(out / NEW[0], 700)
    fs = fsspec.filesystem("memory")
    root = f"/verify-since-{out.parent.name}/out"  # memory:// is per process: a name of this test's own
    fs.put(f"{out}/", root, recursive=True)
    try:
        for rel in OLD:
            fs.rm([f"{root}/{rel}", f"{root}/{rel}.idx"])
        rc, text, _ = _verify(capsys, f"memory:/{root}", "--since", "1")
    finally:
        fs.rm(root.rsplit("/", 1)[0], recursive=True)
    assert rc == 1
    assert text.splitlines()[0].startswith("verified 2 of 6 shards (--since 1: 4 older shards not read), ")
    assert text.splitlines()[1:] == [f"  shard {NEW[0]}: sha256 does not match the manifest"]


def test_since_still_checks_what_every_append_rewrites(appended: Path, out: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A tampered side file, a wids index that lost the new shard, a missing one, Energon's
    `.info.json` of generation 1 (stale) and a report count that does not match its split: --since 1
    names each, exactly as plain verify does. `generations` that do not describe the shards: plain
    verify names the entry, --since cannot pick shards by them and says so (exit 2)."""
    _flip(out / "episodes.msgpack", -1)
    manifest = json.loads((out / "manifest.json").read_bytes())
    stale = {**manifest["splits"]["train"], "shards": manifest["splits"]["train"]["shards"][:2]}
    (out / "train.wids.json").write_bytes(wids_index("train", stale))
    (out / "val.wids.json").unlink()
    (out / ".nv-meta" / ".info.json").write_bytes((appended / "gen1" / ".nv-meta" / ".info.json").read_bytes())
    manifest["report"]["splits"]["val"]["windows"] += 1
    (out / "manifest.json").write_bytes(dump_manifest(manifest))
    samples = manifest["splits"]["val"]["samples"]
    expected = [
        "file episodes.msgpack: sha256 does not match the manifest",
        "file train.wids.json: does not list the manifest's shards of split 'train' (paths, samples, bytes)",
        "file val.wids.json: missing",
        "file .nv-meta/.info.json: shard_counts differ from the manifest's shards for 2 shard(s), e.g. "
        "train/shard-000002.tar",
        f"manifest.json: report.splits['val'] is {{'episodes': 3, 'windows': {samples + 1}}}, the split holds "
        f"{{'episodes': 3, 'windows': {samples}}}"]
    since = verify_export(out, progress=False, since=1)
    assert since.failures == expected and (since.shards, since.skipped) == (2, 4)
    assert verify_export(out, progress=False).failures == expected
    rc, text, _ = _verify(capsys, str(out), "--since", "1")
    assert rc == 1 and text.splitlines()[1:] == [f"  {f}" for f in expected]

    manifest["generations"][0]["shards"]["val"] = 4
    (out / "manifest.json").write_bytes(dump_manifest(manifest))
    problem = ("manifest.json: generations entry 0: split 'val' shard count 4 must be an integer from 0 (the "
               "generation before) to 3 (the split's shards)")
    assert verify_export(out, progress=False).failures == [*expected, problem]
    rc, text, err = _verify(capsys, str(out), "--since", "1")
    assert (rc, text) == (2, "")
    assert err == (f"robowds verify: error: {problem}: --since cannot tell which shards the appends added\n"
                   "  fix: leave --since out to check every shard (the manifest is not as robowds wrote it: edited "
                   "or damaged)\n")


@pytest.mark.parametrize("value, message, fix", [
    ("x", "--since must be a generation number (a whole number >= 1), got 'x'",
     "e.g. --since 1 checks only the shards the appends after the first export added"),
    ("1.5", "--since must be a generation number (a whole number >= 1), got '1.5'",
     "e.g. --since 1 checks only the shards the appends after the first export added"),
    ("0", "--since must be >= 1 (generation 1 is the first export), got 0",
     "--since 1 checks only the shards the appends added; leave --since out to check every shard"),
    ("-1", "--since must be >= 1 (generation 1 is the first export), got -1",
     "--since 1 checks only the shards the appends added; leave --since out to check every shard"),
    ("3", "--since 3: the export in {out} is at generation 2 (1 is its first export, each append adds one)",
     "pass a generation from 1 to 2 (the manifest's `generations` lists them), or leave --since out to check "
     "every shard"),
], ids=["not a number", "not whole", "zero", "negative", "after the current generation"])
def test_since_argument_errors(value: str, message: str, fix: str, out: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    rc, text, err = _verify(capsys, str(out), "--since", value)
    assert (rc, text) == (2, "")
    assert err == f"robowds verify: error: {message.format(out=out)}\n  fix: {fix}\n"


def test_since_the_current_generation_or_a_manifest_without_generations(out: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """--since the current generation reads no shard, says why and exits 0 (the rest is still checked);
    a manifest written before `generations` is generation 1 with all its shards."""
    rc, text, _ = _verify(capsys, str(out), "--since", "2")
    assert (rc, text) == (0, "verified 0 of 6 shards (--since 2: 6 older shards not read; generation 2 is the "
                             "current one, nothing was appended since), 0 samples: OK\n")
    (out / "val.wids.json").unlink()
    rc, text, _ = _verify(capsys, str(out), "--since", "2")
    assert rc == 1 and text.endswith(": 1 problem(s)\n  file val.wids.json: missing\n")

    manifest = json.loads((out / "manifest.json").read_bytes())
    del manifest["generation"], manifest["generations"]
    (out / "manifest.json").write_bytes(dump_manifest(manifest))
    rc, text, _ = _verify(capsys, str(out), "--since", "1")
    assert (rc, text.splitlines()[0]) == (1, "verified 0 of 6 shards (--since 1: 6 older shards not read; "
                                             "generation 1 is the current one, nothing was appended since), "
                                             "0 samples: 1 problem(s)")
    rc, _, err = _verify(capsys, str(out), "--since", "2")
    assert rc == 2 and err.startswith(f"robowds verify: error: --since 2: the export in {out} is at generation 1 ")
