"""One export at a time into an OUT folder (issue 22 item 9), and no publish when the store changed
during the export (item 10).

Before, two exports into one OUT at once (different seeds) both wrote `.robowds-work/` and both
published: `verify` then rejected the mix ("key ... is not unique") while one of them exited 0. And
a store rewritten while the job read it gave windows of the new data under a manifest naming the old
fingerprint. Real exports, real files, a real second `robowds export` process; no mocks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.errors import UserError
from robowds.export.executors.executor import ExecutorChoice, InlineExecutor
from robowds.export.job.config import load_config
from robowds.export.job.run import run_export
from robowds.export.output.out_lock import LOCK_NAME, LockOwner, OutLock
from robowds.export.store.fingerprint import fingerprint

T = TypeVar("T")
R = TypeVar("R")
SETTINGS = ["--quiet", "--stride", "8", "--set", "shard.max_samples=8", "--set", "shard.min_shards=1",
            "--set", "exclude=[overview]"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lock") / "store"
    write_synthetic_store(root, episodes=3, seed=2)
    return root


def export(store: Path, out: Path, seed: int, *extra: str) -> int:
    return main(["export", str(store), str(out), *SETTINGS, "--workers", "1", "--seed", str(seed), *extra])


def tree(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_an_export_into_a_locked_folder_is_refused_naming_the_holder(store: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    with OutLock(out):  # held here as a running export holds it (another open file description)
        assert (out / LOCK_NAME).is_file()
        owner = LockOwner.parse((out / LOCK_NAME).read_bytes())
        assert owner is not None and (owner.pid, owner.host) == (os.getpid(), socket.gethostname())
        capsys.readouterr()
        assert export(store, out, 1) == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and "Traceback" not in err
        assert (f"robowds export: error: another robowds export is writing {out} (pid {os.getpid()} on host "
                f"{socket.gethostname()}, since ") in err
        assert "two exports into one output would mix their shards" in err
        assert ("fix: wait for that export to finish, or export into another output folder (a crashed export "
                "frees its lock by itself)") in err
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # the refused export wrote nothing
    assert not out.exists()  # the lock made OUT, and OUT is left as it was found: absent
    # a lock file a SIGKILLed export left behind is not locked: the next export takes it and removes it
    out.mkdir()
    (out / LOCK_NAME).write_bytes(LockOwner(999999, "gone", 0.0).to_bytes())
    assert export(store, out, 1) == 0
    assert LOCK_NAME not in tree(out) and ".robowds-work" not in {p.name for p in out.iterdir()}
    capsys.readouterr()
    assert main(["verify", str(out), "--quiet"]) == 0
    assert "OK" in capsys.readouterr().out


def _group(pgid: int) -> dict[int, tuple[int, str]]:
    """The live processes of a process group: pid -> (parent pid, state letter), from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found[int(entry.name)] = (int(fields[1]), fields[0])
    return found


