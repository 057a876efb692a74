"""`--executor ray` (issue 16, item 1) on a real local Ray instance: the same bytes as `--workers 1`,
a Ray worker SIGKILLed mid-task retried (and, without retries, one clear error and a resumable
export), the same messages as the local executor, convert on Ray, an append (`export --append`, issue
25) on Ray, and Ray kept optional.

Ray starts once for the module (`ray.init(num_cpus=2)`, auth and usage statistics off through Ray's
own environment variables, so it never reaches for the network). Starting Ray can hang or crawl on a
fresh machine, so a subprocess first probes, under a hard timeout, that Ray starts and runs one task;
the tests that need Ray are skipped, with the probe's reason, only when it does not. The tests that
need no Ray (it never imported by robowds, not installed = one error) always run.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pyarrow.parquet as pq
import pytest

from robowds.export.cli.main import main
from robowds.export.cli.synth import write_synthetic_store
from robowds.export.errors import UserError
from robowds.export.executors.executor import ExecutorChoice
from robowds.export.job.config import load_config
from robowds.export.job.run import run_export

from realdata import g1

RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
PROBE_TIMEOUT_S = 90
# a test's limit counts its fixtures' setup: the first Ray test also waits for the probe (up to 90 s)
# and Ray's start; each test itself runs in a few seconds
ON_RAY = pytest.mark.timeout(PROBE_TIMEOUT_S + 60)
SETTINGS = ["--set", "splits.val=0.2", "--set", "shard.max_samples=150", "--set", "streams.imu.offset_s=-0.5",
            "--set", "streams.imu.duration_s=0.5"]
EP = "ep_0000"

PROBE = """
import ray
ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="WARNING")
assert ray.get(ray.remote(lambda: 41 + 1).remote(), timeout=60) == 42
ray.shutdown()
print("ray ok")
"""


def tree_bytes(out: Path) -> dict[str, str]:
    """sha256 of every file under `out`, by relative path."""
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file()}


def probe_ray(env: dict[str, str]) -> str | None:
    """None if Ray starts and runs a task in a fresh process within PROBE_TIMEOUT_S, else why not. The
    probe runs in its own session, so a hung one is killed with every Ray process it started."""
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        return f"Ray is not installed ({exc}); pip install 'robowds[ray]'"
    proc = subprocess.Popen([sys.executable, "-c", PROBE], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return f"Ray did not start and run one task within {PROBE_TIMEOUT_S} s on this machine"
    if proc.returncode != 0 or "ray ok" not in output:
        return f"Ray cannot start here (exit {proc.returncode}): {output.strip()[-600:]}"
    return None


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """One local Ray instance of 2 CPUs for the module; every export below runs on it (RayExecutor uses
    a Ray this process initialised and leaves it running), and the finalizer shuts it down."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in RAY_ENV.items():
            mp.setenv(name, value)
        reason = probe_ray(dict(os.environ))
        if reason:
            pytest.skip(reason)
        import ray

        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
        # the StallOnce hook below runs in Ray workers, which cannot import this test module by name
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        try:
            yield ray
        finally:
            ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
            ray.shutdown()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ray") / "store"
    write_synthetic_store(root, episodes=12, seed=3)
    return root


@pytest.fixture(scope="module")
def reference(store: Path) -> dict[str, str]:
    """The bytes of the in-process export (`--workers 1`): what every Ray export must equal."""
    out = store.parent / "w1"
    assert main(["export", str(store), str(out), "--quiet", "--workers", "1", *SETTINGS]) == 0
    return tree_bytes(out)


def config() -> dict[str, Any]:
    return load_config(None, [s for s in SETTINGS if s != "--set"])


# ------------------------------------------------------------------------------------ without Ray


