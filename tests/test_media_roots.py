"""Symlinked and absolute media (issue 13, item 4): confined to the store by default, with an error that
names the link and its target and offers the fix; allowed into the folders store.yaml lists under
`media_roots`, and nowhere else."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from robowds.export.cli.main import main
from robowds.export.store.validate import validate_store

from videos import camera_store, gradient_frames, write_frames


def _video(path: Path) -> Path:
    write_frames(path, gradient_frames(20, 32, 24), rate=10, codec="mpeg4")
    return path


def _linked_store(tmp_path: Path, yaml: str | None = None) -> tuple[Path, Path]:
    """A store whose media/cam.mp4 is a link to a video in a folder beside the store."""
    outside = tmp_path / "videos"
    outside.mkdir()
    target = _video(outside / "cam.mp4")
    store = tmp_path / "store"
    (store / "media").mkdir(parents=True)
    os.symlink(target, store / "media" / "cam.mp4")
    camera_store(store, {"ep0": "media/cam.mp4"})
    if yaml is not None:
        (store / "store.yaml").write_text(yaml)
    return store, target


def _export(store: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["export", str(store), str(out), "--quiet", "--workers", "1", "--set", "streams.cam.encoding=raw"])
    return code, capsys.readouterr().err


def test_a_link_out_of_the_store_is_refused_naming_link_target_and_fix(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    store, target = _linked_store(tmp_path)
    report = validate_store(store)
    (problem,) = [p for p in report.problems if p.severity == "error"]
    assert problem.message == f"media path 'media/cam.mp4' is a link whose target {target} is outside the store"
    assert (problem.episode, problem.field) == ("ep0", "cam")
    assert problem.hint.startswith("to allow it, list the folder it is in under media_roots in store.yaml")
    code, err = _export(store, tmp_path / "out", capsys)
    assert code == 2
    assert f"media path 'media/cam.mp4' is a link whose target {target} is outside the store" in err
    assert "fix: to allow it, list the folder it is in under media_roots" in err
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_media_roots_allow_the_link_and_the_windows_equal_a_copied_file(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    store, target = _linked_store(tmp_path, "media_roots: [../videos]\n")
    assert validate_store(store).exportable
    assert _export(store, tmp_path / "out", capsys)[0] == 0
    copied = tmp_path / "copied"
    (copied / "media").mkdir(parents=True)
    (copied / "media" / "cam.mp4").write_bytes(target.read_bytes())
    camera_store(copied, {"ep0": "media/cam.mp4"})
    assert _export(copied, tmp_path / "out_copied", capsys)[0] == 0
    shards = [json.loads((tmp_path / d / "manifest.json").read_text())["splits"]["train"]["shards"]
              for d in ("out", "out_copied")]
    assert [s["sha256"] for s in shards[0]] == [s["sha256"] for s in shards[1]]
    assert sum(s["samples"] for s in shards[0]) == 20


def test_absolute_paths_need_a_media_root_and_must_resolve_into_one(tmp_path: Path) -> None:
    videos = tmp_path / "videos"
    videos.mkdir()
    target = _video(videos / "cam.mp4")
    other = tmp_path / "other"
    other.mkdir()
    store = tmp_path / "store"
    store.mkdir()
    camera_store(store, {"ep0": str(target)})
    (problem,) = [p for p in validate_store(store).problems if p.severity == "error"]
    assert problem.message == f"media path {str(target)!r} is absolute, outside the store"
    (store / "store.yaml").write_text(f"media_roots: [{other}]\n")
    (problem,) = [p for p in validate_store(store).problems if p.severity == "error"]
    assert problem.message == (f"media path {str(target)!r} resolves to {target}, outside the store and every "
                               "media root")
    (store / "store.yaml").write_text(f"media_roots: [{other}, {videos}]\n")
    assert validate_store(store).exportable


def test_dot_dot_is_refused_even_with_media_roots(tmp_path: Path) -> None:
    _video(tmp_path / "cam.mp4")
    store = tmp_path / "store"
    store.mkdir()
    camera_store(store, {"ep0": "../cam.mp4"})
    (store / "store.yaml").write_text(f"media_roots: [{tmp_path}]\n")
    (problem,) = [p for p in validate_store(store).problems if p.severity == "error"]
    assert problem.message == "media path '../cam.mp4' must be relative to the store and stay inside it"


@pytest.mark.parametrize("value,message", [
    ("/data/videos", "store.yaml: media_roots must be a list of folder paths, got '/data/videos'"),
    ("[1, 2]", "store.yaml: media_roots must be a list of folder paths, got [1, 2]"),
    ("[missing_folder]", "store.yaml: media root 'missing_folder' is not a folder"),
])
def test_a_bad_media_roots_value_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str,
                                                    message: str) -> None:
    store, _ = _linked_store(tmp_path, f"media_roots: {value}\n")
    errors = [p for p in validate_store(store).problems if p.severity == "error"]
    assert errors[0].message.startswith(message), errors[0].message
    code, err = _export(store, tmp_path / "out", capsys)
    assert code == 2 and message in err and "Traceback" not in err


def test_the_store_fingerprint_follows_a_linked_media_folder(tmp_path: Path) -> None:
    """A media folder linked into the store counts like one inside it: a changed video changes the job
    id (before, `rglob` skipped linked folders and the change went unnoticed); a link loop ends."""
    from robowds.export.store.fingerprint import fingerprint

    outside = tmp_path / "videos"
    outside.mkdir()
    _video(outside / "cam.mp4")
    store = tmp_path / "store"
    store.mkdir()
    os.symlink(outside, store / "media")
    camera_store(store, {"ep0": "media/cam.mp4"})
    (store / "store.yaml").write_text("media_roots: [../videos]\n")
    before = fingerprint(store)
    write_frames(outside / "cam.mp4", gradient_frames(30, 32, 24), rate=10, codec="mpeg4")  # re-recorded
    assert fingerprint(store) != before
    os.symlink(outside, outside / "loop")  # a folder that links to itself
    assert fingerprint(store) == fingerprint(store)


def test_the_fingerprint_of_a_plain_store_is_unchanged_by_the_walk(tmp_path: Path) -> None:
    """Without links the file set and order are those of the old rglob walk (existing job ids stay)."""
    import hashlib

    from robowds.export.cli.synth import write_synthetic_store
    from robowds.export.store.declarations import STORE_YAML
    from robowds.export.store.fingerprint import fingerprint

    store = tmp_path / "s"
    write_synthetic_store(store, episodes=2, seed=0)
    digest = hashlib.sha256()
    for path in sorted(p for p in store.rglob("*") if p.is_file()):
        digest.update(path.relative_to(store).as_posix().encode() + b"\0")
        if path.suffix == ".parquet" or path.name == STORE_YAML:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        else:
            digest.update(str(path.stat().st_size).encode())
    assert fingerprint(store) == digest.hexdigest()
