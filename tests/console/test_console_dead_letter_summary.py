"""Dead letters counted per queue and reason, with each queue's count over time (issue 46, item
3), on SQLite and PostgreSQL: the sample records the count per queue, the summary page shows the
counts now (each linked to its list) and the trend from the samples."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
from flask.testing import FlaskClient

from dispatcher.queue.sql_queue import SqlQueue
from migrations.sql.tables import samples
from outbox.app import history as H
from outbox.app.sampling import take_sample
from outbox.core.clock import SystemClock, utc
from outbox.core.settings import Settings
from tests.console.conftest import ConsoleWorkspace, console_client


@pytest.fixture
def client(console_ws: ConsoleWorkspace) -> Iterator[FlaskClient]:
    yield from console_client(console_ws)


def test_a_sample_counts_the_dead_letters_of_each_queue(console_ws: ConsoleWorkspace) -> None:
    taken = take_sample(Settings.load(console_ws.path), SystemClock())
    counts = {s.subject: s.value for s in taken if s.metric == H.DEAD_LETTERS}
    assert counts == {"shipments": 3, "invoices": 1}


def test_the_summary_counts_by_queue_and_reason_with_links(client: FlaskClient) -> None:
    page = client.get("/dead-letters/summary").get_data(as_text=True)
    for queue, reason, n in (("shipments", "Poison", 3), ("invoices", "Timeout", 1)):
        link = f'href="/dead-letters\\?queue={queue}&amp;reason={reason}">{n}</a>'
        assert re.search(f"<td>{queue}</td>.*?{link}", page, re.S), queue
    assert '<th class="num" id="grand-total">4</th>' in page
    assert 'id="no-trend"' in page  # nothing sampled yet


def test_the_trend_comes_from_the_samples(
    client: FlaskClient, console_ws: ConsoleWorkspace
) -> None:
    now = utc(SystemClock().now())
    rows = [
        {
            "metric": H.DEAD_LETTERS,
            "subject": queue,
            "taken_at_s": int(H.slot_start(now - timedelta(minutes=30 - k), 60).timestamp()),
            "value": float(base + k),
            "source": "test",
        }
        for k in range(30)
        for queue, base in (("shipments", 100), ("invoices", 5))
    ]
    with SqlQueue(console_ws.url) as q, q.database.write("samples") as conn:
        conn.execute(samples.insert(), rows)
    page = client.get("/dead-letters/summary?range=1h").get_data(as_text=True)
    assert '<svg id="dead-letter-chart"' in page
    assert "<title>shipments</title>" in page
    assert "<title>invoices</title>" in page
    ticks = re.findall(r'text-anchor="end">([^<]+)</text>', page)
    assert "0" in ticks
    assert all("s" not in t for t in ticks if t != "0")  # counts, not durations
