"""Where a rescuer remembers how far it has read: a Delta table *version*, never a timestamp.

Why a version: reading the change feed by timestamp makes delta-rs walk the log from version 0,
O(history); a version is O(1) to resume from.

Why a compare-and-set on ``generation``: two rescuers on the same table and name (a cron job that
overlaps the previous run, two Databricks jobs) must neither lose an advance nor apply one twice.
Every write says which generation it read; a write against a moved row changes nothing and raises
``CheckpointConflictError``, so the caller re-reads and decides (see ``runner``).

The checkpoint lives in the SQL database (table ``outbox_checkpoints``, keyed by table URI and
rescuer name); ``InMemoryCheckpointStore`` has the same semantics for fast tests.

Why one module: a rescuer exists exactly as long as its checkpoint does, so the rules about
rescuers themselves are rules about checkpoints and sit with them: which name may start one
(``require_known_rescuer``: a typo must not start a rescuer that holds the log for good) and
which ones are stale and hold back the log trim and vacuum (``stale_rescuers``, for
``outbox status``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Engine, and_, delete, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from outbox.core.clock import utc
from outbox.core.durations import format_duration
from outbox.core.errors import CheckpointConflictError, CheckpointError, ValidationError
from outbox.core.settings import did_you_mean


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One rescuer's position in one table.

    ``version`` is the newest table version whose changes were fully handled (None: no pass has
    covered anything yet). ``generation`` increases by one on every write: it is the CAS guard.
    ``details`` carries the table id (to detect a table recreated at the same URI) and the last
    pass's summary, for ``outbox status``.
    """

    table_uri: str
    rescuer_name: str
    version: int | None
    generation: int
    last_pass_at: datetime | None
    updated_at: datetime
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def table_id(self) -> str | None:
        value = self.details.get("table_id")
        return str(value) if value is not None else None


class CheckpointStore(Protocol):
    """Read and compare-and-set rescuer checkpoints."""

    def read(self, table_uri: str, rescuer_name: str) -> Checkpoint | None:
        """The checkpoint, or None when this rescuer never wrote one for this table."""
        ...

    def write(
        self,
        table_uri: str,
        rescuer_name: str,
        *,
        expected_generation: int | None,
        version: int | None,
        at: datetime,
        details: dict[str, Any],
    ) -> Checkpoint:
        """Store ``version`` if the row is still at ``expected_generation`` (None: no row yet).

        Raises ``CheckpointConflictError`` when someone else wrote first.
        """
        ...

    def generation(self, table_uri: str, rescuer_name: str) -> int | None:
        """The CAS generation alone, readable even when the rest of the row is corrupt."""
        ...

    def list(self, table_uri: str | None = None) -> list[Checkpoint]:
        """Every checkpoint (for ``outbox status``), optionally for one table."""
        ...

    def forget(self, table_uri: str, rescuer_name: str) -> bool:
        """Delete the checkpoint; True when there was one. Why: the oldest checkpoint pins the
        Delta log and vacuum history (like a replication slot), so a rescuer that no longer
        runs must be forgotten. Were it to run again, its first pass is a full sweep."""
        ...


def _validate(cp: Checkpoint) -> Checkpoint:
    if cp.version is not None and cp.version < 0:
        raise CheckpointError(
            f"the rescuer checkpoint {cp.rescuer_name!r} for {cp.table_uri} holds version "
            f"{cp.version}, which no Delta table has",
            hint="run `outbox rescue --full` to sweep the table and store a fresh checkpoint",
        )
    return cp


#: The rescuer ``outbox rescue`` runs when neither ``--name`` nor ``rescuer_name`` says another.
DEFAULT_RESCUER = "default"
#: A rescuer whose last pass is older than this is stale (``stale_rescuers``).
STALE_AFTER = 3600.0


