"""The consumer inbox forgets what nothing needs any more, on SQLite and PostgreSQL: the pruning
contract on the SQL inbox, a running consumer pruning its own inbox at most once an hour by its
clock, and ``outbox maintain`` pruning every consumer's (560 ids handled stayed 560 after
``outbox maintain`` before), never a live claim."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from dispatcher.queue import Consumer, QueueMessage, SqlQueue
from dispatcher.queue.inbox import Inbox, SqlInbox
from dispatcher.queue.inbox_pruning import PRUNE_EVERY
from migrations.sql.tables import inbox as inbox_table
from outbox.app.cli import main
from outbox.core.clock import ManualClock
from outbox.core.errors import ConfigurationError
from tests.queue.inbox_pruning import InboxPruningContract

DAY = timedelta(days=1)
WEEK = 7 * DAY


class TestSqlInboxPruning(InboxPruningContract):
    @pytest.fixture(autouse=True)
    def _queue(self, queue: SqlQueue) -> None:
        self.queue = queue

    def make_inbox(self, consumer: str) -> Inbox:
        return SqlInbox(self.queue.database, consumer)


def _rows(queue: SqlQueue, consumer: str | None = None) -> int:
    stmt = select(func.count()).select_from(inbox_table)
    if consumer is not None:
        stmt = stmt.where(inbox_table.c.consumer == consumer)
    with queue.database.read("count") as conn:
        return int(conn.execute(stmt).scalar_one())


def test_a_running_consumer_prunes_its_inbox_at_most_once_an_hour(
    queue: SqlQueue, clock: ManualClock
) -> None:
    consumer = Consumer(queue, "q", lambda _m: None, inbox="billing")
    billing, audit = SqlInbox(queue.database, "billing"), SqlInbox(queue.database, "audit")
    t0 = clock.now()
    queue.send("q", QueueMessage(b"", message_id="m1"))
    assert consumer.run_once() == 1  # it pruned first: nothing was old yet
    billing.record("ancient", at=t0 - WEEK - timedelta(days=1))
    audit.record("ancient", at=t0 - WEEK - timedelta(days=1))  # another consumer's
    clock.advance((PRUNE_EVERY - timedelta(minutes=1)).total_seconds())
    consumer.run_once()
    assert billing.handled("ancient")  # not due: it pruned less than an hour ago
    clock.advance(120)
    consumer.run_once()
    assert not billing.handled("ancient")
    assert billing.handled("m1")  # handled 61 minutes ago
    assert audit.handled("ancient")  # a consumer prunes only its own
    clock.advance(WEEK.total_seconds())
    consumer.run_once()
    assert not billing.handled("m1")
    assert consumer.pruner is not None
    assert consumer.pruner.pruned == 2
    assert _rows(queue, "billing") == 0


def test_a_consumers_retention_may_not_be_shorter_than_duplicate_detection(
    queue: SqlQueue,
) -> None:
    with pytest.raises(ConfigurationError, match=r"inbox_retention 5m00s is shorter than the"):
        Consumer(queue, "q", lambda _m: None, inbox=True, inbox_retention=300)
    Consumer(queue, "q", lambda _m: None, inbox=True, inbox_retention=600)  # the window: fine
    Consumer(queue, "q", lambda _m: None, inbox_retention=300)  # no inbox: nothing to prune


# --- outbox maintain -------------------------------------------------------------------------


def test_outbox_maintain_prunes_every_consumers_old_records_but_no_live_claim(
    tmp_path: Path,
) -> None:
    """The issue's numbers: 560 ids handled a week and a day ago, 40 yesterday, and a claim
    taken now; ``outbox maintain`` (the real clock, days of margin) deletes the 560."""
    ws = tmp_path / "ws"
    assert CliRunner().invoke(main, ["-w", str(ws), "migrate"]).exit_code == 0
    url = f"sqlite:///{ws / 'outbox.db'}"
    now = datetime.now(UTC)
    with SqlQueue(url) as queue:
        for consumer, count, ago in [("billing", 560, WEEK + DAY), ("audit", 40, DAY)]:
            inbox = SqlInbox(queue.database, consumer)
            with queue.database.write("record handled ids") as conn:  # one commit, as fast
                for i in range(count):
                    inbox.record_in(conn, f"{consumer}-{i}", at=now - ago)
    with SqlQueue(url) as queue:
        live = SqlInbox(queue.database, "billing")
        assert live.claim("running", "p1", lease=timedelta(hours=1), at=now).won
        assert _rows(queue) == 601
    result = CliRunner().invoke(main, ["-w", str(ws), "maintain", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["inbox_records_deleted"] == 560
    assert report["inbox_retention_s"] == WEEK.total_seconds()
    with SqlQueue(url) as queue:
        assert _rows(queue) == 41
        assert SqlInbox(queue.database, "audit").handled("audit-0")
        held = SqlInbox(queue.database, "billing").claim(
            "running", "p2", lease=timedelta(hours=1), at=now
        )
        assert held.held
    text = CliRunner().invoke(main, ["-w", str(ws), "maintain"])
    assert text.exit_code == 0, text.output
    lines = {ln.split()[0]: ln.split()[1:] for ln in text.stdout.splitlines() if ln.strip()}
    assert lines["inbox_records_deleted"] == ["0"]
    assert lines["inbox_retention_s"] == ["604800.0"]
