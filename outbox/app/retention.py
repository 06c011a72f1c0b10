"""Retention in one place: everything the project keeps that grows with use, how long it stays,
what prunes it, and what is kept right now (issue 44, item 4).

``ITEMS`` is the registry. Each item names its setting, prunes through ``prune(place, now)``
(called by ``outbox maintain``: ``prune_all``) and says what it holds through
``describe(place, now)`` (called by ``outbox status``: ``retention_section``). The retention table
in docs/operations.md is checked against it (tests/retention), so an item without a pruner or a
docs row fails a test.

Two items live in the Delta table and are pruned by ``maintain``'s table upkeep, under the
guards that upkeep holds (one maintainer, the rescuers' needed version, the maintenance lease):
the fold (superseded versions and mark rows) and the log trim (the table's history). Their
``prune`` reports what that upkeep did in the same run instead of running the step a second
time; the writers run both every ``compact_every`` versions too (``AutoCompactor``,
``AutoLogTrimmer``). The other items are rows in the SQL database (or Cosmos DB) that the
long-running processes already prune where it is cheap (the sender: duplicate ids; a consumer:
its inbox, hourly; a sampler: the samples, as it writes), and that ``maintain`` prunes in full.

Why one module: the point is one place. Every item's setting, pruner and description meet here,
so the docs table, ``outbox maintain``, ``outbox status`` and the tests all walk the same list;
an item added without a pruner, a setting or a docs row (the way a store grows for ever
unnoticed) is a failing test.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from outbox.core.clock import Clock, utc
from outbox.core.durations import format_duration
from outbox.core.errors import OutboxError, QueueError

if TYPE_CHECKING:
    from dispatcher.queue.sql_queue import SqlQueue
    from outbox.core.settings import Settings
    from outbox.delta.store import DeltaDocumentStore
    from outbox.wiring import Backends

__all__ = [
    "ITEMS",
    "Item",
    "Kept",
    "Place",
    "describe_all",
    "docs_table",
    "prune_all",
    "retention_section",
]

log = logging.getLogger("outbox.maintain")


@dataclass(frozen=True)
class Kept:
    """What an item holds now: rows (None: not counted here) and the oldest one's age."""

    rows: int | None
    oldest_age_s: float | None = None


@dataclass
class Place:
    """Where the items live: the settings, the open document store (when the caller has one),
    what ``maintain``'s table upkeep reported in this run, and the SQL side, opened on first use
    and closed with ``close``."""

    settings: Settings
    clock: Clock
    store: DeltaDocumentStore | None = None
    upkeep: Mapping[str, Any] | None = None
    _backends: Backends | None = field(default=None, repr=False)

    @property
    def backends(self) -> Backends:
        if self._backends is None:
            from outbox.wiring import Backends

            self._backends = Backends(self.settings, clock=self.clock)
        return self._backends

    @property
    def queue(self) -> SqlQueue:
        return self.backends.sql_queue

    def close(self) -> None:
        if self._backends is not None:
            self._backends.close()
            self._backends = None


def _age(now: datetime, oldest: datetime | None) -> float | None:
    return None if oldest is None else round(max(0.0, (now - utc(oldest)).total_seconds()), 1)


class Item:
    """One thing kept: ``name`` (the docs row), ``setting`` (how long, or for the fold how
    often), ``pruned_by`` (who deletes it, for the docs). Subclasses give ``prune`` and
    ``describe``; ``prune`` returns how many went (None: nothing was pruned, e.g. kept for
    ever, or the store is absent)."""

    name = ""
    setting = ""
    pruned_by = ""
    #: In the Delta table (else in the SQL database or Cosmos DB).
    table = False

    def seconds(self, settings: Settings) -> float | None:
        """The setting in seconds (None when it is not a duration); 0 keeps for ever."""
        return float(getattr(settings, self.setting))

    def prune(self, place: Place, now: datetime) -> int | None:
        raise NotImplementedError

    def describe(self, place: Place, now: datetime) -> Kept:
        raise NotImplementedError

    def cutoff(self, place: Place, now: datetime) -> datetime | None:
        """Rows older than this go; None when the setting keeps them for ever."""
        seconds = self.seconds(place.settings)
        return None if not seconds else now - timedelta(seconds=seconds)

    def logged(self, place: Place, gone: int, rows: str) -> int:
        """``gone`` rows pruned, said in the log with the age that chose them; returns it."""
        if gone:
            log.info(
                "deleted %d %s older than %s (%s)",
                gone,
                rows,
                format_duration(float(getattr(place.settings, self.setting))),
                self.setting,
            )
        return gone