def _wait_for(what: str, check: Callable[[], bool], proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while not check():
        assert proc.poll() is None, f"the export ended before {what}: {proc.stderr.read().decode()}"  # type: ignore
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process group from /proc (Linux)")
def test_two_real_exports_one_wins_and_a_killed_exports_workers_do_not_keep_the_lock(
        store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Export A (a `robowds export` process, a pool of 2 workers) is stopped while it holds the lock:
    export B (other seed) is refused naming A's pid. Then A's workers are stopped, A alone is SIGKILLed:
    its lock is free at once although its workers still live (they never got the descriptor), so B
    runs, and the folder verifies."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "robowds.export", str(store), str(out), *SETTINGS,
                             "--workers", "2", "--seed", "1"], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def holds() -> bool:
            owner = LockOwner.parse((out / LOCK_NAME).read_bytes()) if (out / LOCK_NAME).is_file() else None
            return owner is not None and owner.pid == proc.pid
        _wait_for("A took the lock", holds, proc)
        os.killpg(proc.pid, signal.SIGSTOP)  # A holds the lock, whatever it does next
        capsys.readouterr()
        assert export(store, out, 2) == 2
        err = capsys.readouterr().err
        assert f"another robowds export is writing {out} (pid {proc.pid} on host {socket.gethostname()}" in err
        os.killpg(proc.pid, signal.SIGCONT)
        _wait_for("A's pool workers", lambda: any(ppid != proc.pid for pid, (ppid, _) in _group(proc.pid).items()
                                                  if pid != proc.pid), proc)
        os.killpg(proc.pid, signal.SIGSTOP)
        workers = [pid for pid, (ppid, _) in _group(proc.pid).items() if pid != proc.pid and ppid != proc.pid]
        assert workers
        # a process stops when it is next scheduled: on a loaded machine that is not at once
        _wait_for("A's workers to stop", lambda: all(_group(proc.pid).get(pid, (0, ""))[1] == "T"
                                                     for pid in workers), proc)
        os.kill(proc.pid, signal.SIGKILL)  # the main process only
        proc.wait(timeout=30)
        assert all(_group(proc.pid).get(pid, (0, ""))[1] == "T" for pid in workers)  # alive, stopped
        assert export(store, out, 2) == 0  # A's lock went with A (its partial work is another job's: replaced)
        assert all(_group(proc.pid).get(pid, (0, ""))[1] == "T" for pid in workers)  # still there meanwhile
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
    capsys.readouterr()
    assert main(["verify", str(out), "--quiet"]) == 0
    assert json.loads((out / "manifest.json").read_text())["config"]["seed"] == 2
    assert LOCK_NAME not in tree(out)


@dataclass(frozen=True)
class RewritesTheStore(ExecutorChoice):
    """The in-process executor, whose first map rewrites the store's trajectories table (every float
    value doubled) before any task reads it: a store changed by another program during the export."""

    table: str = ""

    def make(self, workers: int) -> InlineExecutor:
        return _Rewriting(Path(self.table))


class _Rewriting(InlineExecutor):
    def __init__(self, table: Path) -> None:
        super().__init__()
        self.table, self.done = table, False

    def map_unordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        if not self.done:
            self.done = True
            data = pq.read_table(self.table)
            for i, column in enumerate(data.columns):
                if column.type == "double":
                    data = data.set_column(i, data.field(i), pc.multiply(column, 2.0))
            pq.write_table(data, self.table)
        return super().map_unordered(fn, items)


def test_a_store_changed_during_the_export_publishes_nothing(tmp_path: Path, store: Path) -> None:
    root = tmp_path / "store"
    write_synthetic_store(root, episodes=3, seed=2)
    out = tmp_path / "out"
    assert export(root, out, 1) == 0
    before = tree(out)
    config: dict[str, Any] = load_config(None, ["stride=8", "shard.max_samples=8", "shard.min_shards=1",
                                                "exclude=[overview]", "seed=2"])
    old = fingerprint(root)
    with pytest.raises(UserError) as caught:
        run_export(root, out, config, overwrite=True, progress=False,
                   executor=RewritesTheStore(table=str(root / "trajectories.parquet")))
    new = fingerprint(root)
    assert new != old
    assert caught.value.message == (
        f"store {root} changed during the export (its fingerprint went from {old[:12]} to {new[:12]}: a table, "
        f"store.yaml or a media file's size differs), so the windows could mix old and new data; nothing was "
        f"published and the output is as it was before")
    assert caught.value.hint == ("re-run the export once nothing writes to the store any more (this run's work "
                                 "was discarded: it read both versions)")
    assert tree(out) == before  # the previous export, byte for byte; no work folder, no lock
    # the re-run reads the store as it is now, and its manifest names that store
    summary = run_export(root, out, config, overwrite=True, progress=False)
    assert summary.windows == 36
    assert json.loads((out / "manifest.json").read_text())["source"]["fingerprint"] == new
