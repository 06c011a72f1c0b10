"""Ids that leave the database are never handed out twice (revision 0007), on SQLite and
PostgreSQL: a message's sequence number after the newest message was completed, a dead letter's
id after the newest dead letter was requeued (the console's frozen "purge all matching" then
purged a dead letter nobody had seen), and both across the upgrade of a 0006 database whose
newest rows were deleted before it."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, insert, select, text

from dispatcher.queue.browse import DeadLetterFilter
from dispatcher.queue.messages import QueueMessage
from dispatcher.queue.sql_queue import SqlQueue
from migrations.sql import _config, upgrade
from migrations.sql.tables import dead_letters as D
from migrations.sql.tables import metadata
from migrations.sql.tables import queue_messages as M
from outbox.core.clock import ManualClock
from outbox.core.sql import make_engine


def _send(queue: SqlQueue, *ids: str, to: str = "q") -> None:
    for mid in ids:
        queue.send(to, QueueMessage(b"x", message_id=mid))


def _dead_letter(queue: SqlQueue, *ids: str, to: str = "q") -> dict[str, int]:
    """Send ``ids`` to ``to`` and dead-letter each; its dead letter ids by message id."""
    _send(queue, *ids, to=to)
    for m in queue.receive(to, len(ids)):
        queue.dead_letter(m, "Poison")
    return {d.message_id: d.id for d in queue.list_dead_letters(to)}


def test_a_completed_newest_messages_sequence_number_is_not_reused(queue: SqlQueue) -> None:
    """The issue's sequence: m0, m1, m2 get 1, 2, 3; m2 is received and completed; m-new got 3
    again on SQLite. Service Bus promises unique, increasing sequence numbers."""
    _send(queue, "m0", "m1", "m2")
    got = {m.message_id: m for m in queue.receive("q", 3)}
    assert [got[k].sequence_number for k in ("m0", "m1", "m2")] == [1, 2, 3]  # a new database
    queue.complete(got["m2"])
    _send(queue, "m-new")
    [new] = [p for p in queue.peek("q", 10) if p.message_id == "m-new"]
    assert new.sequence_number > 3


def test_a_requeued_newest_dead_letters_id_is_not_reused(queue: SqlQueue) -> None:
    """The console freezes "purge all matching" at the newest id N; N is requeued elsewhere (the
    CLI, another tab) and a new matching dead letter arrives: it got id N on SQLite, and the
    confirmed purge removed it, a dead letter the operator never saw."""
    before = _dead_letter(queue, "d0", "d1", "d2")
    assert sorted(before.values()) == [1, 2, 3]
    poison = DeadLetterFilter(queue="q", reason="Poison")
    frozen = replace(poison, up_to_id=queue.browse.newest_id(poison))
    confirmed = queue.browse.count(frozen)
    assert queue.requeue([before["d2"]]) == 1  # someone else requeues the newest
    [back] = queue.receive("q")
    queue.complete(back)
    after = _dead_letter(queue, "d-new")
    assert after["d-new"] > 3
    assert (
        queue.admin.purge_matching(frozen) == confirmed - 1
    )  # d0 and d1: what was shown, still here
    assert [d.message_id for d in queue.list_dead_letters("q")] == ["d-new"]


def test_a_purged_newest_dead_letters_id_is_not_reused(queue: SqlQueue) -> None:
    """``outbox dead-letters requeue ID`` acts on the id the operator listed, not on a dead
    letter that took a purged one's id."""
    before = _dead_letter(queue, "d0", "d1")
    assert queue.purge([before["d1"]]) == 1
    after = _dead_letter(queue, "d-new")
    assert after["d-new"] not in before.values()


# --- the upgrade of a 0006 database ---------------------------------------------------------

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _at_0006(url: str) -> Engine:
    from alembic import command

    engine = make_engine(url)
    cfg = _config()
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0006_console")
        conn.commit()
    return engine


def _message(mid: str) -> dict[str, object]:
    return {
        "queue": "q",
        "message_id": mid,
        "body": b"x",
        "subject": "",
        "content_type": "",
        "headers": "{}",
        "enqueued_at": T0,
        "not_before": T0,
        "delivery_count": 0,
    }


def _dead(mid: str, seq: int) -> dict[str, object]:
    return {
        **{k: v for k, v in _message(mid).items() if k != "not_before"},
        "sequence_number": seq,
        "reason": "Poison",
        "description": "",
        "dead_lettered_at": T0,
    }


