"""The CI seeds run concurrently: a seed is mostly waiting (its supervisor used about a fifth of
a core), so ``SEED_JOBS`` seeds at a time finish the 50 in a fraction of the serial time.

Why a process pool behind a session fixture rather than ``pytest -n``: the suite stays one pytest
run (``scripts/test.sh`` passes its arguments through unchanged), each seed is still its own test
(``-k 'seed_holds and 23'`` runs seed 23 alone), and the seeds need no xdist of their own. The
fixture submits every collected seed at the start; each test waits for its own. Under xdist the
seed tests of one pool share a worker (``tests/conftest.py`` groups them), so that worker's pool
still sees them all.
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


def _run_one(seed: int, workdir: str, kwargs: dict[str, Any]) -> CheckReport:
    return run_check(seed, workdir, **kwargs)


class SeedPool:
    """Runs ``run_check`` for a list of seeds in ``jobs`` processes, in seed order."""

    def __init__(self, workdir: Path, kwargs: dict[str, Any], jobs: int) -> None:
        self.workdir, self.kwargs, self.jobs = workdir, kwargs, jobs
        self._pool: ProcessPoolExecutor | None = None
        self._futures: dict[int, Future[CheckReport]] = {}

    def submit(self, seeds: list[int]) -> None:
        if self._pool is None:
            # spawn: the pytest process may hold deltalake's runtime threads, and a forked
            # copy of them hangs
            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=ctx)
        for seed in seeds:
            if seed not in self._futures:
                self._futures[seed] = self._pool.submit(
                    _run_one, seed, str(self.workdir), self.kwargs
                )

    def result(self, seed: int) -> CheckReport:
        self.submit([seed])
        return self._futures[seed].result()

    def close(self) -> None:
        if self._pool is not None:  # after -x: seeds not started yet are dropped
            self._pool.shutdown(wait=True, cancel_futures=True)


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
) -> Iterator[RunSeed]:
    """A session fixture's body: every collected seed of ``test_name`` starts at once, ``jobs``
    of them running at a time."""
    workdir = tmp_path_factory.mktemp(name)
    if jobs <= 1:
        yield lambda seed: run_check(seed, workdir, **kwargs)
        return
    pool = SeedPool(workdir, kwargs, jobs)
    pool.submit(collected_seeds(request.session, test_name))
    try:
        yield pool.result
    finally:
        pool.close()
