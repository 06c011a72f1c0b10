"""The CI seeds run concurrently: a seed is mostly waiting (its supervisor used about a fifth of
a core), so ``SEED_JOBS`` seeds at a time finish the 50 in a fraction of the serial time.

Why a process pool behind a session fixture rather than ``pytest -n``: the suite stays one pytest
run (``scripts/test.sh`` passes its arguments through unchanged), each seed is still its own test
(``-k 'seed_holds and 23'`` runs seed 23 alone), and the seeds need no xdist of their own. The
fixture submits every collected seed at the start; each test waits for its own. Under xdist the
seed tests of one pool share a worker (``tests/conftest.py`` groups them), so that worker's pool
still sees them all.

The broken builds of ``test_checker_mutations`` run in such a pool too, each pool process measured
as the test process is when ``pytest --cov`` runs (``coverage_of_this_process``): those seeds run
checker code in the supervisor that no other test does.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from outbox.app.checker.report import CheckReport
from outbox.app.checker.run import run_check

#: Seeds run at once (``OUTBOX_CHECK_JOBS`` overrides it).
SEED_JOBS = int(os.environ.get("OUTBOX_CHECK_JOBS", "4"))

RunSeed = Callable[[int], CheckReport]


def _run_one(
    seed: int, workdir: str, kwargs: dict[str, Any], measure: dict[str, Any] | None = None
) -> CheckReport:
    cov = None
    if measure is not None:  # measured as the test process is (``coverage_of_this_process``)
        import coverage

        cov = coverage.Coverage(data_suffix=True, **measure)
        cov.start()
    try:
        return run_check(seed, workdir, **kwargs)
    finally:
        if cov is not None:
            cov.stop()
            cov.save()


def coverage_of_this_process() -> dict[str, Any] | None:
    """How ``pytest --cov`` measures this process (None when it does not), for a pool process to
    measure its seed the same way: it saves a data file of its own beside this process's, and
    pytest-cov combines every data file there at the end of the run. Without it, the checker's
    code that only a pooled seed runs (a broken build's hooks in the supervisor) would leave
    the coverage total when its tests moved into a pool."""
    try:
        import coverage
    except ImportError:  # pragma: no cover - a dev dependency
        return None
    cov = coverage.Coverage.current()
    if cov is None:
        return None
    c = cov.config
    return {
        "data_file": os.path.abspath(c.data_file),
        "config_file": c.config_file or False,
        "branch": c.branch,
        "source": c.source,
        "source_pkgs": c.source_pkgs,
    }


class CheckPool:
    """Runs ``run_check`` calls in ``jobs`` processes, in the order submitted, each under a key
    (a seed, a broken build's name) its test asks for. ``measure``: see
    ``coverage_of_this_process``."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self._pool: ProcessPoolExecutor | None = None
        self._futures: dict[Any, Future[CheckReport]] = {}

    def submit(
        self,
        key: Any,
        seed: int,
        workdir: Path,
        kwargs: dict[str, Any],
        measure: dict[str, Any] | None = None,
    ) -> None:
        if self._pool is None:
            # spawn: the pytest process may hold deltalake's runtime threads, and a forked
            # copy of them hangs
            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=ctx)
        if key not in self._futures:
            self._futures[key] = self._pool.submit(_run_one, seed, str(workdir), kwargs, measure)

    def submitted(self, key: Any) -> bool:
        return key in self._futures

    def result(self, key: Any) -> CheckReport:
        return self._futures[key].result()

    def close(self) -> None:
        if self._pool is not None:  # after -x: runs not started yet are dropped
            self._pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="session")
def check_pool() -> Iterator[CheckPool]:
    """The pool the CI seeds and the broken builds share: its processes (each with the fork
    server it started once, its heavy imports done) run the builds once the seeds are done,
    rather than a second pool paying those starts again."""
    pool = CheckPool(SEED_JOBS)
    try:
        yield pool
    finally:
        pool.close()


class SeedPool:
    """Runs ``run_check`` for a list of seeds in ``jobs`` processes, in seed order (in
    ``shared``, a pool someone else closes, if given), each under the key ``(name, seed)``:
    two modes' runs of one seed in a shared pool stay apart."""

    def __init__(
        self,
        workdir: Path,
        kwargs: dict[str, Any],
        jobs: int,
        shared: CheckPool | None = None,
        *,
        name: str = "",
    ) -> None:
        self.workdir, self.kwargs, self.name = workdir, kwargs, name
        self._own = shared is None
        self._pool = CheckPool(jobs) if shared is None else shared

    def submit(self, seeds: list[int]) -> None:
        for seed in seeds:
            self._pool.submit((self.name, seed), seed, self.workdir, self.kwargs)

    def result(self, seed: int) -> CheckReport:
        self.submit([seed])
        return self._pool.result((self.name, seed))

    def close(self) -> None:
        if self._own:
            self._pool.close()


def collected_seeds(session: pytest.Session, test_name: str) -> list[int]:
    """The ``seed`` parameters of the collected items of ``test_name``, in collection order."""
    out: list[int] = []
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        if getattr(item, "originalname", None) == test_name and callspec is not None:
            out.append(int(callspec.params["seed"]))
    return out


def seed_runner(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    *,
    name: str,
    test_name: str,
    kwargs: dict[str, Any],
    jobs: int = SEED_JOBS,
    shared: CheckPool | None = None,
) -> Iterator[RunSeed]:
    """A session fixture's body: every collected seed of ``test_name`` starts at once, ``jobs``
    of them running at a time (in ``shared``, when given)."""
    workdir = tmp_path_factory.mktemp(name)
    if jobs <= 1:
        yield lambda seed: run_check(seed, workdir, **kwargs)
        return
    pool = SeedPool(workdir, kwargs, jobs, shared, name=name)
    pool.submit(collected_seeds(request.session, test_name))
    try:
        yield pool.result
    finally:
        pool.close()
