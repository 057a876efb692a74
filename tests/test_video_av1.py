"""`encoding: av1`: per-window SVT-AV1 clips in mp4, byte-reproducible, keyframe first, decoded by
the reader. Real PyAV-encoded sources (synthetic and the real LeRobot AV1 video), real exports."""

from __future__ import annotations

import io
import json
from pathlib import Path

import av
import numpy as np
import pytest

from robowds.export.cli.main import main
from robowds.export.media.clips import encode_av1, encode_mp4, psnr
from robowds.reader.format import group_samples, iter_members
from robowds.reader.manifest import parse_manifest, shards_of

from realdata import g1_video
from videos import camera_store, decode_all, to_rgb, write_video


def _store(tmp_path: Path, size: tuple[int, int] = (64, 48)) -> Path:
    store = tmp_path / "s"
    for i in range(2):  # 40 frames at 10 fps: frame k is a flat grey (20 k) % 256
        write_video(store / "media" / f"ep{i}.mp4", [k * 100 for k in range(40)], size=size)
    return camera_store(store, {f"ep{i}": f"media/ep{i}.mp4" for i in range(2)})


def _export(store: Path, out: Path, *sets: str, workers: str = "1") -> int:
    args = ["export", str(store), str(out), "--quiet", "--workers", workers, "--stride", "4",
            "--set", "streams.cam.encoding=av1", "--set", "streams.cam.duration_s=0.5"]
    for item in sets:
        args += ["--set", item]
    return main(args)


def _clips(out: Path) -> dict[str, bytes]:
    manifest = parse_manifest((out / "manifest.json").read_bytes())
    clips = {}
    for shard in shards_of(manifest, "train"):
        for key, _, members in group_samples(iter_members((out / shard.path).read_bytes(), shard.path), shard.path):
            clips[key] = bytes(members["cam.mp4"])
    return clips


def test_av1_export_is_byte_identical_across_workers_and_keyframed(tmp_path: Path) -> None:
    store = _store(tmp_path)
    trees = []
    for workers in ("1", "2"):
        out = tmp_path / f"av1_{workers}"
        assert _export(store, out, workers=workers) == 0
        trees.append({p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()})
    assert trees[0] == trees[1]
    out = tmp_path / "av1_1"
    clips = _clips(out)
    assert len(clips) == 20  # anchors 0, 4, ..., 36 of two 40-frame episodes
    for clip in clips.values():
        with av.open(io.BytesIO(clip)) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name in ("libdav1d", "av1")
            packets = [p for p in container.demux(stream) if p.size]
            assert packets[0].is_keyframe and len(packets) == 5
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["schema"]["cam"]["codec"] == "av1" and manifest["schema"]["cam"]["member"] == "cam.mp4"
    assert manifest["report"]["video"]["cam"]["psnr_db_min"] > 35
    assert main(["verify", str(out), "--store", str(store), "--quiet"]) == 0


def test_reader_decodes_av1_windows_to_the_source_frames(tmp_path: Path) -> None:
    from robowds.reader import ShardDataset

    store = _store(tmp_path)
    out = tmp_path / "out"
    assert _export(store, out) == 0
    samples = {s["__key__"]: s for s in ShardDataset(out, "train", shuffle=False)}
    source = decode_all(store / "media" / "ep1.mp4")  # [40, 48, 64, 3]
    sample = samples["ep1_000012"]
    frames = sample["cam"]  # [5, 48, 64, 3]
    assert frames.shape == (5, 48, 64, 3) and frames.dtype == np.uint8 and sample["cam_mask"].all()
    assert psnr(frames, source[12:17]) > 35


def test_av1_odd_and_tiny_sizes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from robowds.reader import ShardDataset

    store = _store(tmp_path)
    out = tmp_path / "odd"
    assert _export(store, out, "streams.cam.crop=[33, 25]") == 0  # SVT-AV1 takes odd sizes (mpeg4 does not)
    assert next(iter(ShardDataset(out, "train")))["cam"].shape == (5, 25, 33, 3)
    assert _export(store, tmp_path / "tiny", "streams.cam.resize=[3, 8]") == 2
    err = capsys.readouterr().err
    assert "av1 encoding needs frames of at least 4x4 pixels, got 3x8" in err and "Traceback" not in err


def test_av1_on_real_decoded_frames_is_deterministic_and_smaller_than_mpeg4() -> None:
    with av.open(str(g1_video("episode_000001"))) as container:  # 20 frames at 10 Hz, scaled to 224x224
        frames = to_rgb((f for k, f in zip(range(60), container.decode(video=0)) if k % 3 == 0), 224, 224)
    clip = encode_av1(frames, 10.0)
    assert encode_av1(frames, 10.0) == clip  # the same frames, the same bytes
    with av.open(io.BytesIO(clip)) as container:
        decoded = to_rgb(container.decode(video=0))
    assert decoded.shape == (20, 224, 224, 3) and psnr(decoded, frames) > 33
    assert len(clip) < len(encode_mp4(frames, 10.0)) / 2
