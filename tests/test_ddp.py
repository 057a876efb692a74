"""Real multi-process runs: `torchrun --nproc_per_node=2` on gloo (CPU).

1. The reader under DDP (`tests/ddp_worker.py`): every rank gets the same number of batches (one
   `all_reduce` per batch, as DDP's gradient sync does, so unequal counts would hang and hit the
   timeout), each rank's keys are exactly its part of the epoch plan in order (whatever the number of
   DataLoader workers), and across ranks:
   - `drop`, even sample count: every key of the split exactly once;
   - `pad`, odd count: every key, and exactly one key twice: the first of the epoch order (rank 0's
     first sample), repeated as rank 1's last sample to even out the ranks;
   - `drop`, odd count: every key but one, each once: the last of the epoch order, skipped this epoch.
2. `scripts/train_example.py` under DDP on the real G1 fields with their camera: a run killed two steps
   after its last checkpoint (`--max-steps`) and resumed with `--resume` redoes those steps and the
   next epoch with exactly the batches and losses of the uninterrupted run.

Every torchrun gets a free port and a timeout; on timeout the whole process group (torchrun and its
ranks) is killed, so a hang fails the test instead of blocking the suite.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
import torch

from robowds.export.cli.main import main as robowds
from robowds.export.cli.synth import write_synthetic_store
from robowds.reader.format import group_samples, iter_members
from robowds.reader.manifest import shards_of
from robowds.reader.plan import PlanSpec, epoch_order, rank_sequence

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("ddp_worker.py")
TRAIN = ROOT / "scripts" / "train_example.py"
TIMEOUT_S = 120
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script: Path, *args: str, nproc: int = 2, timeout: float = TIMEOUT_S) -> str:
    """Run `script` on `nproc` ranks; its combined output. Fails the test on non-zero exit or timeout.
    The free port can be taken by someone else before torchrun binds it: then it retries once."""
    for attempt in range(2):
        code, out = _torchrun_once(script, args, nproc, timeout)
        if code == 0 or attempt or "address already in use" not in out.lower():
            break
    assert code == 0, f"torchrun {script.name} {' '.join(args)} exited {code}:\n{out[-4000:]}"
    return out


def _torchrun_once(script: Path, args: tuple[str, ...], nproc: int, timeout: float) -> tuple[int, str]:
    """(exit code, output) of one torchrun.

    Output goes to a file, not a pipe, and on timeout the ranks are killed by pid before torchrun: the
    elastic agent starts each rank in its own session, so killing torchrun's process group alone would
    leave hung ranks behind, orphaned (and holding a pipe open)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(psutil.NoSuchProcess):
                children = psutil.Process(proc.pid).children(recursive=True)  # the ranks and their workers
                for child in children:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        child.kill()
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log.seek(0)
            pytest.fail(f"torchrun {script.name} {' '.join(args)} hung (> {timeout} s; ranks with unequal batch "
                        f"counts block in all_reduce):\n{log.read()[-4000:]}")
        log.seek(0)
        return proc.returncode, log.read()


def split_keys(out: Path, split: str = "train") -> list[str]:
    """The split's keys in sample-id order (shards in manifest order), read from the shard bytes."""
    manifest = json.loads((out / "manifest.json").read_text())
    keys: list[str] = []
    for shard in shards_of(manifest, split):
        found = [key for key, _, _ in group_samples(iter_members((out / shard.path).read_bytes(), shard.path))]
        assert len(found) == shard.samples, shard.path
        keys += found
    assert len(keys) == manifest["splits"][split]["samples"] == len(set(keys))
    return keys


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ddp") / "store"
    write_synthetic_store(root, episodes=6, seed=0)
    return root


@pytest.fixture(scope="module")
def exports(store: Path) -> dict[int, Path]:
    """{parity: export}: small exports (shards of <= 50 samples) whose train split has an even (0) / odd
    (1) sample count. Deterministic: strides are tried in a fixed order, the first of each parity wins."""
    found: dict[int, Path] = {}
    for stride in range(3, 12):
        out = store.parent / f"out-stride{stride}"
        assert robowds(["export", str(store), str(out), "--quiet", "--workers", "1", "--stride", str(stride),
                        "--set", "shard.max_samples=50"]) == 0
        n = json.loads((out / "manifest.json").read_text())["splits"]["train"]["samples"]
        found.setdefault(n % 2, out)
        if len(found) == 2:
            return found
    raise AssertionError("no stride in 3..11 gave both an even and an odd train split")


