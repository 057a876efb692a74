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

SETTINGS = ["splits={train: rest, val: 0.3}", "window.duration_s=0.4", "stride=8", "shard.min_shards=2"]
OLD = ["train/shard-000000.tar", "train/shard-000001.tar", "val/shard-000000.tar", "val/shard-000001.tar"]
NEW = ["train/shard-000002.tar", "val/shard-000002.tar"]


def _export(store: Path, out: Path, *extra: str) -> None:
    assert main(["export", str(store), str(out), *[a for s in SETTINGS for a in ("--set", s)], "--quiet",
                 "--workers", "1", *extra]) == 0


@pytest.fixture(scope="module")
def appended(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`out`: an export of 4 episodes, then the store grown to 7 (`s7`) and appended: generation 2."""
    root = tmp_path_factory.mktemp("since")
    write_synthetic_store(root / "s4", episodes=4)
    write_synthetic_store(root / "s7", episodes=7)  # synth draws episode i from (seed, i): the first 4 equal
    _export(root / "s4", root / "out")
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


def test_the_append_is_generation_2_with_the_expected_shards(out: Path) -> None:
    """The layout the other tests name shards by."""
    manifest = json.loads((out / "manifest.json").read_bytes())
    assert manifest["generation"] == 2
    assert [g["shards"] for g in manifest["generations"]] == [{"train": 2, "val": 2}, {"train": 3, "val": 3}]
    assert sorted(s["path"] for e in manifest["splits"].values() for s in e["shards"]) == sorted(OLD + NEW)


def test_since_skips_a_corrupt_old_shard_and_plain_verify_names_it(out: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    manifest = json.loads((out / "manifest.json").read_bytes())
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
