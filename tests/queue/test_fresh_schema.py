"""A new database is created from ``migrations.sql.tables`` at the head revision, not through
every revision (``migrations.sql.upgrade``). The two paths must give the same database: compared
in full on SQLite (``sqlite_master``'s SQL, ``sqlite_sequence``) and PostgreSQL (tables, columns
in order with their types, defaults and nullability, indexes with their definitions,
constraints, sequences), with each table's rows and the version table's revision. The comparison
is shown to fail when the fresh path leaves out an index, a server default or ``AUTOINCREMENT``,
or when a revision does more than the tables module says. Two processes opening one new database
create it once; a database created this way takes a later revision as any other does."""

from __future__ import annotations

import shutil
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, MetaData, event, text
from sqlalchemy.engine import make_url

import migrations.sql as migrations_sql
from dispatcher.queue.messages import QueueMessage
from dispatcher.queue.sql_queue import SqlQueue
from migrations.sql import (
    PG_LOCK,
    VERSION_TABLE,
    _upgrade_by_revisions,
    current_revision,
    head_revision,
    upgrade,
)
from migrations.sql.tables import metadata
from outbox.core.clock import ManualClock
from outbox.core.errors import QueueError
from outbox.core.sql import LockWait, make_engine

Snapshot = dict[str, Any]


def created_line() -> str:
    return (
        f"sql schema: created at {head_revision()} (a new database: the newest schema at once, "
        "not revision by revision)"
    )


def by_revisions(url: str) -> list[str]:
    """Every revision in turn, as ``upgrade`` took a new database before the fresh path."""
    engine = make_engine(url)
    try:
        return _upgrade_by_revisions(engine)
    finally:
        engine.dispose()


# --- the snapshot of a database -------------------------------------------------------------


def snapshot(url: str) -> Snapshot:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            schema = _sqlite(conn) if engine.dialect.name == "sqlite" else _postgres(conn)
            tables = [n for n in schema["tables"] if n != "sqlite_sequence"]
            schema["rows"] = {
                t: conn.execute(text(f'SELECT count(*) FROM "{t}"')).scalar_one() for t in tables
            }
            if VERSION_TABLE in tables:
                schema["version"] = conn.execute(
                    text(f"SELECT version_num FROM {VERSION_TABLE}")
                ).all()
        return schema
    finally:
        engine.dispose()


def _sqlite(conn: Connection) -> Snapshot:
    """``sqlite_master`` but the pages; a table's SQL as it would be created. Why the one
    normalization: renaming a table (Alembic's batch mode ends with one) makes SQLite rewrite its
    name in ``sqlite_master`` quoted, ``CREATE TABLE "t" (``; the same table either way."""
    objects = []
    for kind, name, table, sql in conn.execute(
        text("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name")
    ):
        if kind == "table" and sql is not None:
            unquoted = sql.replace(f'CREATE TABLE "{name}" (', f"CREATE TABLE {name} (", 1)
            objects.append((kind, name, table, unquoted))
        else:
            objects.append((kind, name, table, sql))
    tables = [name for kind, name, _, _ in objects if kind == "table"]
    # An AUTOINCREMENT table's highest id ever used. A row at 0 and no row are one state (the
    # next id is 1): 0007's copy of an empty table leaves a row at 0, a new table has none.
    sequence = (
        conn.execute(
            text("SELECT name, seq FROM sqlite_sequence WHERE seq != 0 ORDER BY name")
        ).all()
        if "sqlite_sequence" in tables
        else None
    )
    # what a database holds beside its tables (no revision sets one: none may unnoticed)
    pragmas = {
        p: conn.exec_driver_sql(f"PRAGMA {p}").scalar()
        for p in ("user_version", "application_id", "auto_vacuum", "encoding")
    }
    return {"tables": tables, "objects": objects, "sqlite_sequence": sequence, "pragmas": pragmas}


