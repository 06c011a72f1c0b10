"""Several ``outbox`` command lines in one child process, each as a process of its own sees it:
its own environment, its own stdout and stderr at the file-descriptor level (so what the Rust
side writes to stderr by itself, such as the AWS SDK's WARN lines, is caught with the command's
own), its exit code, and Python's once-per-process warnings shown again. One interpreter start
and one import of the product for all of them, instead of one each (about two seconds a
command).

What one process cannot give each command: what a process sets up once for its life. The Rust
side reads ``RUST_LOG`` once, when deltalake is first imported, and the AWS SDK's credential
chain warns about the metadata endpoint only the first time a process tries it: a command whose
assertion hangs on such a thing (a "no credentials" case) runs in an ``outbox`` process of its
own (``alone`` in ``run_commands``), beside the shared children.

The child runs as ``python -c 'from tests.cli_child import main; main()' CASES RESULTS``:
``CASES`` is a JSON list of ``{"argv": [...], "env": {...}}``, ``RESULTS`` gets a JSON list of
``{"returncode", "stdout", "stderr"}`` in the same order. Only the standard library is imported
before the first command, as the ``outbox`` script imports nothing before its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import traceback
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUTBOX = str(Path(sys.executable).with_name("outbox"))
_CHILD = "from tests.cli_child import main; main()"
Done = subprocess.CompletedProcess[str]
#: A command line (what follows ``outbox``) and the whole environment it runs with.
Run = tuple[list[str], dict[str, str]]


def run_in_one_child(runs: list[Run], where: Path, *, timeout: float = 900) -> list[Done]:
    """Each ``(argv, environment)`` as ``outbox argv`` with that environment, all in one child
    process, in order (``where``: a folder for the cases and results files)."""
    return run_commands([], [runs], where, timeout=timeout)[1][0]


def run_commands(
    alone: list[Run],
    together: list[list[Run]],
    where: Path,
    *,
    parallel: int = 4,
    timeout: float = 900,
) -> tuple[list[Done], list[list[Done]]]:
    """``alone``: each in an ``outbox`` process of its own; each list of ``together``: all in one
    child, in order. Up to ``parallel`` of these processes at a time (the commands mostly wait on
    servers and retries); returns their outcomes in the order given."""
    where.mkdir(parents=True, exist_ok=True)

    def one(argv: list[str], env: dict[str, str]) -> Done:
        return subprocess.run(
            [OUTBOX, *argv], env=env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def child(i: int, runs: list[Run]) -> list[Done]:
        if not runs:
            return []
        cases, results = where / f"cases-{i}.json", where / f"results-{i}.json"
        cases.write_text(json.dumps([{"argv": argv, "env": env} for argv, env in runs]))
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(cases), str(results)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        outcomes = json.loads(results.read_text())
        return [
            subprocess.CompletedProcess(["outbox", *a], r["returncode"], r["stdout"], r["stderr"])
            for (a, _), r in zip(runs, outcomes, strict=True)
        ]

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        children = [pool.submit(child, i, runs) for i, runs in enumerate(together)]
        own = [pool.submit(one, argv, env) for argv, env in alone]
        return [f.result() for f in own], [f.result() for f in children]


def _run(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    os.environ.clear()
    os.environ.update(env)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        code = _captured(argv, {1: out.fileno(), 2: err.fileno()})
        out.seek(0)
        err.seek(0)
        stdout, stderr = (f.read().decode("utf-8", "replace") for f in (out, err))
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed, exit code 1
        stderr += f"{code}\n"
        code = 1
    return {"returncode": code, "stdout": stdout, "stderr": stderr}


def _captured(argv: list[str], into: dict[int, int]) -> Any:
    """The command's exit code, its file descriptors 1 and 2 pointed at ``into``'s meanwhile."""
    from outbox.app.cli import main as cli_main

    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in into}
    try:
        for fd, target in into.items():
            os.dup2(target, fd)
        with warnings.catch_warnings():  # a fresh process shows each warning once: so here
            try:
                cli_main.main(args=argv, prog_name="outbox", standalone_mode=True)
                code: Any = 0
            except SystemExit as done:
                code = done.code
            except BaseException:  # what the interpreter does with it: a traceback, exit 1
                traceback.print_exc()
                code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
    return code


def main() -> None:
    cases_path, results_path = sys.argv[1:3]
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)
    results = [_run(c["argv"], c["env"]) for c in cases]
    with open(results_path, "w", encoding="utf-8") as f:
        json.dump(results, f)