def check_rescuer_name(name: str, *, flag: str = "--name") -> str:
    """``name`` if it can be a rescuer's name. Why refuse an empty one: it used to mean
    ``default`` quietly, so a script with an unset variable ran (or forgot) another rescuer than
    it said; a name with spaces around it is a typo of the name without them."""
    if not name.strip():
        raise ValidationError(
            f"{flag}: a rescuer name cannot be empty",
            hint=f"leave {flag} out for the rescuer_name setting ({DEFAULT_RESCUER!r} unless set), "
            "or give a name"
            if flag.startswith("--")
            else f"give it a name, or unset it for {DEFAULT_RESCUER!r}",
        )
    if name != name.strip():
        raise ValidationError(
            f"{flag} {name!r} has spaces around it", hint=f"write it as {name.strip()!r}"
        )
    return name


def require_known_rescuer(
    store: CheckpointStore, table_uri: str, name: str, *, new: bool, flag: str = "--new"
) -> None:
    """Refuse to start a rescuer by accident, or to "start" one that exists.

    Why: a rescuer's first pass stores its checkpoint, and the oldest checkpoint holds back the
    log trim and vacuum until it is forgotten (like a replication slot). A mistyped name would
    start a rescuer nobody runs again, holding the log for good; so a name without a checkpoint
    (other than ``DEFAULT_RESCUER``, which a fresh workspace starts with) needs ``new``, and the
    error names the rescuers the table has. ``new`` for a name that has a checkpoint is refused
    too: it would say "start" where the pass continues.
    """
    exists = store.generation(table_uri, name) is not None
    if exists and new:
        raise ValidationError(
            f"{flag}: rescuer {name!r} already has a checkpoint for {table_uri}; nothing was run",
            hint=f"drop {flag} to continue it, or pick a name no rescuer of the table has",
        )
    if exists or new or name == DEFAULT_RESCUER:
        return
    known = sorted(cp.rescuer_name for cp in store.list(table_uri))
    has = ", ".join(repr(n) for n in known) if known else "none yet"
    raise ValidationError(
        f"rescuer {name!r} has no checkpoint for {table_uri} (its rescuers: {has})"
        f"{did_you_mean(name, known)}; nothing was run",
        hint=f"check the name, or add {flag} to start a rescuer under it (its checkpoint then "
        f"holds back the log trim and vacuum until `outbox rescue --name {name} --forget`)",
    )


@dataclass(frozen=True, slots=True)
class StaleRescuer:
    """A rescuer that has not run for ``idle_s`` seconds and alone keeps ``versions_held``
    versions of the Delta log (and the vacuum's history) from being removed."""

    rescuer_name: str
    version: int
    last_pass_at: datetime | None
    idle_s: float
    versions_held: int

    def describe(self) -> str:
        """One line for an operator: who, since when, what it holds."""
        return (
            f"rescuer {self.rescuer_name!r} has not run for {format_duration(self.idle_s)} and "
            f"holds back {self.versions_held} version(s) of the log (its checkpoint is at "
            f"version {self.version})"
        )


def stale_rescuers(
    checkpoints: Iterable[Checkpoint],
    *,
    latest_version: int,
    now: datetime,
    stale_after: float = STALE_AFTER,
) -> list[StaleRescuer]:
    """The rescuers of one table that have not run for ``stale_after`` seconds and hold back the
    log, the one holding back most first.

    Why: the log trim and the vacuum keep every version from the oldest checkpoint on
    (``outbox.app.maintenance.oldest_needed_version``), so a retired rescuer, or one started by a
    typo, keeps the log growing for good while nothing looks wrong. A stale rescuer holds back the
    versions between its checkpoint and the oldest checkpoint of a rescuer that still runs (the
    table's latest version when none does); one at that point or past it holds back nothing.
    ``checkpoints`` are the table's (``CheckpointStore.list(table_uri)``); a checkpoint that never
    covered a version holds nothing.
    """
    now = utc(now)
    fresh: list[int] = []
    stale: list[tuple[Checkpoint, float]] = []
    for cp in checkpoints:
        last = cp.last_pass_at or cp.updated_at
        idle = max(0.0, (now - utc(last)).total_seconds())
        if idle >= stale_after:
            stale.append((cp, idle))
        elif cp.version is not None:
            fresh.append(cp.version)
    floor = min([*fresh, latest_version])
    found = [
        StaleRescuer(cp.rescuer_name, v, cp.last_pass_at, round(idle, 1), floor - v)
        for cp, idle in stale
        if (v := cp.version) is not None and v < floor
    ]
    return sorted(found, key=lambda s: (-s.versions_held, s.rescuer_name))