def _postgres(conn: Connection) -> Snapshot:
    def rows(sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in conn.execute(text(sql))]

    here = "current_schema()"
    return {
        "tables": [
            r[0]
            for r in rows(
                "SELECT table_name FROM information_schema.tables "
                f"WHERE table_schema = {here} ORDER BY table_name"
            )
        ],
        # in order, not by number: a column a revision dropped leaves a gap in ordinal_position
        "columns": rows(
            "SELECT table_name, column_name, data_type, character_maximum_length, "
            "numeric_precision, datetime_precision, is_nullable, column_default, is_identity, "
            "collation_name FROM information_schema.columns "
            f"WHERE table_schema = {here} ORDER BY table_name, ordinal_position"
        ),
        "indexes": rows(
            "SELECT tablename, indexname, indexdef FROM pg_indexes "
            f"WHERE schemaname = {here} ORDER BY indexname"
        ),
        "constraints": rows(
            "SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid) "
            f"FROM pg_constraint WHERE connamespace = {here}::regnamespace ORDER BY conname"
        ),
        "sequences": rows(
            "SELECT sequencename, data_type::text, start_value, min_value, max_value, "
            "increment_by, cycle, last_value FROM pg_sequences "
            f"WHERE schemaname = {here} ORDER BY sequencename"
        ),
        # every relation's kind and storage: logged or not, its options (fillfactor...)
        "relations": rows(
            "SELECT relname, relkind, relpersistence, reloptions::text FROM pg_class "
            f"WHERE relnamespace = {here}::regnamespace ORDER BY relname"
        ),
        # which column owns each sequence (a serial's): DROP TABLE drops it with the table
        "owned": rows(
            "SELECT s.relname, t.relname, a.attname FROM pg_depend d "
            "JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S' "
            "JOIN pg_class t ON t.oid = d.refobjid "
            "JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = d.refobjsubid "
            f"WHERE d.deptype IN ('a', 'i') AND s.relnamespace = {here}::regnamespace "
            "ORDER BY s.relname"
        ),
    }


def differences(a: Snapshot, b: Snapshot) -> list[str]:
    """What one snapshot has that the other has not, a line each (empty: the same)."""
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if x == y:
            continue
        if isinstance(x, dict) and isinstance(y, dict):
            out += [
                f"{key}[{k}]: {x.get(k)!r} / {y.get(k)!r}"
                for k in sorted(set(x) | set(y))
                if x.get(k) != y.get(k)
            ]
        elif isinstance(x, list) and isinstance(y, list):
            if x and y and sorted(map(repr, x)) == sorted(map(repr, y)):
                out.append(f"{key}: the same, in another order: {x} / {y}")
                continue
            out += [f"{key}: only in the first: {v}" for v in x if v not in y]
            out += [f"{key}: only in the second: {v}" for v in y if v not in x]
        else:
            out.append(f"{key}: {x!r} / {y!r}")
    return out


def empty(url: str) -> None:
    """Leave the database as new: the SQLite file removed, the PostgreSQL tables dropped (their
    sequences go with them)."""
    engine = make_engine(url)
    try:
        if engine.dialect.name == "sqlite":
            engine.dispose()
            db = Path(make_url(url).database or "")
            for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
                path.unlink(missing_ok=True)
            return
        with engine.begin() as conn:
            names = [*metadata.tables, VERSION_TABLE]
            conn.execute(text(f"DROP TABLE IF EXISTS {', '.join(names)} CASCADE"))
    finally:
        engine.dispose()
    left = snapshot(url)
    assert not any(left[k] for k in ("tables", "indexes", "sequences")), left


def test_head_is_the_newest_revision() -> None:
    """``HEAD`` (what a database must be at, checked without Alembic) is Alembic's head."""
    from alembic.script import ScriptDirectory

    assert ScriptDirectory.from_config(migrations_sql._config()).get_current_head() == (
        migrations_sql.HEAD
    )


def test_a_version_table_with_two_revisions_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"INSERT INTO {VERSION_TABLE} VALUES ('0009_replays')"))
    finally:
        engine.dispose()
    with pytest.raises(QueueError, match="at 2 schema revisions at once") as caught:
        current_revision(url)
    assert f"(0009_replays, {head_revision()})" in str(caught.value)


# --- the two paths --------------------------------------------------------------------------

_REFERENCE: dict[str, Snapshot] = {}


def reference(url: str) -> Snapshot:
    """The snapshot of a database taken through every revision (once per kind of database: it
    names nothing of its own), leaving the database at ``url`` new."""
    kind = make_url(url).get_backend_name()
    if kind not in _REFERENCE:
        applied = by_revisions(url)
        assert len(applied) == len(list(migrations_sql._script().walk_revisions()))
        assert applied[-1].startswith(f"sql schema: applied {head_revision()} ")
        _REFERENCE[kind] = snapshot(url)
        assert _REFERENCE[kind]["version"] == [(head_revision(),)]
        empty(url)
    return _REFERENCE[kind]


def test_a_new_database_gets_the_schema_every_revision_gives(sql_url: str) -> None:
    revisions = reference(sql_url)
    assert upgrade(sql_url) == [created_line()]
    assert current_revision(sql_url) == head_revision()
    assert differences(revisions, snapshot(sql_url)) == []


