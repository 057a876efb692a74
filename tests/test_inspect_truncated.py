"""`robowds inspect` on a shard cut short is one error, never a partial window (issue 22 item 12).

A shard cut at a member boundary holds samples that parse but lack their last members: inspect
printed such a window (3 of its 13 fields) and exited 0. Now any shard inspect reads must have the
manifest's length; the error names the shard, its length and the first sample the cut reaches (its
key when its header is still there) and points at `robowds verify`. Nothing is printed on stdout.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path
from typing import Any, Callable

import pytest

from robowds.export.cli.main import main

from exports import export_synthetic
from offsets import shard_offsets


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_synthetic(tmp_path_factory.mktemp("inspect-cut"), 2, 0)


def first_shard(out: Path) -> dict[str, Any]:
    return json.loads((out / "manifest.json").read_text())["splits"]["train"]["shards"][0]


def member_offsets(tar_path: Path) -> list[tuple[int, str]]:
    """(header offset, name) of every member, read with the standard library's tarfile."""
    with tarfile.open(tar_path) as tar:
        return [(m.offset, m.name) for m in tar.getmembers()]


# (what is cut, inspect's extra arguments, the shard's new length, the message's tail); {k<i>} is the key
# of the shard's i-th sample, {s<i>} its offset, {m} the offset of sample 0's fourth member, {end} the
# shard's length less its two end-of-archive blocks
AFTER_0 = "sample {k0!r} at byte 0 is incomplete, and the 24 sample(s) after it are missing"
CASES = [
    ("between members of sample 0", [], lambda f: f["m"], AFTER_0),
    ("between members, by key", ["--key", "{k0}"], lambda f: f["m"], AFTER_0),
    ("inside a member of sample 3", ["--index", "3"], lambda f: f["s3"] + 1124,
     "sample {k3!r} at byte {s3} is incomplete, and the 21 sample(s) after it are missing"),
    ("at a sample boundary", ["--index", "5"], lambda f: f["s5"],
     "sample 5 at byte {s5} is missing, and the 19 sample(s) after it are missing"),
    ("the end-of-archive blocks", [], lambda f: f["end"], "its end-of-archive blocks are missing"),
]


@pytest.mark.parametrize(("argv", "cut", "tail"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_inspect_of_a_shard_cut_short_is_one_error(argv: list[str], cut: Callable[[dict[str, Any]], int], tail: str,
                                                   pristine: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    shutil.copytree(pristine, out)
    shard = first_shard(out)
    path = out / shard["path"]
    members = member_offsets(path)
    starts = shard_offsets(out, shard)  # [25]
    assert len(starts) == shard["samples"] == 25
    keys = [next(name for at, name in members if at == s).split(".", 1)[0] for s in starts]
    fill = {**{f"k{i}": k for i, k in enumerate(keys)}, **{f"s{i}": s for i, s in enumerate(starts)},
            "m": [at for at, _ in members][3], "end": shard["bytes"] - 1024}
    length = cut(fill)
    path.write_bytes(path.read_bytes()[:length])

    rc = main(["inspect", str(out), *[a.format(**fill) for a in argv]])
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""
    assert captured.err == (f"robowds inspect: error: shard {shard['path']} is cut short ({length} of "
                            f"{shard['bytes']} bytes): {tail.format(**fill)}\n"
                            f"  fix: `robowds verify {out}` checks every shard; export again to repair it\n")


def test_a_longer_shard_is_not_the_one_exported(pristine: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    shutil.copytree(pristine, out)
    shard = first_shard(out)
    with open(out / shard["path"], "ab") as f:
        f.write(b"\0" * 512)
    assert main(["inspect", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"robowds inspect: error: shard {shard['path']} is {shard['bytes'] + 512} bytes, "
                                   f"the manifest lists {shard['bytes']}: it is not the shard this export wrote\n")