class SupersededVersions(Item):
    name = "superseded versions and mark rows"
    setting = "compact_every"
    pruned_by = "the fold: writers every `compact_every` versions, `outbox maintain`"
    table = True

    def seconds(self, settings: Settings) -> float | None:
        return None  # a number of versions, and a share (FOLD_AT) per bucket: not a duration

    def prune(self, place: Place, now: datetime) -> int | None:
        folded = (place.upkeep or {}).get("folded") or {}
        removed = folded.get("rows_removed")
        return None if removed is None else int(removed)

    def describe(self, place: Place, now: datetime) -> Kept:
        """Every row of the table, current documents included (the fold leaves one per
        document), from the log's file statistics: the exact superseded count is a scan of the
        whole table (416 ms of a 1.35 s status at 20,000 documents), too much for a health check
        run every few seconds; ``outbox maintain`` reports what the fold removed."""
        if place.store is None:
            return Kept(None)
        with place.store._lock:
            place.store.refresh()
            actions = place.store.delta_table.get_add_actions(flatten=True)
        if "num_records" not in actions.column_names:
            return Kept(None)  # a writer that records no statistics
        counts = actions.column("num_records").to_pylist()
        return Kept(None if None in counts else sum(int(n) for n in counts))


class TableHistory(Item):
    name = "table history (commits, change data, removed files)"
    setting = "log_retention"
    pruned_by = (
        "the log trim, never past a rescuer's checkpoint: writers every `compact_every` "
        "versions, `outbox maintain`"
    )
    table = True

    def prune(self, place: Place, now: datetime) -> int | None:
        trim = (place.upkeep or {}).get("log_trim") or {}
        deleted = trim.get("deleted_files")
        return None if deleted is None else int(deleted)

    def describe(self, place: Place, now: datetime) -> Kept:
        from outbox.delta.log import list_log

        s = place.settings
        commits = [f for f in list_log(s.table_uri, s.storage_options) if f.commit]
        times = [f.mtime for f in commits if f.mtime is not None]
        return Kept(len(commits), _age(now, min(times)) if times else None)


class DuplicateIds(Item):
    name = "the queue's duplicate-detection ids"
    setting = "duplicate_detection_window"
    pruned_by = "each send (bounded, every half window), `outbox maintain`"

    def prune(self, place: Place, now: datetime) -> int | None:
        return place.queue.forget_expired_duplicates(limit=None)

    def describe(self, place: Place, now: datetime) -> Kept:
        from migrations.sql.tables import duplicate_ids as T

        return _count(place, now, T, T.c.seen_at)


class InboxIds(Item):
    name = "consumer inboxes' handled ids"
    setting = "inbox_retention"
    pruned_by = "each running consumer hourly, `outbox maintain` (SQL and Cosmos DB)"

    def prune(self, place: Place, now: datetime) -> int | None:
        from dispatcher.queue.inbox_pruning import PrunableInbox

        inbox = place.backends.inbox("")
        if not isinstance(inbox, PrunableInbox):
            return None
        return inbox.prune(
            now - timedelta(seconds=place.settings.inbox_retention), every_consumer=True
        )

    def describe(self, place: Place, now: datetime) -> Kept:
        from dispatcher.queue.inbox import SqlInbox
        from migrations.sql.tables import inbox as T

        # the built inbox, not its setting's name (only outbox.wiring reads names); Cosmos DB:
        # a cross-partition count per status is not cheap, so not counted
        if not isinstance(place.backends.inbox(""), SqlInbox):
            return Kept(None)
        return _count(place, now, T, T.c.handled_at)


class DeadLetters(Item):
    name = "dead letters (SQL queue)"
    setting = "dead_letter_retention"
    pruned_by = "`outbox maintain` (counted and logged)"

    def prune(self, place: Place, now: datetime) -> int | None:
        before = self.cutoff(place, now)
        if before is None:
            return None
        return self.logged(place, place.queue.admin.prune_dead_letters(before), "dead letter(s)")

    def describe(self, place: Place, now: datetime) -> Kept:
        rows, oldest = place.queue.admin.oldest_dead_letter()
        return Kept(rows, _age(now, oldest))