# (export parity, policy, DataLoader workers) of the three policy tests below: read in one torchrun launch
POLICY_READS = {"drop_even": (0, "drop", 2), "pad_odd": (1, "pad", 3), "drop_odd": (1, "drop", 0)}


@pytest.fixture(scope="module")
def policy_reads(exports: dict[int, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """Each of POLICY_READS read by 2 ranks (batch size 8, seed 7), checked by `check_ranks`: one torchrun
    launch for the three (ddp_worker.py --also), whose start costs more than the reads."""
    root = tmp_path_factory.mktemp("policy_reads")
    jobs = [{"out": str(exports[parity]), "outdir": str(root / name), "policy": policy, "workers": workers,
             "batch_size": 8, "seed": 7} for name, (parity, policy, workers) in POLICY_READS.items()]
    first = jobs[0]
    torchrun(WORKER, first["out"], first["outdir"], "--policy", first["policy"], "--batch-size", "8",
             "--workers", str(first["workers"]), "--seed", "7", "--also", json.dumps(jobs[1:]))
    return {name: check_ranks(Path(job["out"]), Path(job["outdir"]), job["policy"], 8, 7)
            for name, job in zip(POLICY_READS, jobs)}


def check_ranks(out: Path, results: Path, policy: str, batch_size: int, seed: int) -> list[dict]:
    """The two ranks' records of one read: each rank got the plan's order and the same batch count."""
    ranks = [json.loads((results / f"rank{r}.json").read_text()) for r in range(2)]
    keys = split_keys(out)
    manifest = json.loads((out / "manifest.json").read_text())
    spec = PlanSpec(tuple(s.samples for s in shards_of(manifest, "train")), seed=seed, policy=policy)
    per_rank = len(rank_sequence(spec, 0, 2, 0))
    for r, rec in enumerate(ranks):
        assert rec["rank"] == r and rec["dataset_world"] == [r, 2]  # taken from the process group
        assert rec["batches"] == rec["max_batches"] == rec["len"] == -(-per_rank // batch_size)
        assert rec["keys"] == [keys[i] for i in rank_sequence(spec, 0, 2, r)]  # the plan's order, any workers
        assert len(rec["keys"]) == per_rank and len(set(rec["keys"])) == per_rank
        assert rec["synced_samples"] == 2 * per_rank  # every all_reduce paired up
    return ranks


def test_drop_even_count_reads_every_key_once(exports: dict[int, Path], policy_reads: dict[str, list[dict]]) -> None:
    out = exports[0]
    ranks = policy_reads["drop_even"]
    seen = ranks[0]["keys"] + ranks[1]["keys"]
    assert len(seen) == len(set(seen))
    assert sorted(seen) == sorted(split_keys(out))


def test_pad_odd_count_repeats_exactly_the_first_key(exports: dict[int, Path],
                                                     policy_reads: dict[str, list[dict]]) -> None:
    out = exports[1]
    keys = split_keys(out)
    ranks = policy_reads["pad_odd"]
    counts = collections.Counter(ranks[0]["keys"] + ranks[1]["keys"])
    assert set(counts) == set(keys)
    repeated = [k for k, c in counts.items() if c > 1]
    assert len(repeated) == 1 and counts[repeated[0]] == 2 and sum(counts.values()) == len(keys) + 1
    # pad fills rank 1's tail with the first sample(s) of the epoch order: here exactly one
    assert repeated[0] == ranks[0]["keys"][0] == ranks[1]["keys"][-1]


def test_drop_odd_count_skips_exactly_the_last_key(exports: dict[int, Path],
                                                   policy_reads: dict[str, list[dict]]) -> None:
    out = exports[1]
    keys = split_keys(out)
    ranks = policy_reads["drop_odd"]
    seen = ranks[0]["keys"] + ranks[1]["keys"]
    assert len(seen) == len(set(seen)) == len(keys) - 1
    missing = set(keys) - set(seen)
    counts = json.loads((out / "manifest.json").read_text())["splits"]["train"]["shards"]
    last = int(epoch_order([s["samples"] for s in counts], seed=7, epoch=0)[-1])
    assert missing == {keys[last]}  # the tail of this epoch's order (a different one each epoch)


def read_log(path: Path) -> dict[int, dict]:
    return {rec["step"]: rec for rec in map(json.loads, path.read_text().splitlines())}


def test_train_example_runs_without_torchrun(exports: dict[int, Path], tmp_path: Path) -> None:
    """One process, no process group (in-process, so no RANK in the environment): the same script."""
    assert "RANK" not in os.environ
    spec = importlib.util.spec_from_file_location("train_example", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    common = ["--data", str(exports[0]), "--batch-size", "16", "--epochs", "1", "--hidden", "32"]
    assert module.main([*common, "--max-steps", "5", "--log-file", str(tmp_path / "full.jsonl")]) == 0
    ckpt = str(tmp_path / "one.pt")
    assert module.main([*common, "--checkpoint", ckpt, "--every", "2", "--max-steps", "3",
                        "--log", str(tmp_path / "a.jsonl")]) == 0
    assert module.main([*common, "--checkpoint", ckpt, "--resume", "--max-steps", "5",
                        "--log", str(tmp_path / "b.jsonl")]) == 0
    full, resumed = read_log(tmp_path / "full.jsonl"), read_log(tmp_path / "b.jsonl")
    assert sorted(full) == [1, 2, 3, 4, 5] and sorted(resumed) == [3, 4, 5]  # checkpoint at 2, kill after 3
    assert all(len(rec["first_keys"]) == 1 for rec in full.values())
    for step in resumed:
        assert resumed[step]["first_keys"] == full[step]["first_keys"]
        assert abs(resumed[step]["loss"] - full[step]["loss"]) <= 1e-6


def _train_module():
    spec = importlib.util.spec_from_file_location("train_example", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_example_normalize_and_augment_transform(tmp_path: Path) -> None:
    """`--normalize MODE` is Normalize of the observation and action fields by the split's statistics
    (exact bits); `--augment` shifts and jitters only the `--camera` fields, from the sample's generator
    (the same draws for the same generator state); `--augment` without a camera is refused."""
    import numpy as np

    from robowds.reader.transforms import Normalize

    module = _train_module()
    stats = {"s": {"q01": [-1.0, 0.0], "q99": [1.0, 4.0], "mean": [0.0, 1.0], "std": [2.0, 2.0]},
             "a": {"q01": [0.0], "q99": [2.0], "mean": [1.0], "std": [0.5]}}
    frames = np.arange(2 * 16 * 16 * 3, dtype=np.uint8).reshape(2, 16, 16, 3)  # [T, H, W, 3]
    sample = {"s": np.array([[0.5, 2.0]], np.float32), "a": np.array([[1.5], [3.0]], np.float32),
              "cam": frames, "other": frames.copy()}
    plain = module.build_transform(stats, ["s", "a"], "quantile", ["cam"], augment=False)
    out = plain(sample, np.random.default_rng(0))
    expected = Normalize(stats, mode="quantile", fields=["s", "a"])(sample)
    assert out["s"].tobytes() == expected["s"].tobytes() and out["a"].tobytes() == expected["a"].tobytes()
    assert out["a"].tolist() == [[0.5], [2.0]] and out["cam"] is frames  # 2 (x - q01) / (q99 - q01) - 1
    augment = module.build_transform(stats, ["s", "a"], "quantile", ["cam"], augment=True)
    first, again = (augment(sample, np.random.default_rng(7)) for _ in range(2))
    assert first["cam"].tobytes() == again["cam"].tobytes() != frames.tobytes()  # drawn from the generator
    assert first["other"] is sample["other"] and first["a"].tobytes() == expected["a"].tobytes()
    with pytest.raises(SystemExit):
        module.parse_args(["--data", str(tmp_path), "--augment"])


@pytest.fixture(scope="module")
def g1_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The vendored real G1 episodes (LeRobot v2.1: `state` and `action` at 30 Hz, AV1 camera) as a store,
    exported with 1 s action chunks and 3-frame 64x64 camera windows: fields named as the data names them
    (no `joints` / `actions`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from test_real_and_readme import lerobot_to_store

    from realdata import G1_EPISODES, g1_parquet, g1_video

    root = tmp_path_factory.mktemp("g1")
    store = root / "store"
    lerobot_to_store([g1_parquet(e) for e in G1_EPISODES], store)
    (store / "media").mkdir()
    for e in G1_EPISODES:
        os.symlink(g1_video(e), store / "media" / f"{e}.mp4")
    table = pq.read_table(store / "episodes.parquet")
    pq.write_table(table.append_column("cam", pa.array([f"media/{e}.mp4" for e in G1_EPISODES])),
                   store / "episodes.parquet")
    (store / "store.yaml").write_text(f"media_roots: [{g1_video(G1_EPISODES[0]).parent}]\n"
                                      "fields:\n  cam: {kind: video, fps: 30}\n")
    assert robowds(["export", str(store), str(root / "out"), "--quiet", "--workers", "2", "--fps", "10",
                    "--set", "streams.action.duration_s=1.0", "--set", "streams.action.rate_hz=10",
                    "--set", "streams.cam.rate_hz=10", "--set", "streams.cam.duration_s=0.3",
                    "--set", "streams.cam.resize=[64,64]"]) == 0
    return root / "out"


def test_train_example_resumes_exactly(g1_export: Path, tmp_path: Path) -> None:
    """`scripts/train_example.py` on the real G1 fields under torchrun (2 ranks on gloo), 2 epochs:
    `state` -> `action` chosen from the manifest (no --obs/--action), the camera through the conv
    encoder, quantile normalisation and the camera augmented per sample in the workers (`--normalize
    quantile --augment`: the draws come from (seed, epoch, key), so the resumed run draws the same).
    Killed (`--max-steps`) in epoch 1, two steps after the last checkpoint, which lies in epoch 0, and
    resumed: it redoes those steps across the epoch boundary and the rest with exactly the batches and
    losses of the uninterrupted run."""
    # --workers 2: with 0 workers, a rank stopped mid-epoch by --max-steps aborted at exit in about 1 of
    # 4 runs ("terminate called without an active exception"), a teardown defect of its own (see the
    # session note), not of the resume this test checks
    per_rank = -(-json.loads((g1_export / "manifest.json").read_text())["splits"]["train"]["samples"] // 2)
    per_epoch = -(-per_rank // 16)  # pad: ceil(n / 2) samples per rank, in batches of 16
    assert per_epoch >= 4
    saved = per_epoch - 1  # checkpoints every per_epoch - 1 steps: the last before the kill is in epoch 0
    common = ["--data", str(g1_export), "--epochs", "2", "--batch-size", "16", "--every", str(saved), "--hidden",
              "32", "--camera", "cam", "--workers", "2", "--normalize", "quantile", "--augment"]
    torchrun(TRAIN, *common, "--checkpoint", str(tmp_path / "full.pt"), "--log-file", str(tmp_path / "full.jsonl"))
    full = read_log(tmp_path / "full.jsonl")
    assert sorted(full) == list(range(1, 2 * per_epoch + 1))
    assert {rec["epoch"] for rec in full.values()} == {0, 1} and full[saved + 2]["epoch"] == 1
    ckpt = tmp_path / "killed.pt"
    killed = torchrun(TRAIN, *common, "--checkpoint", str(ckpt), "--max-steps", str(saved + 2),
                      "--log-file", str(tmp_path / "a.jsonl"))
    assert f"stopped at --max-steps {saved + 2}" in killed
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert state["step"] == saved  # the kill lost the two steps after it
    loader = json.loads(state["loader"])
    assert loader["consumed"] == saved * 16 and loader["world_size"] == 2
    first = read_log(tmp_path / "a.jsonl")
    assert sorted(first) == list(range(1, saved + 3))
    resumed_out = torchrun(TRAIN, *common, "--checkpoint", str(ckpt), "--resume",
                           "--log-file", str(tmp_path / "b.jsonl"))
    assert "resumed from" in resumed_out and f"step {saved}" in resumed_out
    resumed = read_log(tmp_path / "b.jsonl")
    assert sorted(resumed) == list(range(saved + 1, 2 * per_epoch + 1))  # redoes what followed the checkpoint
    for step, ref in full.items():
        got = (first if step <= saved + 2 else resumed)[step]
        assert got["first_keys"] == ref["first_keys"] and got["epoch"] == ref["epoch"], step
        assert abs(got["loss"] - ref["loss"]) <= 1e-6, (step, got["loss"], ref["loss"])
        if step in resumed:  # the steps done twice: identically
            assert resumed[step]["first_keys"] == ref["first_keys"]
            assert abs(resumed[step]["loss"] - ref["loss"]) <= 1e-6, step
    assert not [p.name for p in tmp_path.iterdir() if ".tmp" in p.name]  # atomic writes left no temp file


def test_train_example_names_the_fields_when_the_choice_is_not_obvious(tmp_path: Path) -> None:
    """An export without obvious observation/action names: a clear message listing the fields, no KeyError."""
    store = tmp_path / "store"
    write_synthetic_store(store, episodes=2, seed=0)
    assert robowds(["export", str(store), str(tmp_path / "out"), "--quiet", "--workers", "1",
                    "--set", "exclude=[joints, actions]"]) == 0
    done = subprocess.run([sys.executable, str(TRAIN), "--data", str(tmp_path / "out"), "--max-steps", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("train_example: pass --obs FIELD [FIELD ...] and --action FIELD; time-series "
                                  "fields: "), done.stderr
    assert "imu" in done.stderr
