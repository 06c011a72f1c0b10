"""The console's sampler: the processes that already run record the numbers ``outbox console``
charts (``outbox.app.history``).

Why the running processes and not a daemon of its own: an operator who opens the console should
find the last hours there without having deployed anything new. The dispatcher samples every
``sample_interval`` on a background thread (``Sampler``), each rescue pass samples once when it
ends (``record_sample``); samples in the same slot collapse into one row, so running both (or ten
dispatchers) costs a few rows per slot, not a few per process.

Why it never fails its host: a sample is advice for a human. A part that cannot be read (the
table, a checkpoint store that is down, the claim log) is left out with one warning line, and a
database that cannot take the rows costs one warning line and nothing else: the dispatcher keeps
dispatching and the rescuer keeps rescuing.

Cheap on purpose: one ``scan_pending`` of the control columns and the outbox (for the oldest
message's age), one read of the newest commits for every rescuer's lag, one count of a SQL claim
log. No Delta log damage check (``outbox status`` does that), no queue depths.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from outbox.app.history import (
    DEAD_LETTERS,
    GEO_CLAIMS_IN_FLIGHT,
    OLDEST_PENDING_AGE,
    PENDING_DOCUMENTS,
    PENDING_MESSAGES,
    RESCUE_LAG_SECONDS,
    RESCUE_LAG_VERSIONS,
    History,
    Sample,
)
from outbox.core.clock import Clock, SystemClock, utc
from outbox.core.errors import OutboxError
from outbox.core.settings import Settings
from outbox.wiring import Backends

if TYPE_CHECKING:
    from outbox.delta.store import DeltaDocumentStore

log = logging.getLogger("outbox.sampling")

#: The columns one ``scan_pending`` of a sample reads: the counts and the messages' ages.
PENDING_COLUMNS = ["last_seq", "dispatched_seq", "outbox"]

#: How long ``Sampler.stop`` waits for a sample in progress (the thread is a daemon: a sample
#: stuck on a dead store never holds up the process's exit).
STOP_WAIT = 10.0

#: The databases already told to run ``outbox migrate``: once per process each, since every
#: sample would say the same thing again.
_told_to_migrate: set[str] = set()
_told_lock = threading.Lock()


def take_sample(
    settings: Settings,
    clock: Clock,
    *,
    backends: Backends | None = None,
    store: DeltaDocumentStore | None = None,
) -> list[Sample]:
    """The numbers of the table, its rescuers and the claim log as they are now.

    ``backends`` and ``store`` may be the caller's (a rescuer's, a sampler's kept between
    samples); they are left open. Otherwise they are opened for this sample and closed. Each part
    that fails is logged (one WARNING line) and left out; the rest is returned."""
    now = utc(clock.now())
    samples: list[Sample] = []
    own_backends = backends is None
    b = backends if backends is not None else Backends(settings, clock=clock)
    try:
        _table_part(samples, settings, b, store, now)
        _part(samples, "geo claims in flight", lambda: _claims_in_flight(b))
        _part(samples, "dead letters", lambda: _dead_letters(b))
    finally:
        if own_backends:
            b.close()
    return samples


def _part(samples: list[Sample], what: str, read: Callable[[], Iterable[Sample]]) -> bool:
    """Add what ``read`` returns, or log why it could not: never fail the sample over one part.
    Not only ``OutboxError``s: a driver error nobody translated must not stop the dispatcher's
    sampler either (its type is in the line)."""
    try:
        samples.extend(read())
    except OutboxError as e:
        log.warning("console sample: %s left out: %s", what, e)
        return False
    except Exception as e:  # see the docstring
        log.warning("console sample: %s left out: %s: %s", what, type(e).__name__, e)
        log.debug("console sample failure", exc_info=e)
        return False
    return True


def _table_part(
    samples: list[Sample],
    settings: Settings,
    backends: Backends,
    store: DeltaDocumentStore | None,
    now: datetime,
) -> None:
    """The pending documents, messages and age, then each rescuer's lag (which needs the table's
    latest version and commit times: without the table there is no lag to tell)."""
    opened: list[DeltaDocumentStore] = []

    def pending() -> list[Sample]:
        from outbox.wiring.backends import open_document_store

        s = store
        if s is None:
            s = open_document_store(settings)
            opened.append(s)
        return _pending(s, now)

    try:
        if _part(samples, "pending documents", pending):
            table = store if store is not None else opened[0]
            _part(samples, "rescuer lag", lambda: _rescuer_lag(settings, backends, table, now))
    finally:
        for s in opened:
            s.close()


def _pending(store: DeltaDocumentStore, now: datetime) -> list[Sample]:
    """As ``outbox status`` counts them; the age only when a message is pending."""
    rows = store.scan_pending(columns=PENDING_COLUMNS)
    messages = 0
    oldest: datetime | None = None
    for r in rows.to_pylist():
        dispatched = int(r["dispatched_seq"])
        messages += int(r["last_seq"]) - dispatched
        for m in r["outbox"] or []:
            created = m.get("created_at")
            if int(m["seq"]) > dispatched and created is not None:
                created = utc(created)
                oldest = created if oldest is None else min(oldest, created)
    out = [Sample(PENDING_DOCUMENTS, "", rows.num_rows), Sample(PENDING_MESSAGES, "", messages)]
    if oldest is not None:
        age = round(max(0.0, (now - oldest).total_seconds()), 1)
        out.append(Sample(OLDEST_PENDING_AGE, "", age))
    return out


def _rescuer_lag(
    settings: Settings, backends: Backends, store: DeltaDocumentStore, now: datetime
) -> list[Sample]:
    """Each checkpoint's lag in versions and seconds, as ``outbox status`` tells it, from one
    read of the newest commits for all of them (not one per rescuer)."""
    from rescuer.window import HISTORY_LIMIT, commit_times

    checkpoints = backends.checkpoint_store().list(settings.table_uri)
    if not checkpoints:
        return []
    latest = store.version()
    firsts = [0 if cp.version is None else cp.version + 1 for cp in checkpoints]
    needed = min(latest - min(firsts) + 1, HISTORY_LIMIT)
    known = {c.version: c.timestamp for c in commit_times(store.delta_table, needed, latest=latest)}
    # A checkpoint more than HISTORY_LIMIT commits behind is timed by the oldest commit read: a
    # lower bound, as in ``outbox status``.
    oldest_read = min(known.values(), default=None)
    out: list[Sample] = []
    for cp, first in zip(checkpoints, firsts, strict=True):
        since = known.get(first, oldest_read) if first <= latest else None
        lag = max(0.0, (now - since).total_seconds()) if since is not None else 0.0
        out.append(Sample(RESCUE_LAG_VERSIONS, cp.rescuer_name, max(0, latest - first + 1)))
        out.append(Sample(RESCUE_LAG_SECONDS, cp.rescuer_name, round(lag, 1)))
    return out


def _claims_in_flight(backends: Backends) -> list[Sample]:
    """Claims registered or held and not finished: the geo consumers' backlog (docs/geo.md).
    Counted only in a SQL claim log (the one the settings choose, in ``sql_url``): a query over
    a Cosmos DB container would cost request units every sample."""
    from sqlalchemy import func, select
    from sqlalchemy.exc import SQLAlchemyError

    from dispatcher.claims.ports import ClaimStatus
    from dispatcher.claims.sql import SqlClaimLog
    from migrations.sql.tables import claims
    from outbox.core.sql import translate

    claim_log = backends.claim_log()
    if not isinstance(claim_log, SqlClaimLog):
        return []
    stmt = (
        select(func.count())
        .select_from(claims)
        .where(claims.c.status.in_([ClaimStatus.PENDING.value, ClaimStatus.WORKING.value]))
    )
    try:
        with claim_log.engine.connect() as conn:
            count = int(conn.execute(stmt).scalar() or 0)
    except SQLAlchemyError as e:
        raise translate(e, claim_log.engine, "count the geo claims in flight") from e
    return [Sample(GEO_CLAIMS_IN_FLIGHT, "", count)]


def _dead_letters(backends: Backends) -> list[Sample]:
    """How many dead letters each queue holds (the SQL queue's): the console's trend per
    queue. One grouped count over the queue index (``ix_..._dead_letters_queue``)."""
    from sqlalchemy import func, select

    from migrations.sql.tables import dead_letters as D

    stmt = select(D.c.queue, func.count()).group_by(D.c.queue)
    with backends.sql_queue.database.read("count dead letters per queue") as conn:
        rows = conn.execute(stmt).all()
    return [Sample(DEAD_LETTERS, str(queue), int(count)) for queue, count in rows]


def record_sample(
    settings: Settings,
    clock: Clock,
    *,
    source: str,
    backends: Backends | None = None,
    store: DeltaDocumentStore | None = None,
) -> int:
    """Take a sample and write it to the history; returns how many rows were new (0: this slot
    was sampled already, sampling is off, or the write failed).

    Never raises for a database or store that fails: one WARNING line, and 0. A database not
    migrated for the console says to run ``outbox migrate``, once per process."""
    if settings.sample_interval <= 0:
        return 0
    own_backends = backends is None
    b = backends if backends is not None else Backends(settings, clock=clock)
    try:
        db = b.sql_queue.database  # first: no sample is taken that could not be written
        samples = take_sample(settings, clock, backends=b, store=store)
        history = History(db, retention=timedelta(seconds=settings.sample_retention))
        return history.record(
            samples, at=clock.now(), interval=settings.sample_interval, source=source
        )
    except OutboxError as e:
        _not_recorded(settings, e)
        return 0
    except Exception as e:  # a sample must never cost its host its work
        log.warning("console sample not recorded: %s: %s", type(e).__name__, e)
        log.debug("console sample failure", exc_info=e)
        return 0
    finally:
        if own_backends:
            b.close()


def _not_recorded(settings: Settings, e: OutboxError) -> None:
    from outbox.core.sql import redact_url

    if "outbox migrate" not in (e.hint or ""):
        log.warning("console sample not recorded: %s", e)
        return
    where = redact_url(settings.sql_url)
    with _told_lock:
        if where in _told_to_migrate:
            return
        _told_to_migrate.add(where)
    log.warning(
        "console samples are not recorded: the database %s is not migrated for the console "
        "(%s); run `outbox migrate` (or set sample_interval = 0)",
        where,
        e,
    )


class Sampler:
    """``record_sample`` every ``sample_interval`` seconds on a daemon thread, for a process that
    runs for long (``outbox run-dispatcher``); off when ``sample_interval`` is 0.

    The thread keeps its backends and the table open between samples (a sample then costs a
    refresh, not an open) and closes them when it stops. It waits on the stop event, so ``stop``
    ends it at once between samples; samples start ``sample_interval`` apart (by the monotonic
    clock) however long each took, so none of the slots is skipped by drift."""

    def __init__(
        self,
        settings: Settings,
        clock: Clock | None = None,
        *,
        source: str,
        stop: threading.Event | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.source = source
        self.stop_event = stop if stop is not None else threading.Event()
        self.samples = 0  # the samples taken (each may have written nothing: see record_sample)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one sample at a time; guards the open parts
        self._backends: Backends | None = None
        self._store: DeltaDocumentStore | None = None

    @property
    def enabled(self) -> bool:
        return self.settings.sample_interval > 0

    def start(self) -> Sampler:
        """Start the thread (nothing when sampling is off or it runs already)."""
        if not self.enabled or self._thread is not None:
            return self
        self._thread = threading.Thread(
            target=self._run, name=f"outbox-sampler ({self.source})", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (a sample in progress may finish, up to ``STOP_WAIT``) and close what
        it kept open."""
        self.stop_event.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(STOP_WAIT)
            if thread.is_alive():
                log.warning(
                    "console sampler: a sample still runs after %.0fs; left to finish", STOP_WAIT
                )
                return  # it closes its parts itself when it ends
        self._close()

    def sample_once(self) -> int:
        """One sample (what the thread does every interval); returns the rows written."""
        with self._lock:
            if not self.enabled:
                return 0
            if self._backends is None:
                self._backends = Backends(self.settings, clock=self.clock)
            written = record_sample(
                self.settings,
                self.clock,
                source=self.source,
                backends=self._backends,
                store=self._table(),
            )
            self.samples += 1
            return written

    def _table(self) -> DeltaDocumentStore | None:
        """The table kept open between samples (None: it cannot be opened now; the sample then
        tries itself, and says why)."""
        if self._store is None:
            from outbox.wiring.backends import open_document_store

            try:
                self._store = open_document_store(self.settings)
            except OutboxError:
                return None
        return self._store

    def _run(self) -> None:
        interval = self.settings.sample_interval
        due = time.monotonic()
        try:
            while not self.stop_event.is_set():
                try:
                    self.sample_once()
                except Exception as e:  # the sampler outlives a bad sample
                    log.warning("console sample failed: %s: %s", type(e).__name__, e)
                due += interval
                now = time.monotonic()
                if due < now:  # a sample outlasted the interval: skip to the next due time
                    due = now + interval - (now - due) % interval
                if self.stop_event.wait(due - now):
                    break
        finally:
            self._close()

    def _close(self) -> None:
        with self._lock:
            backends, self._backends = self._backends, None
            store, self._store = self._store, None
        if backends is not None:
            backends.close()
        if store is not None:
            store.close()

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
