"""Dead letters requeued into another queue and held to a rate (issue 46, item 3), on SQLite and
PostgreSQL: the pacer's waits on an injected clock, a paced requeue running as a console job
with its progress page and its audit record, a requeue into another queue, bad input as one
line, and the same through the CLI (``--to``, ``--rate``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta

import pytest
from click.testing import CliRunner
from flask.testing import FlaskClient

from dispatcher.queue.sql_queue import SqlQueue
from outbox.app.cli import main
from outbox.core.clock import ManualClock
from outbox.core.pacing import Pacer
from tests.console.conftest import ConsoleWorkspace, console_client, csrf_of, unlock

CLOCK_START = ManualClock().now()


def test_the_pacer_waits_what_the_rate_allows_and_never_makes_up_for_lateness() -> None:
    clock = ManualClock(CLOCK_START)
    pacer = Pacer(100, clock)
    assert pacer.chunk() == 100
    for _ in range(5):
        pacer.step(100)  # each step takes no time of its own: the pacer waits 1 s
    assert clock.now() - CLOCK_START == timedelta(seconds=5)
    clock.advance(10)  # a slow step: behind by far, no wait, and no burst after it
    pacer.step(100)
    assert clock.now() - CLOCK_START == timedelta(seconds=15)
    pacer.step(50)
    assert clock.now() - CLOCK_START == timedelta(seconds=15.5)
    assert Pacer(0.5, clock).chunk() == 1


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(CLOCK_START)


@pytest.fixture
def client(console_ws: ConsoleWorkspace, clock: ManualClock) -> Iterator[FlaskClient]:
    yield from console_client(console_ws, clock=clock)


def _queued(ws: ConsoleWorkspace, name: str) -> list[str]:
    with SqlQueue(ws.url) as q:
        return sorted(m.message_id for m in q.peek(name, 100))


def test_a_paced_requeue_runs_as_a_job_with_its_progress_and_audit(
    client: FlaskClient, console_ws: ConsoleWorkspace, clock: ManualClock
) -> None:
    csrf = unlock(client)
    form = {"csrf": csrf, "scope": "matching", "action": "requeue", "queue": "shipments"}
    confirm = client.post("/dead-letters/confirm", data=form).get_data(as_text=True)
    assert 'id="to-queue"' in confirm
    assert 'id="rate"' in confirm
    up_to = max(i for i, (q, _m) in console_ws.dead.items() if q == "shipments")
    r = client.post(
        "/dead-letters/apply",
        data={**form, "up_to": str(up_to), "to_queue": "retry", "rate": "1"},
    )
    assert r.status_code == 302
    assert r.headers["Location"].endswith("/jobs/1")
    [job] = client.application.extensions["outbox_jobs"].all()
    assert job.thread is not None
    job.thread.join(60)
    assert (job.state, job.done, job.total) == ("done", 3, 3)
    # one dead letter a step at 1 a second: three waits of a second on the console's clock
    assert clock.now() - CLOCK_START == timedelta(seconds=3)
    assert _queued(console_ws, "retry") == ["ship-0", "ship-1", "ship-2"]
    assert _queued(console_ws, "shipments") == []
    page = client.get("/jobs/1").get_data(as_text=True)
    assert 'id="state">done<' in page
    assert "3 of 3" in page
    assert 'http-equiv="refresh"' not in page  # finished: no more refreshing
    assert "requeue 3 dead letters into retry" in client.get("/jobs").get_data(as_text=True)
    trail = json.loads(
        CliRunner().invoke(main, ["-w", str(console_ws.path), "audit", "--json"]).stdout
    )
    assert trail[0]["action"] == "dead-letters.requeue"
    assert trail[0]["outcome"] == "3 requeued at 1/s"
    assert trail[0]["target"].endswith("into retry at 1/s")
    assert client.get("/jobs/99").status_code == 404


def test_a_requeue_into_another_queue_and_bad_options(
    client: FlaskClient, console_ws: ConsoleWorkspace
) -> None:
    csrf = unlock(client)
    [inv] = [i for i, (_q, m) in console_ws.dead.items() if m == "inv-0"]
    base = {"csrf": csrf, "scope": "selected", "action": "requeue", "id": str(inv)}
    for bad in ({"rate": "fast"}, {"rate": "0"}, {"rate": "1e9"}, {"to_queue": "no queue!"}):
        assert client.post("/dead-letters/apply", data={**base, **bad}).status_code == 400
    done = client.post("/dead-letters/apply", data={**base, "to_queue": "invoices-retry"},
                       follow_redirects=True)  # fmt: skip
    assert "1 dead letter requeued." in done.get_data(as_text=True)
    assert _queued(console_ws, "invoices-retry") == ["inv-0"]
    assert csrf_of(client)  # the page still renders


def test_the_cli_requeues_into_another_queue_at_a_rate(console_ws: ConsoleWorkspace) -> None:
    r = CliRunner().invoke(
        main,
        ["-w", str(console_ws.path), "dead-letters", "--sql", "requeue", "--where",
         "queue=shipments", "--to", "retry", "--rate", "1000"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "requeued 3 dead letter(s)" in r.stdout
    assert _queued(console_ws, "retry") == ["ship-0", "ship-1", "ship-2"]
    bad = CliRunner().invoke(
        main, ["-w", str(console_ws.path), "dead-letters", "--sql", "requeue", "--all",
               "--rate", "0"],
    )  # fmt: skip
    assert bad.exit_code != 0
    trail = json.loads(
        CliRunner().invoke(main, ["-w", str(console_ws.path), "audit", "--json"]).stdout
    )
    assert trail[0]["target"] == "every dead letter matching queue=shipments into retry at 1000/s"
