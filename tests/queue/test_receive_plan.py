"""A receive walks the receive index in order on PostgreSQL, whatever the statistics say.

A queue table's statistics are whatever autovacuum last saw, often a nearly empty table. Here
they are taken while the table is empty; then queue ``work`` gets a backlog. psycopg prepares a
statement on its fifth execution and PostgreSQL then settles on a generic plan, built from those
statistics: left to itself it reads all of ``work``'s rows and sorts them for each receive (a
bitmap scan and a sort, 5 ms per receive of 10 with 5,000 queued, by hand), so draining a backlog
takes quadratic time. The receiver pins the plan (``SET LOCAL`` in its transaction) to an ordered
walk of ``ix_outbox_queue_messages_receive`` that stops at the limit. The test reads the plan the
receiver's own connection caches for its prepared receive: without the pin it has a Sort.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from dispatcher.queue import QueueMessage, SqlQueue
from migrations.sql import upgrade
from outbox.core.sql import make_engine

pytestmark = pytest.mark.postgres


def test_receive_walks_the_index_in_order_with_stale_statistics(pg_url: str) -> None:
    upgrade(pg_url)
    engine = make_engine(pg_url)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text("VACUUM ANALYZE outbox_queue_messages"))  # statistics of an empty table
    engine.dispose()
    queue = SqlQueue(pg_url)
    for _ in range(10):
        queue.send("work", [QueueMessage(b"y" * 100) for _ in range(500)])
    for _ in range(12):  # past psycopg's prepare threshold and PostgreSQL's five custom plans
        for m in queue.receive("work", 10):
            queue.complete(m)

    with queue.engine.connect() as c:  # one thread: the one pooled connection that received
        prepared = c.exec_driver_sql(
            "SELECT name FROM pg_prepared_statements "
            "WHERE strpos(statement, 'SKIP LOCKED') > 0 AND generic_plans > 0"
        ).scalars()
        names = list(prepared)
        assert names, "the receive was not prepared; the test no longer reads its cached plan"
        plan = "\n".join(
            row[0] for row in c.exec_driver_sql(f"EXPLAIN EXECUTE {names[0]}('work', now(), 10)")
        )
    assert "ix_outbox_queue_messages_receive" in plan, plan
    for node in ("Sort", "Bitmap", "Seq Scan"):
        assert node not in plan, f"{node} in the receive's plan:\n{plan}"
    queue.close()