class ClosableCheckpointStore(CheckpointStore, Protocol):
    """A store its opener must close (both shipped stores hold connections)."""

    def close(self) -> None: ...


class InMemoryCheckpointStore:
    """Checkpoints in a dict, with the same compare-and-set semantics as the SQL store."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], Checkpoint] = {}
        self._lock = threading.Lock()
        self.writes = 0

    def read(self, table_uri: str, rescuer_name: str) -> Checkpoint | None:
        with self._lock:
            cp = self._rows.get((table_uri, rescuer_name))
        return _validate(cp) if cp is not None else None

    def write(
        self,
        table_uri: str,
        rescuer_name: str,
        *,
        expected_generation: int | None,
        version: int | None,
        at: datetime,
        details: dict[str, Any],
    ) -> Checkpoint:
        key = (table_uri, rescuer_name)
        with self._lock:
            current = self._rows.get(key)
            have = current.generation if current is not None else None
            if have != expected_generation:
                raise _conflict(table_uri, rescuer_name, expected_generation, have)
            cp = Checkpoint(
                table_uri,
                rescuer_name,
                version,
                (have or 0) + 1,
                at,
                at,
                dict(details),
            )
            self._rows[key] = cp
            self.writes += 1
            return cp

    def generation(self, table_uri: str, rescuer_name: str) -> int | None:
        with self._lock:
            cp = self._rows.get((table_uri, rescuer_name))
        return cp.generation if cp is not None else None

    def list(self, table_uri: str | None = None) -> list[Checkpoint]:
        with self._lock:
            rows = list(self._rows.values())
        return sorted(
            (r for r in rows if table_uri is None or r.table_uri == table_uri),
            key=lambda r: (r.table_uri, r.rescuer_name),
        )

    def forget(self, table_uri: str, rescuer_name: str) -> bool:
        with self._lock:
            return self._rows.pop((table_uri, rescuer_name), None) is not None

    def corrupt(self, table_uri: str, rescuer_name: str, **changes: Any) -> None:
        """Test hook: overwrite fields without the CAS (simulates a damaged row)."""
        with self._lock:
            self._rows[(table_uri, rescuer_name)] = replace(
                self._rows[(table_uri, rescuer_name)], **changes
            )


def _conflict(
    table_uri: str, rescuer_name: str, expected: int | None, found: int | None
) -> CheckpointConflictError:
    return CheckpointConflictError(
        f"the rescuer checkpoint {rescuer_name!r} for {table_uri} was moved by another rescuer "
        f"(expected generation {expected}, found {found}); nothing was written",
        hint="this is normal when two rescuers overlap; give each scheduled job its own --name "
        "or let one of them run",
    )


class SqlCheckpointStore:
    """Checkpoints in ``outbox_checkpoints`` (SQLite or PostgreSQL), created by ``outbox migrate``.

    The CAS is a single ``UPDATE ... WHERE generation = :expected`` (or an ``INSERT`` that the
    primary key rejects when a racing rescuer inserted first), so it holds across processes and
    machines without explicit locks.
    """

    def __init__(self, url_or_engine: str | Engine) -> None:
        from migrations.sql.tables import checkpoints

        self._table = checkpoints
        if isinstance(url_or_engine, Engine):
            self._engine, self._owned = url_or_engine, False
        else:
            from outbox.core.sql import make_engine

            self._engine, self._owned = make_engine(url_or_engine), True

    def close(self) -> None:
        if self._owned:
            self._engine.dispose()

    def _key(self, table_uri: str, rescuer_name: str) -> Any:
        """The row of one rescuer of one table (the primary key)."""
        t = self._table
        return and_(t.c.table_uri == table_uri, t.c.rescuer_name == rescuer_name)

    def _row(self, row: Any) -> Checkpoint:
        t_uri, name = row.table_uri, row.rescuer_name
        try:
            details = json.loads(row.details) if row.details else {}
            if not isinstance(details, dict):
                raise ValueError("details is not a JSON object")
        except ValueError as e:
            raise CheckpointError(
                f"the rescuer checkpoint {name!r} for {t_uri} has unreadable details ({e})",
                hint="run `outbox rescue --full` to sweep the table and store a fresh checkpoint",
            ) from e
        return _validate(
            Checkpoint(
                t_uri,
                name,
                None if row.version is None else int(row.version),
                int(row.generation),
                utc(row.last_pass_at) if row.last_pass_at is not None else None,
                utc(row.updated_at),
                details,
            )
        )

    def _db_error(self, what: str, e: DBAPIError) -> CheckpointError:
        from outbox.core.sql import explain

        url = self._engine.url.render_as_string(hide_password=True)
        first = str(e.orig or e).strip().splitlines()[0]
        if "no such table" in first or "does not exist" in first:
            return CheckpointError(
                f"{what}: the checkpoint table is missing in {url}",
                hint="run `outbox migrate` to create the SQL schema",
            )
        known = explain(e, "database", url)  # locked, full, read-only: each has its own fix
        if known is not None:
            problem, fix, _retryable = known
            return CheckpointError(f"{what}: {problem}", hint=fix)
        return CheckpointError(
            f"{what}: the database {url} failed: {first}",
            hint="check that the database is reachable, then retry the pass",
        )

    def read(self, table_uri: str, rescuer_name: str) -> Checkpoint | None:
        t = self._table
        try:
            with self._engine.connect() as conn:
                row = conn.execute(select(t).where(self._key(table_uri, rescuer_name))).first()
        except DBAPIError as e:
            raise self._db_error("reading the rescuer checkpoint", e) from e
        return self._row(row) if row is not None else None

    def write(
        self,
        table_uri: str,
        rescuer_name: str,
        *,
        expected_generation: int | None,
        version: int | None,
        at: datetime,
        details: dict[str, Any],
    ) -> Checkpoint:
        t = self._table
        generation = (expected_generation or 0) + 1
        values = {
            "version": version,
            "generation": generation,
            "last_pass_at": at,
            "updated_at": at,
            "details": json.dumps(details, sort_keys=True, default=str),
        }
        try:
            with self._engine.begin() as conn:
                if expected_generation is None:
                    conn.execute(
                        insert(t).values(table_uri=table_uri, rescuer_name=rescuer_name, **values)
                    )
                else:
                    result = conn.execute(
                        update(t)
                        .where(
                            self._key(table_uri, rescuer_name),
                            t.c.generation == expected_generation,
                        )
                        .values(**values)
                    )
                    if result.rowcount != 1:
                        found = conn.execute(
                            select(t.c.generation).where(self._key(table_uri, rescuer_name))
                        ).scalar()
                        raise _conflict(table_uri, rescuer_name, expected_generation, found)
        except IntegrityError as e:
            raise _conflict(
                table_uri, rescuer_name, None, self.generation(table_uri, rescuer_name)
            ) from e
        except DBAPIError as e:
            raise self._db_error("writing the rescuer checkpoint", e) from e
        return Checkpoint(
            table_uri, rescuer_name, version, generation, utc(at), utc(at), dict(details)
        )

    def generation(self, table_uri: str, rescuer_name: str) -> int | None:
        t = self._table
        try:
            with self._engine.connect() as conn:
                value = conn.execute(
                    select(t.c.generation).where(self._key(table_uri, rescuer_name))
                ).scalar()
        except DBAPIError as e:
            raise self._db_error("reading the rescuer checkpoint", e) from e
        return None if value is None else int(value)

    def list(self, table_uri: str | None = None) -> list[Checkpoint]:
        t = self._table
        query = select(t).order_by(t.c.table_uri, t.c.rescuer_name)
        if table_uri is not None:
            query = query.where(t.c.table_uri == table_uri)
        try:
            with self._engine.connect() as conn:
                rows = conn.execute(query).all()
        except DBAPIError as e:
            raise self._db_error("listing rescuer checkpoints", e) from e
        return [self._row(r) for r in rows]

    def forget(self, table_uri: str, rescuer_name: str) -> bool:
        t = self._table
        try:
            with self._engine.begin() as conn:
                result = conn.execute(delete(t).where(self._key(table_uri, rescuer_name)))
        except DBAPIError as e:
            raise self._db_error("deleting the rescuer checkpoint", e) from e
        return bool(result.rowcount)