def test_the_upgrade_keeps_every_row_and_id_and_reuses_none_deleted_before_it(
    sql_url: str,
) -> None:
    """At 0006, as a queue leaves it: messages 1-6 sent, 4-6 dead-lettered (dead letters 1-3
    keep their sequence numbers), 3 completed, dead letter 3 purged. Sequence numbers 3 and 6
    and dead letter id 3 were handed out and left no trace above what remains. After the
    upgrade every row keeps its id, and nothing new takes a number handed out before it."""
    engine = _at_0006(sql_url)
    try:
        with engine.begin() as conn:
            conn.execute(insert(M).values([_message(f"m{i}") for i in range(1, 7)]))
            conn.execute(insert(D).values([_dead(f"m{i}", i) for i in range(4, 7)]))
            conn.execute(M.delete().where(M.c.sequence_number.in_([3, 4, 5, 6])))
            conn.execute(D.delete().where(D.c.id == 3))
        with engine.connect() as conn:
            kept_m = sorted(conn.execute(select(M.c.message_id, M.c.sequence_number)).all())
            kept_d = sorted(conn.execute(select(D.c.id, D.c.sequence_number)).all())
        assert kept_m == [("m1", 1), ("m2", 2)]
        assert kept_d == [(1, 4), (2, 5)]
        applied = upgrade(engine)
        assert applied[0] == (
            "sql schema: applied 0007_unique_ids (Sequence numbers and dead letter ids are "
            "never reused.)"
        )
        with engine.connect() as conn:
            assert sorted(conn.execute(select(M.c.message_id, M.c.sequence_number)).all()) == (
                kept_m
            )
            assert sorted(conn.execute(select(D.c.id, D.c.sequence_number)).all()) == kept_d
    finally:
        engine.dispose()
    queue = SqlQueue(sql_url, clock=ManualClock(T0))
    try:
        _send(queue, "m-new")
        [new] = [p for p in queue.peek("q", 10) if p.message_id == "m-new"]
        assert new.sequence_number > 6
        after = _dead_letter(queue, "d-new", to="other")
        assert after["d-new"] > 3
        assert {p.message_id for p in queue.peek("q", 10)} == {"m1", "m2", "m-new"}
    finally:
        queue.close()


def test_a_new_database_numbers_from_one(sql_url: str) -> None:
    """The jump in ``migrations.sql.ids`` is for databases with a history; a database created
    by this upgrade has handed out nothing."""
    upgrade(sql_url)
    queue = SqlQueue(sql_url, clock=ManualClock(T0))
    try:
        _send(queue, "a")
        assert [p.sequence_number for p in queue.peek("q")] == [1]
        assert list(_dead_letter(queue, "b").values()) == [1]
    finally:
        queue.close()


@pytest.mark.parametrize("table", ["outbox_queue_messages", "outbox_queue_dead_letters"])
def test_the_migrated_sqlite_table_is_the_tables_modules_autoincrement_table(
    tmp_path: Path, table: str
) -> None:
    """``compare_metadata`` does not compare ``AUTOINCREMENT``: the migrated table's SQL must
    carry it exactly where ``migrations.sql.tables`` asks for it."""
    url = f"sqlite:///{tmp_path}/outbox.db"
    upgrade(url)
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ddl = conn.execute(
                text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :t"),
                {"t": table},
            ).scalar_one()
    finally:
        engine.dispose()
    assert metadata.tables[table].dialect_options["sqlite"]["autoincrement"] is True
    assert "AUTOINCREMENT" in ddl


def test_a_downgrade_to_0006_keeps_the_rows(tmp_path: Path) -> None:
    from alembic import command

    url = f"sqlite:///{tmp_path}/outbox.db"
    upgrade(url)
    queue = SqlQueue(url, clock=ManualClock(T0))
    _send(queue, "a", "b")
    queue.close()
    engine = make_engine(url)
    try:
        cfg = _config()
        with engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0006_console")
            conn.commit()
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT message_id, sequence_number FROM " + M.name)).all()
            ddl = conn.execute(
                text("SELECT sql FROM sqlite_master WHERE name = :t"), {"t": M.name}
            ).scalar_one()
        assert sorted(rows) == [("a", 1), ("b", 2)]
        assert "AUTOINCREMENT" not in ddl
    finally:
        engine.dispose()
