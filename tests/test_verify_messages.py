"""`robowds verify` names the shard, the sample key and its byte offset for every member that does
not decode, and goes on with the rest of the shard (issue 10, item 12)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robowds.export.cli.main import main
from robowds.reader.format import group_samples, iter_members

from exports import export_synthetic


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_synthetic(tmp_path_factory.mktemp("verify"), 3, 0, "--keep-order")


def damage_npy_header(out: Path, sample: int, member: str, old: bytes, new: bytes) -> tuple[str, str, int]:
    """Replace `old` by `new` (same length) in the .npy header of `member` of the shard's `sample`-th
    sample; the tar stays well-formed. Returns (shard path, key, sample offset)."""
    assert len(old) == len(new)
    shard = json.loads((out / "manifest.json").read_text())["splits"]["train"]["shards"][0]
    path = out / shard["path"]
    data = bytearray(path.read_bytes())
    key, offset, members = list(group_samples(iter_members(bytes(data))))[sample]
    at = bytes(data).index(b"\x93NUMPY", bytes(data).index(f"{key}.{member}".encode(), offset))
    header = bytes(data[at:at + 128])
    assert old in header, header
    data[at:at + 128] = header.replace(old, new, 1)
    path.write_bytes(bytes(data))
    return shard["path"], key, offset


@pytest.mark.parametrize("old, new, reason", [
    (b"'<f4'", b"'|O' ", "object arrays are refused (they would need pickle)"),
    (b"(10, 7)", b"(10, 9)", "buffer is smaller than requested size"),  # the payload holds 10 x 7
], ids=["object dtype", "shape larger than the payload"])
def test_undecodable_npy_names_shard_key_and_byte(old: bytes, new: bytes, reason: str, exported: Path,
                                                  tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil
    out = tmp_path / "copy"
    shutil.copytree(exported, out)
    shard, key, offset = damage_npy_header(out, 2, "joints.npy", old, new)
    assert main(["verify", str(out), "--quiet"]) == 1
    report = capsys.readouterr().out
    assert f"  shard {shard}: key {key} (byte {offset}): field 'joints' or its mask does not decode: " in report
    assert reason in report
    assert report.count(shard) == 2  # this line and the sha256 line, each naming the shard once
    assert "verified 8 shards, 251 samples: 2 problem(s)" in report  # the other samples were still checked
