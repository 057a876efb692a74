"""`export --overwrite` replaces only what robowds wrote, and only once the new export is complete.

Every test starts from a real export (OLD options: a train and a val split in many small shards) and
replaces it with a real export of another config (NEW options: train only, fewer shards), next to
files robowds did not write. REFERENCE is the NEW export written into an empty folder: after any
overwrite, OUT must hold exactly its bytes plus the user's files, untouched.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.errors import UserError
from robowds.export.job import run as export_job
from robowds.export.output.publish import load_finished_manifest
from robowds.reader import ShardDataset
from robowds.reader.manifest import parse_manifest

from kills import run_and_kill_in

OLD = ["--set", "splits.val=0.25", "--set", "shard.max_samples=40"]
NEW = ["--fps", "5", "--set", "shard.max_samples=100", "--set", "shard.min_shards=1"]  # fewer shards than OLD
USER_FILES = {"NOTES.md": b"# my notes\n", ".nv-meta/dataset.yaml": b"__module__: megatron.energon\n",
              ".nv-meta/index.sqlite": bytes(range(256)), "train/foo.tar": b"not ours\n"}
WORK = ".robowds-work/"
LOCK = ".robowds-lock"


def tree_bytes(out: Path) -> dict[str, str]:
    """sha256 of every file under `out`, by relative path."""
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file()}


def visible(out: Path) -> dict[str, str]:
    """`tree_bytes` without robowds' work folder and lock file (a killed export leaves it, unlocked)."""
    return {k: v for k, v in tree_bytes(out).items() if not k.startswith(WORK) and k != LOCK} if out.exists() else {}


def export(store: Path, out: Path, *options: str) -> int:
    return main(["export", str(store), str(out), "--quiet", "--workers", "1", *options])