@pytest.mark.timeout(60)
def test_importing_robowds_never_imports_ray() -> None:
    """Every module of the job, the CLI and the Ray backend itself import without importing Ray: it is
    an optional extra, and it is slow to import."""
    code = ("import sys\n"
            "import robowds.export.cli.main, robowds.export.job.run, robowds.export.executors.executor\n"
            "import robowds.export.executors.ray_executor, robowds.export.convert.run, robowds.export.__main__\n"
            "from robowds.export.cli.main import build_parser\n"
            "build_parser().parse_args(['export', 'a', 'b', '--executor', 'ray'])\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.timeout(60)
def test_ray_not_installed_is_one_error_before_anything_is_written(
        store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as when it is absent
    out = tmp_path / "out"
    assert main(["export", str(store), str(out), "--quiet", "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("robowds export: error: --executor ray needs Ray, which is not installed"), err
    assert "fix: pip install 'robowds[ray]'" in err and "Traceback" not in err
    assert not out.exists()
    assert main(["convert", "lerobot", str(g1()), str(tmp_path / "s"), "--quiet", "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("robowds convert: error: --executor ray needs Ray") and "pip install 'robowds[ray]'" in err
    assert not (tmp_path / "s").exists() and not list(tmp_path.glob(".s.*"))


@pytest.mark.timeout(60)
def test_address_needs_the_ray_executor(store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(store), str(tmp_path / "out"), "--quiet", "--address", "auto"]) == 2
    err = capsys.readouterr().err
    assert "--address auto needs --executor ray" in err and "fix: add --executor ray" in err


# --------------------------------------------------------------------------------------- on Ray


@ON_RAY
def test_ray_export_is_byte_identical_to_one_worker_with_progress(
        ray_cluster: Any, store: Path, reference: dict[str, str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Every shard, wids index, offset index and the manifest equal the in-process export's bytes;
    progress bars go to stderr as with the local executor."""
    out = tmp_path / "ray"
    assert main(["export", str(store), str(out), "--executor", "ray", *SETTINGS]) == 0
    captured = capsys.readouterr()
    assert tree_bytes(out) == reference and "episode-facts.msgpack" in reference
    assert "episodes: 100%" in captured.err and "shards: 100%" in captured.err
    assert captured.out.startswith("exported 12 episodes (0 rejected)")


@dataclass(frozen=True)
class StallOnce:
    """Stands in for the map task `stage_episodes`. The first attempt of the first task stages its first
    episode (real work on disk), writes its pid and then waits to be killed; every other call is the
    real task. Runs in Ray workers (pickled by value)."""

    fn: Callable[[Any], Any]
    folder: str

    def __call__(self, args: tuple[Any, list[str]]) -> Any:
        folder = Path(self.folder)
        try:
            os.close(os.open(folder / "claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            with open(folder / "attempts", "a") as fh:
                fh.write(f"{os.getpid()}\n")
            return self.fn(args)
        job, episodes = args
        self.fn((job, episodes[:1]))
        (folder / "pid.tmp").write_text(str(os.getpid()))
        os.replace(folder / "pid.tmp", folder / "pid")
        time.sleep(45)  # SIGKILLed here by the test
        raise RuntimeError("the stalled task was not killed")


def kill_when_stalled(folder: Path, killed: list[str]) -> threading.Thread:
    """A thread that SIGKILLs the Ray worker running the stalled task once it wrote its pid (checking
    first that the pid is a Ray worker, never this process); `killed` gets the pid, or why not."""
    def run() -> None:
        deadline = time.monotonic() + 40
        while not (folder / "pid").exists():
            if time.monotonic() > deadline:
                killed.append("no pid written in 40 s")
                return
            time.sleep(0.05)
        pid = int((folder / "pid").read_text())
        title = psutil.Process(pid).cmdline()
        if pid == os.getpid() or not title or not title[0].startswith("ray::"):
            killed.append(f"pid {pid} is not a Ray worker: {title}")
            return
        os.kill(pid, signal.SIGKILL)
        killed.append(str(pid))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@ON_RAY
def test_a_worker_killed_mid_task_is_retried_and_the_output_is_identical(
        ray_cluster: Any, store: Path, reference: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import robowds.export.job.run as job_run

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    monkeypatch.setattr(job_run, "stage_episodes", StallOnce(job_run.stage_episodes, str(hooks)))
    killed: list[str] = []
    thread = kill_when_stalled(hooks, killed)
    out = tmp_path / "out"
    summary = run_export(store, out, config(), workers=2, progress=False, executor=ExecutorChoice("ray"))
    thread.join(5)
    assert killed and killed[0].isdigit(), killed
    assert summary.episodes == 12 and tree_bytes(out) == reference
    attempts = (hooks / "attempts").read_text().split()
    assert killed[0] not in attempts  # the retry and every other task ran in live workers


@ON_RAY
def test_without_retries_the_killed_task_is_one_clear_error_and_a_rerun_resumes(
        ray_cluster: Any, store: Path, reference: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same kill with max_retries=0 fails (so the test above proves the retry), as one UserError
    that says to re-run; the re-run resumes and ends byte-identical."""
    import robowds.export.job.run as job_run

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    monkeypatch.setattr(job_run, "stage_episodes", StallOnce(job_run.stage_episodes, str(hooks)))
    killed: list[str] = []
    thread = kill_when_stalled(hooks, killed)
    out = tmp_path / "out"
    with pytest.raises(UserError) as failed:
        run_export(store, out, config(), workers=2, progress=False, executor=ExecutorChoice("ray", max_retries=0))
    thread.join(5)
    assert killed and killed[0].isdigit(), killed
    message = str(failed.value)
    assert message.startswith("Ray could not finish a StallOnce task after 1 attempt(s): WorkerCrashedError"), message
    assert "re-run the same command: it resumes" in message
    assert not (out / "manifest.json").exists()
    run_export(store, out, config(), workers=2, progress=False, executor=ExecutorChoice("ray"))
    assert tree_bytes(out) == reference


@ON_RAY
def test_a_bad_episode_gives_the_local_executors_message(ray_cluster: Any, store: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "store"
    subprocess.run(["cp", "-r", str(store), str(bad)], check=True)
    (bad / "media/overview" / f"{EP}.png").unlink()
    messages = {}
    for executor in ("local", "ray"):
        out = tmp_path / executor
        assert main(["export", str(bad), str(out), "--quiet", "--workers", "2", "--executor", executor]) == 2
        messages[executor] = capsys.readouterr().err.replace(str(out), "OUT")
    assert messages["ray"] == messages["local"]
    assert messages["ray"].startswith("robowds export: error: 1 episode(s) cannot be exported:\n  episode "
                                      f"'{EP}', field 'overview': image file 'media/overview/{EP}.png' cannot be read")


@ON_RAY
def test_convert_on_ray_writes_the_same_store_and_the_same_errors(ray_cluster: Any, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The real G1 LeRobot subset converted in-process and on Ray: the same store bytes. A data file
    without a feature's column fails inside a Ray task: its UserError comes back unwrapped, the same
    message (a missing video is found before any task runs)."""
    assert main(["convert", "lerobot", str(g1()), str(tmp_path / "local"), "--quiet", "--workers", "1"]) == 0
    assert main(["convert", "lerobot", str(g1()), str(tmp_path / "ray"), "--quiet", "--executor", "ray"]) == 0
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")
    src = tmp_path / "src"
    subprocess.run(["cp", "-r", str(g1()), str(src)], check=True)
    data = next((src / "data").rglob("episode_000002.parquet"))
    pq.write_table(pq.read_table(data).drop(["action"]), data)
    errors = {}
    for executor in ("local", "ray"):
        capsys.readouterr()
        assert main(["convert", "lerobot", str(src), str(tmp_path / f"bad-{executor}"), "--quiet",
                     "--executor", executor]) == 2
        errors[executor] = capsys.readouterr().err
    assert errors["ray"] == errors["local"]
    assert "robowds convert: error: episode 2: data/chunk-000/episode_000002.parquet has no column 'action'" in \
        errors["ray"] and "Traceback" not in errors["ray"]


@ON_RAY
def test_a_node_that_does_not_see_a_shared_path_is_named(ray_cluster: Any, tmp_path: Path) -> None:
    """The probe runs on every live node; here the one node lacks a path the tasks would read."""
    from robowds.export.executors.ray_executor import RayExecutor

    executor = RayExecutor(2)
    try:
        executor.check_shared(tmp_path, [tmp_path])  # sees both: no error, and the probe file is gone
        assert list(tmp_path.iterdir()) == []
        with pytest.raises(UserError) as failed:
            executor.check_shared(tmp_path, [tmp_path / "elsewhere"])
    finally:
        executor.close()
    assert f"(not: {tmp_path / 'elsewhere'})" in str(failed.value)
    assert "every node mounts at the same path" in str(failed.value)
    assert ray_cluster.is_initialized()  # a Ray this process started is left running


def _square(x: int) -> int:
    return x * x


@ON_RAY
def test_ray_tasks_are_accounted_as_the_pool_accounts_them(ray_cluster: Any) -> None:
    """Each task's CPU and wall time are measured in the Ray worker that ran it (the export's phase
    profile reads them, as with the process pool); results come back unwrapped."""
    from robowds.export.executors.ray_executor import RayExecutor

    executor = RayExecutor(2)
    try:
        assert sorted(executor.map_unordered(_square, range(6))) == [x * x for x in range(6)]
        assert list(executor.map_ordered(_square, range(3))) == [0, 1, 4]
    finally:
        executor.close()
    usage = executor.usage
    assert usage.tasks == 9 and len(usage.each_cpu_s) == 9 and usage.wall_s > 0
    assert usage.worker_cpu_s and os.getpid() not in usage.worker_cpu_s  # measured in Ray's workers
    assert all(cpu > 0 for cpu in usage.worker_cpu_s.values())


@dataclass(frozen=True)
class Recorded:
    """Stands in for a map or reduce task: notes the pid it runs in under `folder`/<task name>, then
    runs the real task. Runs in Ray workers (pickled by value)."""

    fn: Callable[[Any], Any]
    folder: str

    def __call__(self, arg: Any) -> Any:
        with open(Path(self.folder) / self.fn.__name__, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        return self.fn(arg)


@ON_RAY
def test_append_on_ray_runs_its_tasks_there_and_writes_the_local_appends_bytes(
        ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 25, item 1: `--append --executor ray` stages the new episodes (map) and writes the new
    shards (reduce) as Ray tasks, and OUT ends byte-identical to an in-process append."""
    import robowds.export.job.append as job_append
    import robowds.export.job.remote_job as remote_job

    for n in (4, 7):  # the first 4 episodes of both stores are the same (synth draws each from (seed, i))
        write_synthetic_store(tmp_path / f"s{n}", episodes=n)
    base = tmp_path / "base"
    settings = [a for s in ("splits={train: rest, val: 0.3}", "window.duration_s=0.4", "stride=8",
                            "shard.min_shards=2") for a in ("--set", s)]  # tests/test_export_append.py's
    assert main(["export", str(tmp_path / "s4"), str(base), "--quiet", "--workers", "1", *settings]) == 0
    for name in ("local", "ray"):
        subprocess.run(["cp", "-r", str(base), str(tmp_path / name)], check=True)
    assert main(["export", str(tmp_path / "s7"), str(tmp_path / "local"), "--append", "--quiet", "--workers", "1"]) == 0
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    monkeypatch.setattr(job_append, "stage_episodes", Recorded(job_append.stage_episodes, str(hooks)))
    monkeypatch.setattr(remote_job, "write_shard", Recorded(remote_job.write_shard, str(hooks)))
    summary = job_append.run_append(tmp_path / "s7", tmp_path / "ray", workers=2, progress=False,
                                    executor=ExecutorChoice("ray"))
    assert (summary.appended, summary.episodes) == (True, 3) and summary.shards >= 2
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")
    assert tree_bytes(tmp_path / "ray") != tree_bytes(base)
    for task in ("stage_episodes", "write_shard"):
        pids = set((hooks / task).read_text().split())
        assert pids and str(os.getpid()) not in pids, (task, pids)  # in Ray's workers, never here