class FinishedClaims(Item):
    name = "geo claim log: completed and failed claims"
    setting = "claim_retention"
    pruned_by = "`outbox maintain` (SQL and Cosmos DB claim logs)"

    def prune(self, place: Place, now: datetime) -> int | None:
        before = self.cutoff(place, now)
        found = place.backends.claim_log() if before is not None else None
        prune = getattr(found, "prune", None)  # a claim log of a third party may not prune
        return None if before is None or prune is None else int(prune(before))

    def describe(self, place: Place, now: datetime) -> Kept:
        from dispatcher.claims.sql import SqlClaimLog

        found = place.backends.claim_log()
        if not isinstance(found, SqlClaimLog):
            return Kept(None)  # Cosmos DB: a cross-partition count is not a health check's read
        rows, oldest = found.oldest_finished()
        return Kept(rows, _age(now, oldest))


class Samples(Item):
    name = "the console's samples and the rescuer's journal"
    setting = "sample_retention"
    pruned_by = "each sampler as it writes (bounded), `outbox maintain` (both)"

    def prune(self, place: Place, now: datetime) -> int | None:
        """In batches of the sampler's ``PRUNE_BATCH`` (the oldest first), one short write
        each: weeks of samples left by a long pause never hold SQLite's write lock for long.
        Then the rescuer's journal (``rescuer.journal``: a row per command a pass enqueued)."""
        from sqlalchemy import delete, func, select

        from migrations.sql.tables import samples as T
        from outbox.app.history import PRUNE_BATCH
        from rescuer.journal import SqlRescueJournal

        journal = SqlRescueJournal(place.queue.database)
        before = now - timedelta(seconds=place.settings.sample_retention)
        gone = journal.prune(before)
        cutoff = int(before.timestamp())
        old = select(T.c.taken_at_s).where(T.c.taken_at_s < cutoff)
        batch = old.order_by(T.c.taken_at_s).limit(PRUNE_BATCH).subquery()
        done = 0
        while True:
            with place.queue.database.write("prune console samples") as conn:
                last = conn.execute(select(func.max(batch.c.taken_at_s))).scalar()
                if last is None:
                    return done + gone
                done += int(conn.execute(delete(T).where(T.c.taken_at_s <= last)).rowcount)

    def describe(self, place: Place, now: datetime) -> Kept:
        from sqlalchemy import func, select

        from migrations.sql.tables import samples as T

        with place.queue.database.read("count console samples") as conn:
            rows, oldest = conn.execute(select(func.count(), func.min(T.c.taken_at_s))).one()
        age = None if oldest is None else round(max(0.0, now.timestamp() - int(oldest)), 1)
        return Kept(int(rows), age)


class FinishedReplays(Item):
    name = "finished replays and their chunk records"
    setting = "replay_retention"
    pruned_by = (
        "`outbox maintain`; never an unfinished replay (it holds the log trim, for at most "
        "`replay_retention` after it started)"
    )

    def prune(self, place: Place, now: datetime) -> int | None:
        """By when each finished (its last chunk recorded); an unfinished one stays whatever
        its age: its rows are the cursor of ``--resume`` and the chunks not to send again."""
        from outbox.app.replay import prune_finished

        before = self.cutoff(place, now)
        if before is None:
            return None
        gone = prune_finished(place.queue.database, before)
        return self.logged(place, gone, "finished replay(s)")

    def describe(self, place: Place, now: datetime) -> Kept:
        from outbox.app.replay_status import finished_replays

        rows, oldest = finished_replays(place.queue.database)
        return Kept(rows, _age(now, oldest))


class AuditTrail(Item):
    name = "the audit trail (console and CLI actions)"
    setting = "audit_retention"
    pruned_by = "`outbox maintain`, when `audit_retention` is set (kept for ever by default)"

    def prune(self, place: Place, now: datetime) -> int | None:
        from outbox.app.operators import Audit

        before = self.cutoff(place, now)
        if before is None:
            return None
        gone = Audit(place.queue.database, place.clock).prune(before)
        return self.logged(place, gone, "audit row(s)")

    def describe(self, place: Place, now: datetime) -> Kept:
        from migrations.sql.tables import audit as T

        return _count(place, now, T, T.c.at)


