"""Per-session order across two regions through the whole outbox, while the claim log is locked
(issue 42, item 1).

Two regions (a SQLite queue each), one SQL claim log, a consumer process per region recording
when each handler begins and ends; a writer process with immediate dispatch through the geo
transport and a command worker beside it. 16 documents with two messages each, on four sessions
shared across the documents, in two batches (documents are created in one unit of work and
get their second message in a later one). Another process holds the claim log's file with
``BEGIN EXCLUSIVE`` while each batch is written (so every one of its sends fails after
``claim_log_timeout``), and through the second outage until the worker has tried the oldest
retry commands three times. Every message is handled once, and no handler of a session's message
begins before the handler of the message committed before it in that session has ended.

Each document gets its two messages in two units of work, the second right after the next
document of its session was created: a session's line reads A-1, B-1, A-2. The mutation lets the
gate's document's later message through with the gate (the defect the issue found: A-2 went out
with A-1, ahead of B-1), and a session's later message is handled first.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from outbox.app.facade import Outbox
from tests.claims import geo_order_procs as procs

pytestmark = pytest.mark.slow
ctx = multiprocessing.get_context("spawn")
#: Two batches of eight documents (of 15 before issue 43's suite time): two documents of each
#: session a batch, so every session's line reads A-1, B-1, A-2 within each outage.
BATCHES, PER_BATCH = 2, 8
TOTAL = 2 * BATCHES * PER_BATCH  # two messages a document
DEADLINE = 300.0


def _wait(condition: Any, what: str, children: list[Any], timeout: float = DEADLINE) -> None:
    end = time.monotonic() + timeout
    while not condition():
        dead = [p.name for p in children if p.exitcode not in (None, 0)]
        assert not dead, f"{dead} died while waiting for {what}"
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def _sent_by(batch: int) -> int:
    """Messages the writer has committed once ``batch`` is written (before the last batch): a
    first message per document, and a second for every document four places back."""
    created = batch * PER_BATCH
    return created + max(0, created - 4)


def _most_tries(ws: Path) -> int:
    from dispatcher.queue.sql_queue import SqlQueue

    queue = SqlQueue(f"sqlite:///{ws / 'outbox.db'}")
    try:
        return max((m.delivery_count for m in queue.peek("outbox-commands", 1000)), default=0)
    finally:
        queue.close()


class Proof:
    def __init__(self, root: Path, migrated_sqlite: Any) -> None:
        self.root = root
        self.urls = {n: migrated_sqlite(root / f"{n}.db") for n in ("east", "west", "claims")}
        self.runs_path = str(root / "runs.db")
        self.runs = procs.runs_engine(self.runs_path)
        self.ws = root / "ws"
        Outbox.open(self.ws, transport="memory").close()  # the table and the command queue
        self.procs: list[Any] = []

    def start(self, target: Any, *args: Any) -> Any:
        p = ctx.Process(target=target, args=args)
        p.start()
        self.procs.append(p)
        return p

    def handled(self) -> int:
        with self.runs.connect() as c:
            done = c.execute(
                select(procs.runs.c.message_id).where(procs.runs.c.ended.is_not(None)).distinct()
            )
            return len(done.all())

    def claims_working(self) -> int:
        """Claims held by a handler now (a completed handler's claim is completed)."""
        with sqlite3.connect(self.urls["claims"].removeprefix("sqlite:///")) as c:
            return int(
                c.execute("SELECT count(*) FROM outbox_claims WHERE status = 'working'").fetchone()[
                    0
                ]
            )

    def report(self) -> tuple[int, int]:
        """(order violations, duplicate handler runs)."""
        with self.runs.connect() as c:
            rows = c.execute(select(procs.runs)).all()
        first_begin: dict[tuple[str, int], float] = {}
        first_end: dict[tuple[str, int], float] = {}
        done: dict[str, int] = {}
        for r in rows:
            k = (r.session_id, r.i)
            first_begin[k] = min(first_begin.get(k, r.began), r.began)
            if r.ended is not None:
                first_end[k] = min(first_end.get(k, r.ended), r.ended)
                done[r.message_id] = done.get(r.message_id, 0) + 1
        violations = sum(
            1
            for (s, i), began in first_begin.items()
            if (s, i - 1) in first_end and began < first_end[(s, i - 1)]
        )
        return violations, sum(n - 1 for n in done.values())

    def close(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(30)
        self.runs.dispose()


@pytest.fixture
def proof(tmp_path: Path, migrated_sqlite: Any) -> Iterator[Proof]:
    p = Proof(tmp_path, migrated_sqlite)
    yield p
    p.close()


def run(proof: Proof, *, mutation: str = "") -> tuple[int, int]:
    root, urls = proof.root, proof.urls
    phases = root / "phases"
    phases.mkdir()
    regions = [
        proof.start(procs.region, name, urls, proof.runs_path, str(root / f"ready-{name}"))
        for name in ("east", "west")
    ]
    _wait(
        lambda: all((root / f"ready-{n}").exists() for n in ("east", "west")),
        "the regions",
        regions,
    )
    worker = proof.start(procs.worker, str(proof.ws), urls, str(root / "stop"), mutation)
    shape = (BATCHES, PER_BATCH)
    writer = proof.start(procs.writer, str(proof.ws), urls, str(phases), shape, mutation)
    everyone = [*regions, worker, writer]
    for b in range(1, BATCHES + 1):
        if b > 1:
            # The outage starts once every message sent so far is handled and its claim
            # completed: a handler the outage catches between its end and its claim's
            # completion runs again once its lease ends (the window ``claimed`` documents),
            # which is not what this proof is about.
            sent = _sent_by(b - 1)
            _wait(lambda n=sent: proof.handled() == n, f"batch {b - 1} handled", everyone)
            _wait(lambda: proof.claims_working() == 0, f"batch {b - 1} settled", everyone)
        locked, release = root / f"locked-{b}", root / f"release-{b}"
        proof.start(
            procs.locker, urls["claims"].removeprefix("sqlite:///"), str(locked), str(release)
        )
        _wait(locked.exists, f"the claim log locked ({b})", everyone)
        (phases / f"go-{b}").touch()
        _wait((phases / f"wrote-{b}").exists, f"batch {b} written", everyone)
        if b == BATCHES:
            # A longer outage: the oldest retry commands back off past a new one's delay.
            _wait(lambda: _most_tries(proof.ws) >= 3, "three tries of a command", everyone)
        release.touch()
    _wait(lambda: proof.handled() == TOTAL, "every message handled", everyone)
    with Outbox.open(proof.ws, create=False, transport="memory") as ob:
        _wait(lambda: ob.store.scan_pending().num_rows == 0, "nothing pending", everyone)
    (root / "stop").touch()
    return proof.report()


def test_a_sessions_messages_are_handled_in_commit_order_through_claim_log_outages(
    proof: Proof,
) -> None:
    violations, duplicates = run(proof)
    assert (violations, duplicates) == (0, 0)


def test_with_a_gate_that_lets_its_documents_later_messages_through_the_order_breaks(
    proof: Proof,
) -> None:
    """The mutation (``tests.mutate``, applied in the writer and the worker): A-1 is a
    session's gate and B-1 waits behind it; A-2, committed after B-1, leaves with A-1."""
    violations, _ = run(proof, mutation="gate-lets-its-document-through")
    assert violations > 0
