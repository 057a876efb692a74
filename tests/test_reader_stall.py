"""A stalled DataLoader worker and a temporary folder too long for the workers' sockets: each is one
error that says what and where, never a bare timeout or a loader that waits forever (issue 26, items
1 and 2). Real exports, a real `ShardLoader` with 2 worker processes, a real subprocess under a long
TMPDIR."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from exports import export_synthetic
from offsets import shard_offsets
from robowds.reader import ShardDataset, ShardLoader
from robowds.reader.heartbeat import READING, Heartbeat, Pulse, WorkerStalled, describe
from robowds.reader.loader import DEFAULT_TIMEOUT_S

ROOT = Path(__file__).resolve().parent.parent
STALLED = 13  # the plan position whose sample blocks: batch 13 // 4 = 3, dealt to worker 3 % 2 = 1


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_synthetic(tmp_path_factory.mktemp("stall"), 2, 0)


class BlockOn:
    """A transform that blocks (far longer than the test) on one key, like one waiting on a file
    that never appears; every other sample passes unchanged."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, sample: dict, rng: np.random.Generator) -> dict:
        if sample["__key__"] == self.key:
            time.sleep(120)
        return sample


def where_is(out: Path, sample_id: int) -> tuple[str, int]:
    """(shard path, byte offset) of a sample id of the train split (ids run through the shards in order)."""
    for entry in json.loads((out / "manifest.json").read_text())["splits"]["train"]["shards"]:
        if sample_id < entry["samples"]:
            return str(out / entry["path"]), shard_offsets(out, entry)[sample_id]
        sample_id -= entry["samples"]
    raise AssertionError("no such sample")


def test_a_stalled_worker_is_one_error_naming_worker_shard_key_and_progress(out: Path) -> None:
    keys = [s["__key__"] for s in ShardDataset(out, "train", shuffle=False)]
    shard, offset = where_is(out, STALLED)
    ds = ShardDataset(out, "train", shuffle=False, transform=BlockOn(keys[STALLED]))
    loader = ShardLoader(ds, batch_size=4, num_workers=2, timeout=2)
    got: list[str] = []
    with pytest.raises(WorkerStalled) as caught:
        for batch in loader:
            got += batch["__key__"]
            last = time.monotonic()
    waited = time.monotonic() - last
    assert got == keys[:12]  # batches 0, 1, 2 came; batch 3 is the stalled worker's
    assert loader.state_dict()["consumed"] == 12  # the cursor resumes at the stalled batch
    message = str(caught.value)
    match = re.fullmatch(
        r"DataLoader worker 1 \(pid (\d+)\) of 2 stalled: no batch for 2 s \(ShardLoader timeout=2\): its last "
        r"progress was (\d+\.\d) s ago, when it decoded sample '(.+)' \(byte (\d+) of shard (.+)\): it is in its "
        r"transform or in collating its batch since\n  fix: find what blocks there .*"
        r"give ShardLoader a longer timeout= in seconds \(0 or None: no bound\)", message)
    assert match is not None, message
    pid, age, key, byte, path = match.groups()
    assert (key, int(byte), path) == (keys[STALLED], offset, shard)
    assert 0.0 < float(age) < 60.0
    assert isinstance(caught.value, RuntimeError)  # as torch's bare timeout error was
    assert pickle.loads(pickle.dumps(caught.value)).args == caught.value.args  # crosses processes whole
    # the loader stopped the stalled worker itself rather than torch's 5 s join of it; nothing outlives it
    assert waited < 2 + 4, waited
    assert not multiprocessing.active_children()
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid), 0)


