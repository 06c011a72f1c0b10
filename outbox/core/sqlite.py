"""SQLite's side of the engines: WAL and the pragmas, a bounded and logged wait for the write
lock, and a read-only open (``outbox.core.sql`` builds the engines and translates the errors).

Why the wait is ours: SQLite's busy handler waits silently for as long as the busy timeout, so a
file held by another process (a ``sqlite3`` shell left in ``BEGIN EXCLUSIVE``) made a save hang
for 39 s without a word. Each connection's busy timeout is one short attempt; ``BEGIN IMMEDIATE``
is tried again until ``LockWait.limit``, with a WARNING every ``LockWait.log_every`` seconds.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Engine, event
from sqlalchemy.exc import DBAPIError, OperationalError

from outbox.core.durations import format_duration

log = logging.getLogger("outbox.sql")

#: SQLite's primary result codes for "another connection holds the lock this one needs".
SQLITE_BUSY, SQLITE_LOCKED = 5, 6

#: Each SQLite connection's busy timeout: how long one attempt at the write lock waits (and the
#: most a read waits for a lock, which in WAL mode only a writer in exclusive locking mode takes).
SQLITE_BUSY_TIMEOUT_MS = 1_000


@dataclass(frozen=True)
class LockWait:
    """How a SQLite write transaction waits for the write lock another connection holds.

    ``BEGIN IMMEDIATE`` is tried again every ``attempt`` seconds (the busy timeout), a WARNING is
    logged every ``log_every`` seconds of waiting, and after ``limit`` seconds the transaction
    fails with the retryable ``QueueUnavailableError`` saying the file is locked and what to do.
    ``clock`` is injectable so a test checks the cadence without waiting for it.
    """

    limit: float = 30.0
    log_every: float = 5.0
    attempt: float = SQLITE_BUSY_TIMEOUT_MS / 1000
    clock: Callable[[], float] = time.monotonic


#: Execution option: the most this connection's next write transaction waits for the lock, in
#: seconds (a caller with a bound of its own, such as the claim log's sender path).
LOCK_LIMIT = "outbox_lock_limit"
#: Execution option: ``LockWait.clock``'s reading when the wait began (an in-process wait for the
#: same lock counts towards the limit and the log cadence).
LOCK_WAIT_SINCE = "outbox_lock_since"


#: Execution option for work that only reads: on SQLite it starts a deferred ``BEGIN`` so readers
#: (peek, stats, the CLI) never wait behind, or hold up, the single writer.
READ_ONLY = {"outbox_read_only": True}


def install(
    engine: Engine, *, db: str | None, read_only: bool, wait: LockWait, limit: float, what: str
) -> None:
    """Give ``engine`` (on the file ``db``) the pragmas, the bounded wait for the write lock
    (``limit`` seconds in all) and, with ``read_only``, the read-only open."""
    attempt = min(wait.attempt, limit)
    if read_only and db and db != ":memory:":
        event.listen(engine, "do_connect", _read_only_connect(db))
    event.listen(engine, "connect", _sqlite_pragmas(attempt, read_only=read_only))
    where = engine.url.render_as_string(hide_password=True)
    event.listen(engine, "begin", _begin(wait, limit, what, where, read_only=read_only))


def _read_only_connect(db: str) -> Callable[..., sqlite3.Connection]:
    """Open ``db`` without writing to it, chosen per connection (the files beside it change):

    * its ``-wal`` file exists (a process has it open): ``mode=ro``, which reads through the
      ``-wal`` and ``-shm`` files already there;
    * else, in a folder we may write: ``mode=rw`` with ``query_only``. Not ``mode=ro``: SQLite
      would create ``-wal`` and ``-shm`` and, read-only, could not remove them; left behind (owned
      by whoever ran ``status``) they can keep the application's user from writing;
    * else (a read-only folder, where no writer can be at work: it could not create ``-wal``):
      ``immutable=1``, which needs neither file.
    """
    path = Path(db).absolute()

    def connect(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> Any:
        if Path(f"{path}-wal").exists():
            mode = "mode=ro"
        elif os.access(path.parent, os.W_OK):
            mode = "mode=rw"
        else:
            mode = "mode=ro&immutable=1"
        params = {k: v for k, v in cparams.items() if k != "uri"}
        return sqlite3.connect(f"file:{quote(str(path))}?{mode}", uri=True, **params)

    return connect


def _sqlite_pragmas(attempt: float, *, read_only: bool) -> Callable[[Any, Any], None]:
    def pragmas(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN IMMEDIATE, so a read-then-write transaction
        # takes the write lock up front instead of failing with SQLITE_BUSY on upgrade.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if read_only:
            cur.execute("PRAGMA query_only=ON")
        else:
            cur.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit is on disk when it returns, so "send returned" means durable even
            # across a power cut (NORMAL in WAL mode only survives an application crash).
            cur.execute("PRAGMA synchronous=FULL")
        cur.execute(f"PRAGMA busy_timeout={max(1, round(attempt * 1000))}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    return pragmas


def _begin(
    wait: LockWait, limit: float, what: str, where: str, *, read_only: bool
) -> Callable[[Any], None]:
    def begin(conn: Any) -> None:
        options = conn.get_execution_options()
        if read_only or options.get("outbox_read_only"):
            conn.exec_driver_sql("BEGIN")
            return
        since = options.get(LOCK_WAIT_SINCE)
        if since is None:
            since = wait.clock()
        try:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            return
        except OperationalError as e:
            if not is_locked(e):
                raise
            busy = e
        wait_for_write_lock(
            lambda: conn.exec_driver_sql("BEGIN IMMEDIATE"),
            busy,
            wait=wait,
            since=since,
            limit=options.get(LOCK_LIMIT, limit),
            what=what,
            where=where,
        )

    return begin


def wait_for_write_lock(
    attempt: Callable[[], object],
    busy: OperationalError,
    *,
    wait: LockWait,
    since: float,
    limit: float,
    what: str,
    where: str,
) -> None:
    """Try ``attempt`` (a ``BEGIN IMMEDIATE`` that waits ``wait.attempt`` seconds) until it takes
    the lock, logging every ``wait.log_every`` seconds; after ``limit`` seconds since ``since``
    the last ``SQLITE_BUSY`` goes up, marked with the seconds waited (``translate`` says them)."""
    logged = 0
    while True:
        waited = wait.clock() - since
        if waited >= limit:
            busy.outbox_waited = waited  # type: ignore[attr-defined]
            raise busy
        due = int(waited // wait.log_every) if wait.log_every > 0 else 0
        if due > logged:
            logged = due
            log.warning(
                "waiting for the %s's write lock, held by another process: %s so far (%s)",
                what,
                format_duration(due * wait.log_every),
                where,
            )
        try:
            attempt()
            return
        except OperationalError as e:
            if not is_locked(e):
                raise
            busy = e


def sqlite_code(e: BaseException) -> int | None:
    """SQLite's primary result code of ``e`` (a driver error, or ours around one)."""
    orig = e.orig if isinstance(e, DBAPIError) else e
    code = getattr(orig, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def is_locked(e: BaseException) -> bool:
    """SQLite's "database is locked": another connection holds the lock this one needs."""
    code = sqlite_code(e)
    if code is not None:
        return code in (SQLITE_BUSY, SQLITE_LOCKED)
    return "database is locked" in str(e.orig if isinstance(e, DBAPIError) else e)