def _count(place: Place, now: datetime, table: Any, at: Any) -> Kept:
    from sqlalchemy import func, select

    with place.queue.database.read(f"count {table.name}") as conn:
        rows, oldest = conn.execute(select(func.count(), func.min(at)).select_from(table)).one()
    return Kept(int(rows), _age(now, oldest))


#: Everything kept, in the order of the docs table.
ITEMS: tuple[Item, ...] = (
    SupersededVersions(),
    TableHistory(),
    DuplicateIds(),
    InboxIds(),
    DeadLetters(),
    FinishedClaims(),
    Samples(),
    FinishedReplays(),
    AuditTrail(),
)


def prune_all(place: Place, *, dry_run: bool = False) -> list[dict[str, Any]]:
    """Prune every item (``outbox maintain``): ``[{item, setting, setting_s, deleted}]``;
    ``deleted`` is None for a dry run, an item kept for ever, or a store that is absent (no
    queue database: nothing to prune). A failure is logged and the other items still run."""
    now = utc(place.clock.now())
    out: list[dict[str, Any]] = []
    for item in ITEMS:
        deleted: int | None = None
        if not dry_run:  # a dry run's table report says what would go: under its own keys
            try:
                deleted = item.prune(place, now)
            except QueueError:  # no queue database (or not migrated): nothing to prune there
                pass
            except OutboxError as e:
                log.warning(
                    "pruning %s failed (the next `outbox maintain` tries again): %s", item.name, e
                )
        out.append(
            {
                "item": item.name,
                "setting": item.setting,
                "setting_s": item.seconds(place.settings),
                "deleted": deleted,
            }
        )
    return out


def describe_all(
    place: Place, *, table: bool, read: bool = True
) -> tuple[list[dict[str, Any]], list[str]]:
    """What the table's items (``table``) or the others hold (``outbox status``): ``[{item,
    setting, setting_s, rows, oldest_age_s}]``, and the errors of those that could not be read
    (their ``rows`` None). ``read=False``: none is read (their store is known to be down). The
    first error stops the reads of the rest: they share the store, and each read of a locked
    SQLite file waits for its lock, which a health check cannot afford five times."""
    now = utc(place.clock.now())
    out: list[dict[str, Any]] = []
    errors: list[str] = []
    for item in ITEMS:
        if item.table != table:
            continue
        kept = Kept(None)
        if read and not errors:
            try:
                kept = item.describe(place, now)
            except OutboxError as e:
                errors.append(str(e))
        out.append(
            {
                "item": item.name,
                "setting": item.setting,
                "setting_s": item.seconds(place.settings),
                "rows": kept.rows,
                "oldest_age_s": kept.oldest_age_s,
            }
        )
    return out, errors


def retention_section(
    settings: Settings, clock: Clock, store: DeltaDocumentStore, problems: list[str]
) -> list[dict[str, Any]]:
    """``outbox status``'s section: every item, ``{item, setting, setting_s, rows,
    oldest_age_s}`` (rows None where not counted), what could not be read added to ``problems``
    as ``retention: ...``. The items in the SQL database are not read when ``problems`` already
    says the queues' database could not be (``queues: ...``): it is the same database, and each
    read of a locked SQLite file waits for the lock."""
    place = Place(settings, clock, store=store)
    read = not any(p.startswith("queues:") for p in problems)
    try:
        table, unread = describe_all(place, table=True)
        rest, more = describe_all(place, table=False, read=read)
    finally:
        place.close()
    problems.extend(f"retention: {e}" for e in [*unread, *more])
    order = [i.name for i in ITEMS]
    return sorted([*table, *rest], key=lambda r: order.index(r["item"]))


def docs_table() -> str:
    """The retention table of docs/operations.md (between its ``retention`` markers), from
    ``ITEMS`` and the settings' declared defaults: a test fails when the page drifts from it."""
    import dataclasses

    from outbox.core.settings import Settings
    from outbox.core.settings_values import shown_default

    fields = {f.name: f for f in dataclasses.fields(Settings)}
    rows = ["| kept | setting | default | pruned by |", "|---|---|---|---|"]
    for item in ITEMS:
        shown = shown_default(fields[item.setting])
        rows.append(f"| {item.name} | `{item.setting}` | {shown} | {item.pruned_by} |")
    return "\n".join(rows) + "\n"