def test_the_timeout_default_and_its_checks(out: Path) -> None:
    ds = ShardDataset(out, "train")
    assert ShardLoader(ds, batch_size=4, num_workers=2).timeout == DEFAULT_TIMEOUT_S == 480.0
    assert ShardLoader(ds, batch_size=4, num_workers=2, timeout=None).timeout == 0.0  # no bound
    assert ShardLoader(ds, batch_size=4, num_workers=0).timeout == DEFAULT_TIMEOUT_S  # not applied in-process
    assert len(list(ShardLoader(ds, batch_size=64, num_workers=0))) == len(ShardLoader(ds, batch_size=64))
    for bad in (-1, "10", True, float("nan")):
        with pytest.raises(ValueError, match=re.escape(f"timeout must be seconds >= 0 (0 or None: no bound), "
                                                       f"got {bad!r}")):
            ShardLoader(ds, batch_size=4, num_workers=2, timeout=bad)


READ_UNDER_LONG_TMPDIR = """
import sys
from robowds.reader import ShardDataset, ShardLoader
print(sum(len(b["__key__"]) for b in ShardLoader(ShardDataset(sys.argv[1], "train"), batch_size=4, num_workers=2)))
"""


def test_a_tmpdir_too_long_for_the_workers_sockets_is_one_error(out: Path, tmp_path: Path) -> None:
    """Under a 110-byte TMPDIR torch's workers cannot pass their batches (AF_UNIX paths: 107 bytes at
    most) and the loader used to wait forever: now one error up front, naming TMPDIR and the fix."""
    long = tmp_path / ("t" * (110 - len(os.fsencode(tmp_path)) - 1))
    long.mkdir()
    assert len(os.fsencode(long)) == 110
    env = {**os.environ, "TMPDIR": str(long)}
    with subprocess.Popen([sys.executable, "-c", READ_UNDER_LONG_TMPDIR, str(out)], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=60)  # a regression hangs: bounded here
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the session this test started: the child and its workers
            proc.communicate()
            raise
    assert proc.returncode == 1 and stdout == "", stderr
    last = stderr.strip().splitlines()[-2:]
    assert re.fullmatch(
        rf"robowds\.reader\.socket_dir\.TempDirTooLong: TMPDIR is 110 bytes long \({re.escape(str(long))}\): "
        rf"DataLoader workers hand each batch to the main process through an AF_UNIX socket under it "
        rf"\({re.escape(str(long))}/pymp-\w{{8}}/listener-\w{{8}}, 142 bytes\), and a socket path may have at most "
        r"107 bytes, so the batches could not cross \(the loader would wait forever\)", last[0]), stderr
    assert last[1] == ("  fix: run with a temporary folder of at most 75 bytes, e.g. `TMPDIR=/tmp python train.py`, "
                       "or read with num_workers=0")
    assert os.listdir(long) == []  # multiprocessing removed its folder at exit


def test_the_record_of_a_worker_that_has_not_finished_a_read_or_has_not_started(out: Path) -> None:
    """The other stages of a worker's record, written and read back through the shared memory: a
    read that has not returned names the shard and byte offset (the key is not known yet)."""
    ds = ShardDataset(out, "train", shuffle=False)
    heartbeat = Heartbeat(2)
    assert describe(heartbeat.read(1), ds) == ("it has not started (no heartbeat: still starting up, or stuck in "
                                               "worker_init_fn)")
    heartbeat.started(1)
    assert re.fullmatch(r"its last progress was \d+\.\d s ago, when it started: it has read no sample yet \(it is "
                        r"planning its share or opening its first shard\)", describe(heartbeat.read(1), ds))
    Pulse(heartbeat.raw, 1, 0, ds.shards).reading(ds.shards[3], 4096)
    beat = heartbeat.read(1)
    assert (beat.pid, beat.shard, beat.offset, beat.stage) == (os.getpid(), 3, 4096, READING)
    assert re.fullmatch(rf"its last progress was \d+\.\d s ago, when it started reading the sample at byte 4096 of "
                        rf"shard {re.escape(str(out / ds.shards[3].path))} \(its key not read yet\): that read or "
                        r"its decoding has not finished", describe(beat, ds))
