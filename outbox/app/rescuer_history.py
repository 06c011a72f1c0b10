"""What history the rescuer (and a replay) still needs, and the vacuum's guard over it.

The rescuer reads the change data feed from its checkpoint onward, so a vacuum whose retention
would reach into that window (or into ``rescue_delay`` plus a margin) is refused with an error
that says what to do instead (``check_vacuum``); the log trim stops at the same version
(``oldest_needed_version``). An unfinished ``outbox replay`` holds the same way: it reads the
table as of the version before its range and the feed of the range (``outbox.app.replay``).

Why apart from ``maintenance``: this is the one question upkeep asks the rescuer's side (its
checkpoints, in SQL or Cosmos DB, and the table's commit times), and it answers it the same for
``outbox maintain``, the writers' own log trim and the tests; ``maintenance`` imports it and
still offers it under its old names.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from outbox.core.clock import Clock
from outbox.core.durations import format_duration
from outbox.core.errors import VacuumRefusedError
from outbox.delta.store import DeltaDocumentStore

if TYPE_CHECKING:
    from outbox.core.settings import Settings

#: Vacuum retention must exceed the rescuer's needs by at least this much.
VACUUM_MARGIN = timedelta(hours=1)


def oldest_needed_version(
    sql_url: str,
    table_uri: str,
    table_id: str | None = None,
    *,
    settings: Settings | None = None,
) -> int | None:
    """The oldest table version any rescuer or unfinished replay of the table still has to
    read, or None.

    The checkpoints are read from ``settings``' checkpoint store (``checkpoint_store``: SQL or
    Cosmos DB) when given, else from the SQL database at ``sql_url``.

    A checkpoint counts when its table URI is ``table_uri`` or, with ``table_id``, when it was
    written for that table id: the same table reached through another spelling of its URI (a
    trailing slash, ``file://``, a symlink, ``az://`` vs ``abfss://``) must hold history too.

    The replays are read from the SQL database (``settings.sql_url``, else ``sql_url``); one
    older than ``replay_retention`` no longer holds (``outbox.app.replay_status.holding_versions``).

    Fails closed: when the checkpoints or the replays cannot be read, the vacuum is refused
    rather than run blind, since it could delete the history a rescuer is about to read.
    Read-only (SQLite: ``read_only_url``), so it never waits for the write lock, nor creates a
    missing database.
    """
    from outbox.core.sql import read_only_url
    from outbox.wiring import Backends
    from rescuer.checkpoint import SqlCheckpointStore

    try:
        held = _replays_holding(
            settings.sql_url if settings else sql_url, table_uri, table_id, settings
        )
        if settings is not None:
            reading = settings.replace(sql_url=read_only_url(settings.sql_url))
            with Backends(reading) as backends:
                rows = backends.checkpoint_store().list(None if table_id is not None else table_uri)
        else:
            store = SqlCheckpointStore(read_only_url(sql_url))
            try:
                rows = store.list(None if table_id is not None else table_uri)
            finally:
                store.close()
    except Exception as e:  # any failure to read them: refuse, never guess
        raise VacuumRefusedError(
            f"cannot tell which history the rescuer still needs: {e}",
            hint="fix sql_url, or the cosmos_* settings when checkpoint_store is cosmos (or run "
            "`outbox migrate`), so the rescuer checkpoints can be read",
        ) from e
    versions = [
        cp.version + 1
        for cp in rows
        if cp.version is not None
        and (cp.table_uri == table_uri or (table_id is not None and cp.table_id == table_id))
    ]
    versions += held
    return min(versions) if versions else None


def _replays_holding(
    sql_url: str, table_uri: str, table_id: str | None, settings: Settings | None
) -> list[int]:
    """The versions the unfinished replays of the table hold (``outbox.app.replay``)."""
    from datetime import UTC
    from pathlib import Path

    from outbox.app.replay_status import holding_versions, replay_retention
    from outbox.core.sql import make_engine, parse_url, read_only_url

    if not sql_url:
        return []
    parsed = parse_url(sql_url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").exists():
        return []  # no database, no replay (the checkpoints may live in Cosmos DB)
    retention = replay_retention(settings)
    engine = make_engine(read_only_url(sql_url))
    try:
        return holding_versions(engine, table_uri, table_id, datetime.now(UTC), retention)
    finally:
        engine.dispose()


def commit_time(store: DeltaDocumentStore, version: int) -> datetime | None:
    """Commit timestamp of ``version`` in UTC (None when the log no longer has it)."""
    from rescuer.window import commit_times

    latest = store.version()
    for commit in commit_times(store.delta_table, max(1, latest - version + 1), latest=latest):
        if commit.version == version:
            return commit.timestamp
    return None


def check_vacuum(
    store: DeltaDocumentStore,
    *,
    retention: timedelta,
    rescue_delay: timedelta,
    needed_version: int | None,
    clock: Clock,
) -> None:
    """Raise ``VacuumRefusedError`` when ``retention`` would cut into the rescuer's window."""
    floor = rescue_delay + VACUUM_MARGIN
    if retention < floor:
        raise VacuumRefusedError(
            f"vacuum retention {format_duration(retention.total_seconds())} is shorter than the "
            f"rescue delay plus a margin ({format_duration(floor.total_seconds())})",
            hint=f"use a retention of at least {int(floor.total_seconds() // 3600) + 1}h",
        )
    if needed_version is None or needed_version > store.version():
        return
    when = commit_time(store, needed_version)
    if when is None:
        return
    age = clock.now() - when
    if retention < age + VACUUM_MARGIN:
        raise VacuumRefusedError(
            f"vacuum with retention {format_duration(retention.total_seconds())} would delete "
            f"change-feed history from version {needed_version} (committed "
            f"{format_duration(age.total_seconds())} ago) that the rescuer has not read yet",
            hint="run `outbox rescue` first, or use a retention longer than "
            f"{int((age + VACUUM_MARGIN).total_seconds() // 3600) + 1}h",
        )