def add_user_files(out: Path, files: dict[str, bytes]) -> dict[str, str]:
    for rel, data in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    return {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_store(tmp_path_factory.mktemp("overwrite") / "store", episodes=8, seed=4).root


@pytest.fixture(scope="module")
def old(store: Path) -> Path:
    """The export being replaced (never modified; tests copy it)."""
    out = store.parent / "old"
    assert export(store, out, *OLD) == 0
    return out


@pytest.fixture(scope="module")
def reference(store: Path, old: Path) -> dict[str, str]:
    out = store.parent / "reference"
    assert export(store, out, *NEW) == 0
    ref = tree_bytes(out)
    old_tree = tree_bytes(old)
    # the premise of these tests: shared names with other bytes, and old shards the new export lacks
    assert {"train/shard-000000.tar", "manifest.json", "train.wids.json", "episodes.msgpack",
            "stats-state.msgpack"} <= ref.keys() & old_tree.keys()
    assert all(ref[k] != old_tree[k] for k in ref.keys() & old_tree.keys() - {".nv-meta/dataset.yaml"})  # it names no shard
    assert {"val.wids.json", "val/shard-000000.tar", "train/shard-000004.tar"} <= old_tree.keys() - ref.keys()
    return ref


def copy_old(old: Path, out: Path, user_files: dict[str, bytes]) -> dict[str, str]:
    shutil.copytree(old, out)
    return add_user_files(out, user_files)


def assert_old_export_intact(out: Path, old: Path) -> None:
    """Every file of the old export is there with its bytes, and the reader reads every sample."""
    seen, old_tree = visible(out), tree_bytes(old)
    assert {k: seen.get(k) for k in old_tree} == old_tree
    doc = parse_manifest((out / "manifest.json").read_bytes())
    for split, entry in doc["splits"].items():
        for shard in entry["shards"]:
            assert hashlib.sha256((out / shard["path"]).read_bytes()).hexdigest() == shard["sha256"]
        assert sum(1 for _ in ShardDataset(out, split, shuffle=False)) == entry["samples"] > 0


def test_overwrite_next_to_notes_through_the_cli(store: Path, old: Path, reference: dict[str, str],
                                                 tmp_path: Path) -> None:
    """The issue's repro: NOTES.md next to an export; `--overwrite` used to delete the export, then refuse."""
    out = tmp_path / "o"
    user = copy_old(old, out, {"NOTES.md": USER_FILES["NOTES.md"]})
    run = subprocess.run([sys.executable, "-m", "robowds.export", str(store), str(out), "--quiet", "--workers", "1",
                          *NEW, "--overwrite"], env=dict(os.environ),
                         capture_output=True, text=True)
    assert (run.returncode, run.stderr) == (0, "") and run.stdout.startswith("exported 8 episodes")
    assert tree_bytes(out) == reference | user


def test_overwrite_keeps_nv_meta_and_unlisted_files(store: Path, old: Path, reference: dict[str, str],
                                                    tmp_path: Path) -> None:
    out = tmp_path / "o"
    user = copy_old(old, out, USER_FILES)
    assert export(store, out, *NEW, "--overwrite") == 0
    assert tree_bytes(out) == reference | user
    assert main(["verify", str(out), "--quiet"]) == 0


def test_overwrite_removes_old_shards_the_new_export_lacks(store: Path, old: Path, reference: dict[str, str],
                                                           tmp_path: Path) -> None:
    """The old val split and train shards past the new count were ours: gone; the user's val/ file stays."""
    out = tmp_path / "o"
    user = copy_old(old, out, {"val/README.txt": b"val notes\n"})
    assert export(store, out, *NEW, "--overwrite") == 0
    assert tree_bytes(out) == reference | user
    assert sorted(p.name for p in (out / "val").iterdir()) == ["README.txt"]
    out2 = tmp_path / "o2"  # without a user file in it, an emptied split folder goes too
    copy_old(old, out2, {})
    assert export(store, out2, *NEW, "--overwrite") == 0
    assert tree_bytes(out2) == reference and not (out2 / "val").exists()


def test_old_export_intact_when_the_new_one_fails_on_a_bad_episode(store: Path, old: Path,
                                                                   reference: dict[str, str], tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad-store"
    shutil.copytree(store, bad)
    (bad / "media/overview/ep_0003.png").unlink()
    out = tmp_path / "o"
    copy_old(old, out, {})
    assert export(bad, out, *NEW, "--overwrite", "--set", "on_bad_episode=fail") == 2
    assert "episode 'ep_0003', field 'overview'" in capsys.readouterr().err
    assert_old_export_intact(out, old)


def test_old_export_intact_until_every_new_shard_is_written(store: Path, old: Path, reference: dict[str, str],
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail right after the reduce step: new shards of the same names must not have replaced old ones."""
    def fail(**_: object) -> None:
        raise RuntimeError("stop after reduce")

    out = tmp_path / "o"
    copy_old(old, out, {})
    with monkeypatch.context() as patch:
        patch.setattr(export_job, "build_manifest", fail)
        with pytest.raises(RuntimeError, match="stop after reduce"):
            export(store, out, *NEW, "--overwrite")
    assert_old_export_intact(out, old)
    assert export(store, out, *NEW, "--overwrite") == 0  # resumes from the finished shards
    assert tree_bytes(out) == reference


def test_file_in_the_way_is_refused_before_anything_changes(store: Path, old: Path, reference: dict[str, str],
                                                            tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A user's file where the new export puts a shard no manifest lists: refused, OUT unchanged."""
    fewer = tmp_path / "fewer"
    assert export(store, fewer, "--fps", "5", "--set", "shard.max_samples=400", "--set", "shard.min_shards=1") == 0
    out = tmp_path / "o"
    user = copy_old(fewer, out, {"train/shard-000002.tar": b"mine\n", "NOTES.md": b"notes\n"})
    before = visible(out)
    assert export(store, out, *NEW, "--overwrite") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"robowds export: error: 1 path(s) in {out} are in the way of the new export") and \
        "train/shard-000002.tar" in err and "move them out" in err and "Traceback" not in err
    assert visible(out) == before
    (out / "train/shard-000002.tar").unlink()
    del user["train/shard-000002.tar"]
    assert export(store, out, *NEW, "--overwrite") == 0
    assert tree_bytes(out) == reference | user


@pytest.mark.parametrize("content", [b"{}", b"not json"])
def test_folder_without_a_robowds_export_is_refused_even_with_overwrite(store: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str],
                                                                       content: bytes) -> None:
    out = tmp_path / "o"
    add_user_files(out, {"NOTES.md": b"n\n", "train/shard-000000.tar": b"x"})
    before = tree_bytes(out)
    for overwrite in ([], ["--overwrite"]):
        assert export(store, out, *overwrite) == 2
        assert "is not empty and holds no robowds export" in capsys.readouterr().err
        assert tree_bytes(out) == before
    (out / "manifest.json").write_bytes(content)  # a manifest.json that is not ours: refused, one message
    before = tree_bytes(out)
    for overwrite in ([], ["--overwrite"]):
        assert export(store, out, *overwrite) == 2
        err = capsys.readouterr().err
        assert "robowds replaces only an export it wrote and can read" in err and "Traceback" not in err
    assert tree_bytes(out) == before


def test_killed_partial_export_of_another_config_is_replaced(store: Path, old: Path, reference: dict[str, str],
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partial export's work folder is ours: another config (no --overwrite needed) replaces it."""
    def fail(**_: object) -> None:
        raise RuntimeError("killed")

    out = tmp_path / "o"
    with monkeypatch.context() as patch:
        patch.setattr(export_job, "build_manifest", fail)
        with pytest.raises(RuntimeError):
            export(store, out, *OLD)
    user = add_user_files(out, {"NOTES.md": b"n\n"})
    assert export(store, out, *NEW) == 0
    assert tree_bytes(out) == reference | user


def test_io_error_while_publishing_is_one_message_and_a_rerun_finishes(
        store: Path, old: Path, reference: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    user = copy_old(old, out, USER_FILES)
    real_replace, moved = os.replace, []

    def full_disk_after_two_moves(src: object, dst: object) -> None:
        if ".robowds-work" not in str(dst):  # a move into OUT, i.e. publishing
            if len(moved) == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            moved.append(dst)
        real_replace(src, dst)

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", full_disk_after_two_moves)
        assert export(store, out, *NEW, "--overwrite") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"robowds export: error: cannot publish the export into {out}: [Errno 28] No space") and \
        "re-run the same command" in err and "Traceback" not in err
    assert "manifest.json" not in visible(out)  # half published: nothing listed
    assert export(store, out, *NEW) == 0  # any export into OUT finishes the publish first; this one is it
    assert "up to date" in capsys.readouterr().out
    assert tree_bytes(out) == reference | user


# --------------------------------------------------------------------------------------------- kills

def _cmd(store: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "robowds.export", str(store), str(out), "--quiet", "--workers", "1", *NEW, "--overwrite"]


def assert_consistent_after_kill(out: Path, old_tree: dict[str, str], reference: dict[str, str],
                                 user: dict[str, str]) -> None:
    """The user's files are untouched; a visible manifest lists a complete export, old or new."""
    seen = visible(out)
    assert {k: seen.get(k) for k in user} == user
    ours = {k: v for k, v in seen.items() if k not in user}
    for name, digest in ours.items():
        assert digest in (old_tree.get(name), reference.get(name)), f"{name}: neither old nor new bytes"
    if "manifest.json" in ours:  # a user's file where robowds writes one (.nv-meta/dataset.yaml) is the user's
        assert ours in ({k: v for k, v in old_tree.items() if k not in user},
                        {k: v for k, v in reference.items() if k not in user}), "a visible manifest lists an incomplete export"


@pytest.mark.slow
@pytest.mark.timeout(600)  # 5 exports: ~15 s on a quiet 2-core machine
def test_sigkill_during_overwrite_in_each_phase(tmp_path: Path) -> None:
    """Kill an --overwrite export in each phase of its job, each re-run resuming the killed one
    (staging, the reduce, the manifest write, the journaled publish), then finish it: after every kill
    NOTES.md and the other user files are intact and a visible manifest lists a complete export, old
    or new; the finished one is byte-identical to an uninterrupted --overwrite. The moment of each kill
    is read from the work folder (tests/kills.py), plus a random delay inside staging and the reduce;
    it used to be guessed from a timing run, and on a loaded CI machine, where the first (cold) run
    was the slowest, 0 of 28 kills landed before the export finished."""
    episodes = 24
    store = write_synthetic_store(tmp_path / "store", episodes=episodes, seed=6).root
    old = tmp_path / "old"
    assert export(store, old, *OLD) == 0
    ref = tmp_path / "ref"
    copy_old(old, ref, {})
    assert export(store, ref, *NEW, "--overwrite") == 0
    reference, old_tree, old_manifest = tree_bytes(ref), tree_bytes(old), (old / "manifest.json").read_bytes()
    env, rng = dict(os.environ), random.Random(7)
    out = tmp_path / "killed"
    user = copy_old(old, out, USER_FILES)
    landed = []
    for target in ("map", "reduce", "manifest", "publish"):
        delay = rng.uniform(0.0, 0.2) if target in ("map", "reduce") else 0.0
        landed.append(run_and_kill_in(_cmd(store, out), env, out, episodes, target, delay, old_manifest))
        assert_consistent_after_kill(out, old_tree, reference, user)
    assert export(store, out, *NEW, "--overwrite") == 0  # the re-run, in this process (no interpreter start)
    assert tree_bytes(out) == reference | user
    assert landed[:2] == ["map", "reduce"], f"kills landed in {landed}"  # the long phases: hit every time


KILL_AT_STEP = r"""
import os, shutil, signal, sys
out, budget = os.path.realpath(sys.argv[1]), int(sys.argv[2])
work, steps, inside = os.path.join(out, ".robowds-work"), [0], [False]

def step():  # SIGKILL this process instead of doing the budget+1-th change to OUT
    steps[0] += 1
    if steps[0] > budget:
        os.kill(os.getpid(), signal.SIGKILL)

def in_out(path):  # in OUT, outside the work folder
    p = os.path.realpath(os.fspath(path))
    return p.startswith(out + os.sep) and not (p == work or p.startswith(work + os.sep))

def counted(fn, arg):
    def wrapper(*a, **k):
        if not inside[0] and k.get("dir_fd") is None and in_out(a[arg]):
            step()
        return fn(*a, **k)
    return wrapper

def rmtree(path, *a, _real=shutil.rmtree, **k):
    step()
    inside[0] = True
    try:
        return _real(path, *a, **k)
    finally:
        inside[0] = False

os.replace, os.rename = counted(os.replace, 1), counted(os.rename, 1)
os.unlink, os.remove, os.rmdir = counted(os.unlink, 0), counted(os.remove, 0), counted(os.rmdir, 0)
shutil.rmtree = rmtree
from robowds.export.job import run as export_job
from robowds.export.cli.main import main
sys.exit(main(["export", *sys.argv[3:]]))
"""


def run_forked(script: str, argv: list[str]) -> int:
    """Runs `script` (ending in sys.exit) in a fork of this process, with `argv` as sys.argv[1:]; its
    exit code as subprocess gives it (-9: SIGKILLed). A fork has robowds imported already, which saves
    each run the ~1 s an interpreter takes to import it (the sweep below makes a dozen runs). Safe here:
    the export runs in-process (--workers 1) and our FFmpeg use is single-threaded (test_fork_safety)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            sys.argv = ["kill-at-step", *argv]
            exec(compile(script, "<kill-at-step>", "exec"), {"__name__": "__main__"})
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.slow
@pytest.mark.timeout(900)  # an export killed before each change to OUT, then re-run: minutes under load
def test_sigkill_before_each_change_to_out_then_rerun(store: Path, old: Path, reference: dict[str, str],
                                                      tmp_path: Path) -> None:
    """Kill the overwrite right before its 1st, 2nd, ... rename or deletion in OUT (publish is all of
    them), then re-run the same command: NOTES.md and the other user files survive, bytes identical.

    Which changes: the first 6, then every 4th (the middle of a publish is the same step repeated per
    shard), then every one of the last before the export completes (where the manifest lands). About
    20 of the ~50 changes, each a killed run and a re-run."""
    old_tree = tree_bytes(old)

    def killed_before(budget: int) -> bool:
        """Kill before change `budget + 1`, check, re-run, check; False when the run had fewer changes."""
        out = tmp_path / f"k{budget}"
        user = copy_old(old, out, USER_FILES)
        returncode = run_forked(KILL_AT_STEP, [str(out), str(budget), *_cmd(store, out)[3:]])
        assert_consistent_after_kill(out, old_tree, reference, user)
        if returncode == 0:
            assert tree_bytes(out) == reference | user
            return False
        if not (out / "manifest.json").exists() and (out / ".robowds-work" / "publish.json").exists():
            # killed inside the publish, between the old manifest and the new: verify says so, and how to finish
            with pytest.raises(UserError, match="was stopped while it published its files") as stopped:
                load_finished_manifest(out)
            assert stopped.value.hint.startswith("run the same `robowds export` command again")
            midway.append(budget)
        assert returncode == -signal.SIGKILL, f"exit code {returncode}"
        assert export(store, out, *NEW, "--overwrite") == 0
        assert tree_bytes(out) == reference | user, f"killed before change {budget + 1}"
        shutil.rmtree(out)
        return True

    midway: list[int] = []  # the kills that left no manifest: inside the publish
    budget, tried = 0, 0
    while killed_before(budget):  # stride 1, then 3, until a run completes
        tried, budget = budget, budget + (1 if budget < 6 else 4)
    for skipped in range(tried + 1, budget):  # the last changes before the end, each one
        if not killed_before(skipped):
            budget = skipped  # the run has `skipped` changes
            break
    assert budget >= 12, f"only {budget} changes to OUT: the test no longer covers a full publish"
    assert midway, "no kill landed between the old manifest's removal and the new one's rename"