def test_the_comparison_fails_when_the_fresh_path_leaves_something_out(
    sql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tables module without an index, a server default, or (SQLite) ``AUTOINCREMENT``:
    each one is named among the differences."""
    revisions = reference(sql_url)

    def fresh_with(change: Callable[[MetaData], None]) -> list[str]:
        mutated = MetaData()
        for table in metadata.sorted_tables:
            table.to_metadata(mutated)
        change(mutated)
        empty(sql_url)
        with monkeypatch.context() as m:
            m.setattr(migrations_sql, "metadata", mutated)
            assert upgrade(sql_url) == [created_line()]
        return differences(revisions, snapshot(sql_url))

    def drop_index(m: MetaData) -> None:
        dead = m.tables["outbox_queue_dead_letters"]
        [ix] = [i for i in dead.indexes if i.name == "ix_outbox_queue_dead_letters_session"]
        dead.indexes.discard(ix)

    def drop_default(m: MetaData) -> None:
        m.tables["outbox_queue_messages"].c.deferred.server_default = None

    def no_autoincrement(m: MetaData) -> None:
        m.tables["outbox_queue_messages"].dialect_options["sqlite"]["autoincrement"] = False

    # each time the one change, and nothing else, is what differs
    missing = fresh_with(drop_index)
    assert missing, "the index left out went unnoticed"
    assert all("ix_outbox_queue_dead_letters_session" in d for d in missing), missing
    missing = fresh_with(drop_default)
    assert any("deferred" in d and "only in the first" in d for d in missing), missing
    assert all("outbox_queue_messages" in d and "deferred" in d for d in missing), missing
    if make_url(sql_url).get_backend_name() == "sqlite":
        missing = fresh_with(no_autoincrement)
        assert any("AUTOINCREMENT" in d for d in missing), missing
        assert all("CREATE TABLE outbox_queue_messages" in d for d in missing), missing


def test_the_comparison_fails_when_a_revision_does_more_than_the_tables_module(
    sql_url: str,
) -> None:
    """An index, or a row, a revision would add and the tables module does not carry: the
    fresh database lacks it, and the comparison names it."""
    assert upgrade(sql_url) == [created_line()]
    fresh = snapshot(sql_url)
    empty(sql_url)
    by_revisions(sql_url)
    engine = make_engine(sql_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE INDEX ix_outbox_claims_owner ON outbox_claims (owner)"))
        extra = differences(snapshot(sql_url), fresh)
        assert any("ix_outbox_claims_owner" in d for d in extra), extra
        with engine.begin() as conn:
            conn.execute(text("DROP INDEX ix_outbox_claims_owner"))
            conn.execute(
                text("INSERT INTO outbox_claim_sessions VALUES ('s', 1)"),
            )
        extra = differences(snapshot(sql_url), fresh)
        assert extra == ["rows[outbox_claim_sessions]: 1 / 0"], extra
    finally:
        engine.dispose()


# --- two processes at once --------------------------------------------------------------------


def test_two_processes_opening_one_new_database_create_it_once(sql_url: str) -> None:
    """Both wait at the lock every migration takes (held here until both reached it); one
    creates the database, the other finds it created, and neither fails. A fresh path that
    looked for the version table before taking the lock would have both create it."""
    postgres = make_url(sql_url).get_backend_name() == "postgresql"
    lock = "SELECT pg_advisory_xact_lock" if postgres else "BEGIN IMMEDIATE"
    reached = [threading.Event(), threading.Event()]
    results: list[list[str] | BaseException] = [[], []]

    def opener(i: int) -> Engine:
        # the wait's clock stands still: the lock is held until both reached it, however long
        engine = make_engine(sql_url, lock_wait=LockWait(attempt=0.01, clock=lambda: 0.0))

        @event.listens_for(engine, "before_cursor_execute")
        def _at_the_lock(_c: Any, _cur: Any, statement: str, *_a: Any) -> None:
            if statement.startswith(lock):
                reached[i].set()

        return engine

    def run(i: int, engine: Engine) -> None:
        try:
            results[i] = upgrade(engine)
        except BaseException as e:
            results[i] = e

    engines = [opener(0), opener(1)]
    with _lock_held(sql_url, postgres):
        threads = [threading.Thread(target=run, args=(i, e)) for i, e in enumerate(engines)]
        for t in threads:
            t.start()
        for i in (0, 1):
            assert reached[i].wait(120), f"opener {i} never reached the lock: {results[i]}"
    for t in threads:
        t.join(120)
    for e in engines:
        e.dispose()
    assert sorted(map(str, results)) == sorted(map(str, [[created_line()], []])), results
    assert current_revision(sql_url) == head_revision()


@contextmanager
def _lock_held(url: str, postgres: bool) -> Iterator[None]:
    """Hold the lock the fresh path takes, from another connection (another process)."""
    if postgres:
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                conn.execute(text(f"SELECT pg_advisory_lock({PG_LOCK})"))
                try:
                    yield
                finally:
                    conn.execute(text(f"SELECT pg_advisory_unlock({PG_LOCK})"))
        finally:
            engine.dispose()
        return
    raw = sqlite3.connect(make_url(url).database or "", isolation_level=None)
    try:
        raw.execute("PRAGMA journal_mode=WAL")
        raw.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            raw.execute("ROLLBACK")
    finally:
        raw.close()


# --- a later revision on a database created at the head --------------------------------------

LATER = '''"""A later revision (the test's): a table of its own and the queue's table recreated.

Revision ID: 0099_later
Revises: {head}
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import context, op

from migrations.sql import UPGRADING_FROM, ids

revision = "0099_later"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    seen = sa.table("later_seen", sa.column("upgrading_from", sa.String))
    op.create_table("later_seen", sa.Column("upgrading_from", sa.String(64), nullable=True))
    op.execute(seen.insert().values(upgrading_from=context.config.attributes[UPGRADING_FROM]))
    sqlite = op.get_bind().dialect.name == "sqlite"
    # On SQLite a copy of the table, as 0007 made. What such a revision must carry over itself:
    # AUTOINCREMENT (reflection does not see it), and the highest id ever handed out (dropping
    # the old table drops its sqlite_sequence row; the copy's counts from the rows left).
    floor = ids.highest(("sqlite_sequence", "seq")) if sqlite else 0
    with op.batch_alter_table(
        "outbox_queue_messages",
        recreate="always" if sqlite else "auto",
        table_kwargs={{"sqlite_autoincrement": True}},
    ) as batch:
        batch.add_column(sa.Column("later", sa.Integer(), nullable=True))
    if sqlite:
        ids.start_above("outbox_queue_messages", floor)


def downgrade() -> None:
    pass
'''


@pytest.fixture
def later_revision(tmp_path: Path) -> Iterator[Callable[[], str]]:
    """A function that puts one more revision after the head (the package's revisions and
    ``env.py``, copied, running it) and returns the head it follows; undone after the test."""
    saved, saved_head = migrations_sql.HERE, migrations_sql.HEAD

    def add() -> str:
        here = tmp_path / "revisions"
        shutil.copytree(saved, here, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        head = head_revision()
        (here / "versions" / "0099_later.py").write_text(LATER.format(head=head))
        migrations_sql.HERE = here
        migrations_sql.HEAD = "0099_later"
        migrations_sql._script.cache_clear()
        return head

    try:
        yield add
    finally:
        migrations_sql.HERE, migrations_sql.HEAD = saved, saved_head
        migrations_sql._script.cache_clear()


def test_a_database_created_at_the_head_takes_a_later_revision(
    sql_url: str, later_revision: Callable[[], str]
) -> None:
    """Created by the fresh path and used (the newest message completed), then upgraded by a
    revision after it: the revision reads the database as one with a history (0007's question:
    ``UPGRADING_FROM`` is the head it was created at, not None), its copy of the queue's table
    keeps every row and id, and no id comes back."""
    assert upgrade(sql_url) == [created_line()]
    queue = SqlQueue(sql_url, clock=ManualClock())
    try:
        for mid in ("a", "b", "c"):
            queue.send("q", QueueMessage(b"x", message_id=mid))
        got = {m.message_id: m for m in queue.receive("q", 3)}
        assert [got[k].sequence_number for k in "abc"] == [1, 2, 3]
        queue.complete(got["c"])
    finally:
        queue.close()
    created_at = later_revision()
    assert upgrade(sql_url) == [
        "sql schema: applied 0099_later (A later revision (the test's): a table of its own and "
        "the queue's table recreated.)"
    ]
    engine = make_engine(sql_url)
    try:
        with engine.connect() as conn:
            seen = conn.execute(text("SELECT upgrading_from FROM later_seen")).all()
            kept = conn.execute(
                text("SELECT message_id, sequence_number FROM outbox_queue_messages")
            ).all()
    finally:
        engine.dispose()
    assert seen == [(created_at,)]
    assert sorted(kept) == [("a", 1), ("b", 2)]
    queue = SqlQueue(sql_url, clock=ManualClock())
    try:
        queue.send("q", QueueMessage(b"x", message_id="d"))
        [new] = [p for p in queue.peek("q", 10) if p.message_id == "d"]
        assert new.sequence_number > 3
    finally:
        queue.close()
