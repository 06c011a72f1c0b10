"""Bad input gets a clear error; an unreachable or un-migrated database gets a clear one too; the
database going away mid-operation is retryable and loses nothing."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dispatcher.queue import QueueMessage, SqlQueue
from dispatcher.queue.messages import ReceivedMessage
from dispatcher.transports.base import TransportMessage
from dispatcher.transports.sql import SqlQueueTransport
from migrations.sql import current_revision, head_revision, upgrade
from outbox.core.clock import ManualClock
from outbox.core.errors import (
    ConfigurationError,
    MessageTooLargeError,
    PermanentTransportError,
    QueueError,
    QueueUnavailableError,
    RetryableTransportError,
    ValidationError,
)
from tests.pg import PostgresServer

BAD_SENDS: list[tuple[str, Any, type[Exception], str]] = [
    ("q", QueueMessage(b"x" * 1025), MessageTooLargeError, "over the 1024-byte limit"),
    ("q", QueueMessage(123), ValidationError, "body must be bytes or str"),  # type: ignore[arg-type]
    ("", QueueMessage(b"x"), ValidationError, "invalid queue name"),
    ("-q", QueueMessage(b"x"), ValidationError, "invalid queue name"),
    ("q q", QueueMessage(b"x"), ValidationError, "invalid queue name"),
    ("q" * 261, QueueMessage(b"x"), ValidationError, "invalid queue name"),
    ("q", QueueMessage(b"x", message_id=""), ValidationError, "invalid message_id"),
    ("q", QueueMessage(b"x", message_id="m" * 129), ValidationError, "invalid message_id"),
    ("q", QueueMessage(b"x", session_id=""), ValidationError, "invalid session_id"),
    ("q", QueueMessage(b"x", headers={"a": object()}), ValidationError, "not JSON"),
    (
        "q",
        QueueMessage(b"x", not_before=datetime(2026, 1, 1)),
        ValidationError,
        "timezone-aware",
    ),
    ("q", "not a message", ValidationError, "expected a QueueMessage"),
]


def test_bad_sends(queue: SqlQueue) -> None:
    for queue_name, message, error, text in BAD_SENDS:
        with pytest.raises(error, match=text):
            queue.send(queue_name, message)
    assert queue.stats() == {}


def _received(token: str) -> ReceivedMessage:
    return ReceivedMessage(
        queue="q",
        message_id="m",
        body=b"x",
        sequence_number=1,
        enqueued_at=datetime.now(),
        delivery_count=1,
        lock_token=token,
        locked_until=None,
    )


def test_lock_token_of_the_wrong_shape(queue: SqlQueue) -> None:
    for token in ["", "nope", "1234", "g" * 36]:
        with pytest.raises(ValidationError, match="invalid lock token"):
            queue.complete(token)
        with pytest.raises(ValidationError, match="invalid lock token"):
            queue.abandon(_received(token))


def test_other_bad_calls(queue: SqlQueue) -> None:
    queue.send("q", QueueMessage(b"x"))
    [m] = queue.receive("q")
    with pytest.raises(ValidationError, match="invalid delay"):
        queue.abandon(m, delay=-1)
    with pytest.raises(ValidationError, match="max_messages"):
        queue.receive("q", 0)
    with pytest.raises(ValidationError, match="dead-letter reason"):
        queue.dead_letter(m, "")
    with pytest.raises(ValidationError, match="invalid queue name"):
        queue.peek("bad name")
    queue.complete(m)  # nothing above changed the message


@pytest.mark.parametrize(
    ("url", "error", "text"),
    [
        ("mysql://u@h/db", ConfigurationError, "not supported"),
        ("nonsense", ConfigurationError, "not a database URL"),
        ("sqlite:///:memory:", ConfigurationError, "in-memory"),
        ("sqlite:////no/such/folder/x.db", QueueError, r"does not exist.*outbox migrate"),
        ("postgresql+psycopg://u@127.0.0.1:1/db", QueueUnavailableError, "unreachable"),
    ],
)
def test_bad_urls(url: str, error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        SqlQueue(url)


def test_missing_or_unmigrated_database_says_migrate(tmp_path: Path) -> None:
    with pytest.raises(QueueError, match="outbox migrate"):
        SqlQueue(f"sqlite:///{tmp_path / 'missing.db'}")
    (tmp_path / "empty.db").touch()
    with pytest.raises(QueueError, match=r"not migrated.*outbox migrate"):
        SqlQueue(f"sqlite:///{tmp_path / 'empty.db'}")


def test_upgrade_is_idempotent(sql_url: str) -> None:
    assert current_revision(sql_url) is None
    assert upgrade(sql_url) == [  # a new database: created at the head (test_fresh_schema.py)
        f"sql schema: created at {head_revision()} (a new database: the newest schema at once, "
        "not revision by revision)"
    ]
    assert upgrade(sql_url) == []
    assert current_revision(sql_url) == head_revision()


def test_schema_matches_the_tables_module(migrated_url: str) -> None:
    """The Alembic revision and migrations.sql.tables must describe the same schema."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from migrations.sql.tables import metadata
    from outbox.core.sql import make_engine

    engine = make_engine(migrated_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    engine.dispose()
    diff = [d for d in diff if not (isinstance(d, tuple) and "outbox_sql_version" in str(d))]
    assert diff == []


# --- transport mapping ---------------------------------------------------------------------------


def test_transport_maps_every_field(queue: SqlQueue, clock: ManualClock) -> None:
    transport = SqlQueueTransport(queue)
    at = clock.now() + timedelta(seconds=5)
    transport.send(
        [
            TransportMessage(
                message_id="t1",
                destination="shipments",
                body=b"{}",
                subject="Shipped",
                session_id="doc-1",
                scheduled_at=at,
                correlation_id="c",
                headers={"traceparent": "00-x"},
            ),
            TransportMessage(message_id="t2", destination="audit", body=b"{}"),
        ]
    )
    transport.send([TransportMessage(message_id="t2", destination="audit", body=b"{}")])  # dup
    clock.advance(5)
    [m] = queue.receive("shipments")
    assert (m.message_id, m.subject, m.session_id, m.correlation_id, m.headers) == (
        "t1",
        "Shipped",
        "doc-1",
        "c",
        {"traceparent": "00-x"},
    )
    assert m.content_type == "application/json"
    assert len(queue.peek("audit")) == 1


def test_transport_classifies_errors(queue: SqlQueue) -> None:
    transport = SqlQueueTransport(queue)
    good = TransportMessage(message_id="ok", destination="q", body=b"x")
    with pytest.raises(PermanentTransportError) as e1:
        transport.send(
            [good, TransportMessage(message_id="big", destination="q", body=b"x" * 2000)]
        )
    assert e1.value.message_id == "big"
    with pytest.raises(PermanentTransportError) as e2:
        transport.send([TransportMessage(message_id="d", destination="no good", body=b"x")])
    assert e2.value.message_id == "d"
    assert queue.stats() == {}  # nothing of a refused batch was stored


# --- the database goes away ---------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.slow
def test_postgres_goes_away_and_comes_back(
    pg_server: PostgresServer | str, pg_url: str, clock: ManualClock
) -> None:
    if isinstance(pg_server, str):
        pytest.skip("needs the test-managed PostgreSQL server to stop it")
    upgrade(pg_url)
    queue = SqlQueue(pg_url, clock=clock)
    transport = SqlQueueTransport(queue)
    queue.send("q", [QueueMessage(b"1", message_id="m1"), QueueMessage(b"2", message_id="m2")])
    [held] = queue.receive("q")
    pg_server.stop("immediate")  # pooled connections now point at a dead server
    try:
        with pytest.raises(QueueUnavailableError, match=r"unreachable.*nothing was lost") as e:
            queue.send("q", QueueMessage(b"3", message_id="m3"))
        assert e.value.retryable
        with pytest.raises(QueueUnavailableError):
            queue.receive("q")
        with pytest.raises(QueueUnavailableError):
            queue.complete(held)
        with pytest.raises(RetryableTransportError) as te:
            transport.send([TransportMessage(message_id="m4", destination="q", body=b"4")])
        assert te.value.message_id == "m4"
    finally:
        pg_server.restart()
    # the same calls now succeed; nothing was lost and nothing doubled
    queue.send("q", QueueMessage(b"3", message_id="m3"))
    transport.send([TransportMessage(message_id="m4", destination="q", body=b"4")])
    queue.complete(held)
    assert [p.message_id for p in queue.peek("q", 10)] == ["m2", "m3", "m4"]
    queue.close()


def test_sqlite_file_removed_mid_run(tmp_path: Path, clock: ManualClock) -> None:
    """SQLite's version of "the database went away": the folder becomes unreadable."""
    folder = tmp_path / "db"
    folder.mkdir()
    url = f"sqlite:///{folder / 'q.db'}"
    upgrade(url)
    queue = SqlQueue(url, clock=clock)
    queue.send("q", QueueMessage(b"1", message_id="m1"))
    queue.engine.dispose()  # force new connections
    folder.rename(tmp_path / "moved")
    try:
        with pytest.raises(QueueError):
            queue.send("q", QueueMessage(b"2", message_id="m2"))
    finally:
        (tmp_path / "moved").rename(folder)
    assert [p.message_id for p in queue.peek("q")] == ["m1"]
    queue.close()


def test_transport_validates_each_message_once_and_a_closed_queue_is_retryable(
    queue: SqlQueue, migrated_url: str
) -> None:
    """Review item 11: one validation per message on the happy path; ClosedError is retryable."""
    calls: list[str] = []
    original = queue.sender._rows

    def counting(entries: Sequence[tuple[str, QueueMessage]], now: Any) -> Any:
        calls.extend(m.message_id for _, m in entries)
        return original(entries, now)

    queue.sender._rows = counting  # type: ignore[method-assign]
    transport = SqlQueueTransport(queue)
    transport.send(
        [TransportMessage(message_id=f"m{i}", destination="q", body=b"x") for i in range(3)]
    )
    assert sorted(calls) == ["m0", "m1", "m2"]
    closed = SqlQueue(migrated_url)
    closed.close()
    with pytest.raises(RetryableTransportError) as e:
        SqlQueueTransport(closed).send(
            [TransportMessage(message_id="late", destination="q", body=b"x")]
        )
    assert e.value.message_id == "late"
    assert e.value.retryable


def test_each_message_keeps_its_own_headers_in_a_batch(queue: SqlQueue) -> None:
    """The sender reuses the previous message's encoded headers when they are equal (a unit of
    work's messages share one traceparent); never for headers that only compare equal."""
    same = {"traceparent": "00-aa-bb-01"}
    batch = [
        QueueMessage(b"1", message_id="h1", headers=dict(same)),
        QueueMessage(b"2", message_id="h2", headers=dict(same)),
        QueueMessage(b"3", message_id="h3", headers={"n": 1}),
        QueueMessage(b"4", message_id="h4", headers={"n": True}),  # True == 1 in Python
        QueueMessage(b"5", message_id="h5", headers={"traceparent": "00-cc-dd-01"}),
        QueueMessage(b"6", message_id="h6", headers={}),
    ]
    queue.send("q", batch)
    got = {m.message_id: m.headers for m in queue.receive("q", 10)}
    assert got == {
        "h1": same,
        "h2": same,
        "h3": {"n": 1},
        "h4": {"n": True},
        "h5": {"traceparent": "00-cc-dd-01"},
        "h6": {},
    }
    assert type(got["h4"]["n"]) is bool
