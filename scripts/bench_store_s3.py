"""A store in object storage as export input: the real G1 data converted, uploaded to a moto S3 server
(behind tests/fault_proxy.py's proxy, which adds `--latency-ms` to every request and logs its Range),
exported from `s3://` and from the same files in a folder, in one run.

    python scripts/bench_store_s3.py                 # ~2 minutes on 2 cores
    python scripts/bench_store_s3.py --latency-ms 30 --repeats 3

What it prints per row (workers 1; the rows alternate local / s3 `--repeats` times): the export's wall
seconds, whether every output file (manifest included) is byte-identical to the local export, the
requests the proxy saw, and per video the GETs, the bytes they returned and the largest GET, against
the file's size: a video is opened twice per episode (probed, then decoded) and its blocks are kept
for the second open, so each byte crosses once. Ratios are s3 / local of the same repeat; the machine
may be shared: compare the ratios of one run.

The G1 store (tests/data/real/unitree_g1_lerobot_v2.1_real, 2 episodes of 640x480 AV1 at 30 fps) is
converted with `robowds convert lerobot`, which references the videos through `media_roots`; the copy
uploaded has the links followed and no `media_roots` (object storage has no links).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the fault proxy and the moto server the tests use

from fault_proxy import s3_behind_proxy  # noqa: E402

import benchlib  # noqa: E402

from robowds.export.cli.main import main as robowds  # noqa: E402
from robowds.export.store.location import drop_media_blocks  # noqa: E402

G1 = ROOT / "tests" / "data" / "real" / "unitree_g1_lerobot_v2.1_real"
CAMERA = "observation_images_cam_high"
EXPORT = ["--quiet", "--workers", "1", "--set", f"streams.{CAMERA}.resize=[224,224]",
          "--set", f"streams.{CAMERA}.crop=center"]


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def flat_store(work: Path) -> Path:
    """The converted G1 store with its media copied in (links followed) and no media_roots."""
    converted = work / "converted"
    assert robowds(["convert", "lerobot", str(G1), str(converted), "--workers", "1", "--quiet"]) == 0
    store = work / "g1"
    shutil.copytree(converted, store, symlinks=False)
    (store / "convert_report.json").unlink()
    yaml = store / "store.yaml"
    yaml.write_text("".join(line for line in yaml.read_text().splitlines(True) if not line.startswith("media_roots")))
    return store


def video_reads(ranges: list[tuple[str, str, str]], sizes: dict[str, int]) -> dict[str, tuple[int, int, int]]:
    """Per video path: (GETs, bytes returned, largest GET), from the proxy's request log."""
    out: dict[str, tuple[int, int, int]] = {}
    for method, path, rng in ranges:
        path = path.split("?")[0]
        if method != "GET" or not path.endswith(".mp4"):
            continue
        first, last = map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", rng).groups())
        got = min(last + 1, sizes[path]) - first  # a range past the end returns up to the end
        gets, total, largest = out.get(path, (0, 0, 0))
        out[path] = (gets + 1, total + got, max(largest, got))
    return out


def main() -> None:
    parser = benchlib.parser(__doc__, repeats=2, quick={"latency_ms": 1.0, "repeats": 1})
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added to every request (first byte)")
    args = benchlib.parse(parser)
    report = benchlib.Report("bench_store_s3", args)
    local_best, s3_best = float("inf"), float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = flat_store(work)
        sizes = {f"/robots/g1/{p.relative_to(store).as_posix()}": p.stat().st_size
                 for p in store.rglob("*") if p.is_file()}
        with s3_behind_proxy({"g1": store}) as (proxy, options):
            print(f"G1 store: {sum(sizes.values()) / 1e6:.1f} MB, latency {args.latency_ms:g} ms per request")
            for repeat in range(args.repeats):
                local = work / f"local{repeat}"
                began = time.perf_counter()
                assert robowds(["export", str(store), str(local), *EXPORT]) == 0
                local_s = time.perf_counter() - began
                proxy.configure(None, latency_s=args.latency_ms / 1000)
                remote = work / f"s3{repeat}"
                drop_media_blocks()  # workers=1 runs in this process: no blocks kept from the last repeat
                began = time.perf_counter()
                assert robowds(["export", "s3://robots/g1", str(remote), *EXPORT,
                                "--storage-options", json.dumps(options)]) == 0
                s3_s = time.perf_counter() - began
                local_best, s3_best = min(local_best, local_s), min(s3_best, s3_s)
                same = files(remote) == files(local)
                print(f"repeat {repeat}: local {local_s:.1f} s, s3 {s3_s:.1f} s ({s3_s / local_s:.2f}x), "
                      f"byte-identical: {same}, requests: {len(proxy.ranges)}")
                for path, (gets, total, largest) in sorted(video_reads(proxy.ranges, sizes).items()):
                    print(f"  {path.rsplit('/', 1)[1]}: {gets} GETs, {total} bytes of {sizes[path]} "
                          f"({total / sizes[path]:.2f}x), largest GET {largest}")
                proxy.configure(None)
    report.add("export of the G1 store from S3 (vs local)", s3_best, "s", baseline=local_best)
    report.finish()


if __name__ == "__main__":
    main()
