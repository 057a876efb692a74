"""Run Python scripts in forks of one interpreter that has run a preload (imports) once.

A fresh interpreter per documentation block (tests/test_readme_blocks.py: torch and robowds
preloaded) spent ~2 s of each block's run importing torch and robowds, ~50 s over the docs' blocks on
2 cores; the import-order checks (tests/test_reader_imports.py: torch preloaded, robowds not) ~57 s. Each script still runs in a
process of its own, as `python script.py` would: its own `__main__` module with `__file__` set (so
DataLoader workers started with `spawn` re-import it), its working folder, argv, stdout and stderr
in files, and its exit status; nothing a script does reaches the next one. The server forks before
anything else runs in it, and it starts no thread of its own, so each fork is as clean as the server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SERVER = r"""
import json, os, sys, traceback, types
exec(sys.argv[1])  # the preload: imports only
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.chdir(job["cwd"])
            for fd, name in ((1, "stdout"), (2, "stderr")):
                target = os.open(job[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(target, fd)
                os.close(target)
            sys.stdin = open(os.devnull)
            sys.argv = [job["script"]]
            sys.path[0] = os.path.dirname(job["script"])
            main = types.ModuleType("__main__")
            main.__file__ = job["script"]
            main.__builtins__ = __builtins__
            sys.modules["__main__"] = main
            code = compile(open(job["script"]).read(), job["script"], "exec")
            try:
                exec(code, main.__dict__)
                status = 0
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if not isinstance(exc.code, (int, type(None))):
                    print(exc.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(status)
    _, wait = os.waitpid(pid, 0)
    print(json.dumps({"status": os.waitstatus_to_exitcode(wait)}), flush=True)
"""


class ForkRunner:
    """A server process (see the module docstring); `run(script, cwd)` -> (exit status, stdout, stderr)."""

    def __init__(self, preload: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, preload], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        ready = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert ready.strip() == '{"ready": true}', f"the fork server did not start: {ready!r}"

    def run(self, script: Path, cwd: Path, logs: Path | None = None) -> tuple[int, str, str]:
        """`logs`: the folder for the script's stdout and stderr files (default `cwd`; another one when
        `cwd` is the repository, which must not get stray files)."""
        out, err = (logs or cwd) / ".stdout", (logs or cwd) / ".stderr"
        job: dict[str, Any] = {"script": str(script.resolve()), "cwd": str(cwd), "stdout": str(out), "stderr": str(err)}
        self.proc.stdin.write(json.dumps(job) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        answer = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert answer, "the fork server died"
        return json.loads(answer)["status"], out.read_text(), err.read_text()

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=60)
