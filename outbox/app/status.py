"""``outbox status``: what an operator needs at 3 a.m., in one read-only look.

Pending documents and messages and the oldest pending message's age (from the table), each
rescuer checkpoint with its lag (versions and seconds behind the table), queue depths and the
oldest dead letter (from the SQL database), and the pending documents whose ``ProcessDocument``
command was dead-lettered. Those last ones matter most: no rescue pass in feed mode will command
them again until they change (docs/rescuer.md), so only ``outbox dead-letters requeue`` re-drives
them. Nothing here writes: it is safe to run as a health check every few seconds, next to running
workers and rescuers.

Why one module: it assembles one report; the sections with rules of their own already live
beside it (``outbox.app.keys``, ``outbox.app.retention``, ``outbox.app.replay_status``), and what
stays here is the table's and the queues' reads and the report's shape.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from outbox.app.keys import PAUSED_KEYS_LISTED, PausedKey, paused_keys
from outbox.app.replay_status import status_section as replay_status_section
from outbox.core.clock import Clock, utc
from outbox.core.errors import OutboxError
from outbox.core.settings import Settings
from rescuer.checkpoint import StaleRescuer, stale_rescuers


@dataclass
class CheckpointStatus:
    rescuer: str
    version: int | None
    lag_versions: int
    lag_seconds: float
    last_pass_at: datetime | None
    last_pass_age_seconds: float | None
    last_mode: str | None


@dataclass
class QueueDepth:
    """One queue's statistics: the one shape of ``status --json``'s ``queues`` items and of
    ``queue stats --json``'s, so a script reads both the same way."""

    queue: str
    active: int
    scheduled: int
    locked: int
    dead_lettered: int
    deferred: int = 0  # set aside by ``defer``

    @classmethod
    def of(cls, stats: Any) -> QueueDepth:
        """From a queue's ``stats()`` value (the SQL queue's or Service Bus's)."""
        return cls(
            stats.queue,
            stats.active,
            stats.scheduled,
            stats.locked,
            stats.dead_lettered,
            stats.deferred,
        )


@dataclass
class UnreadQueue:
    """A queue whose oldest message was never received, though older than a lock duration: no
    consumer reads it (a misspelt ``destination=``, or its consumer is down)."""

    queue: str
    active: int
    oldest_age_seconds: float


@dataclass
class DeadLetterInfo:
    id: int
    queue: str
    message_id: str
    reason: str
    description: str
    dead_lettered_at: datetime
    age_seconds: float


@dataclass
class DeadLetteredCommand:
    """A pending document whose ``ProcessDocument`` command sits in the dead letters."""

    document_id: str
    last_seq: int
    dispatched_seq: int
    up_to_seq: int  # the command's
    dead_letter_id: int
    reason: str
    dead_lettered_at: datetime


#: How many command dead letters ``outbox status`` reads, oldest first: enough for any incident
#: an operator handles by hand, and a bounded read for a health check that runs every few seconds.
DEAD_LETTER_SCAN_LIMIT = 10_000
#: How many of those documents the report lists (the count covers them all).
DEAD_LETTERED_LISTED = 20


@dataclass
class StatusReport:
    table_uri: str
    sql_url: str
    table_version: int
    pending_documents: int
    pending_messages: int
    oldest_pending_age_seconds: float | None
    oldest_pending_document: str | None
    #: Files in ``_delta_log`` and the oldest version they still hold: every commit lists them
    #: all (docs/delta.md), so a growing count is the first thing to check when commits slow.
    log_files: int | None = None
    oldest_log_version: int | None = None
    checkpoints: list[CheckpointStatus] = field(default_factory=list)
    queues: list[QueueDepth] = field(default_factory=list)
    oldest_dead_letter: DeadLetterInfo | None = None
    #: Pending documents whose ``ProcessDocument`` command is dead-lettered, and the first
    #: ``DEAD_LETTERED_LISTED`` of them. Nothing re-drives these on its own: the fix is
    #: ``outbox dead-letters requeue --where queue=<command queue> --where session_id=<id>``
    #: (or ``--where reason=...``) once the cause is gone. None when the queue could not be read.
    dead_lettered_documents: int | None = None
    dead_lettered_commands: list[DeadLetteredCommand] = field(default_factory=list)
    #: Queues (other than the command queue) with messages nobody has received: see
    #: ``UnreadQueue``. Declaring ``destinations`` stops the misspelt ones at ``send``.
    unread_queues: list[UnreadQueue] = field(default_factory=list)
    #: Parts that could not be read (a corrupt checkpoint, a database that is down). The rest of
    #: the report is still filled in: at 3 a.m. the queue depths matter even when a checkpoint
    #: is broken.
    problems: list[str] = field(default_factory=list)
    #: Where the rescuer checkpoints were read: ``sql`` (the database above) or ``cosmos
    #: <endpoint> <database>/<container>`` (``checkpoint_store`` setting, docs/cosmos.md).
    checkpoint_store: str = "sql"
    #: Rescuers that have not run for an hour and hold back the log trim and the vacuum (a
    #: retired rescuer, or a name typed once): ``rescuer.checkpoint.stale_rescuers``.
    stale_rescuers: list[StaleRescuer] = field(default_factory=list)
    #: Ordering keys paused by a failed send (in any process), and the first
    #: ``PAUSED_KEYS_LISTED`` of them: their later messages wait until the gate is delivered.
    #: A gate whose command was dead-lettered holds its key until ``outbox keys resume``.
    #: None when the queue database could not be read.
    paused_key_count: int | None = None
    paused_keys: list[PausedKey] = field(default_factory=list)
    replays: list[Any] = field(default_factory=list)  # outbox.app.replay_status's section
    retention: list[dict[str, Any]] = field(default_factory=list)  # outbox.app.retention

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def collect_status(settings: Settings, clock: Clock) -> StatusReport:
    """Read the table, the checkpoints and the queues.

    An unreadable table raises (there is nothing to report without it); an unreadable checkpoint
    or queue database is recorded in ``problems`` and the rest is still reported.
    """
    from outbox.app.retention import retention_section
    from outbox.core.sql import read_only_url, redact_url
    from outbox.delta import schema as S
    from outbox.delta.log import list_log
    from outbox.wiring.backends import open_document_store

    now = utc(clock.now())
    # Read-only: a health check never creates the SQLite file, never waits for (or takes) its
    # write lock, and runs on a read-only workspace.
    reading = settings.replace(sql_url=read_only_url(settings.sql_url))
    store = open_document_store(settings)
    pending: dict[str, dict[str, Any]] = {}
    try:
        table_id = store.table_id
        version = store.refresh()
        rows = store.scan_pending(
            columns=["id", "dispatched_seq", "last_seq", "outbox", S.INCARNATION]
        )
        oldest: tuple[datetime, str] | None = None
        messages = 0
        for r in rows.to_pylist():
            pending[str(r["id"])] = r
            messages += int(r["last_seq"]) - int(r["dispatched_seq"])
            for m in r["outbox"] or []:
                created = m.get("created_at")
                if int(m["seq"]) > int(r["dispatched_seq"]) and created is not None:
                    created = utc(created)
                    if oldest is None or created < oldest[0]:
                        oldest = (created, str(r["id"]))
        report = StatusReport(
            table_uri=settings.table_uri,
            sql_url=redact_url(settings.sql_url),
            table_version=version,
            pending_documents=rows.num_rows,
            pending_messages=messages,
            oldest_pending_age_seconds=(
                round((now - oldest[0]).total_seconds(), 1) if oldest else None
            ),
            oldest_pending_document=oldest[1] if oldest else None,
            checkpoint_store=settings.checkpoint_store,
        )
        files = None
        try:
            files = list_log(settings.table_uri, settings.storage_options)
            report.log_files = len(files)
            report.oldest_log_version = min((f.version for f in files), default=None)
        except OutboxError as e:
            report.problems.append(f"delta log: {e}")
        _rescuers(
            report,
            settings,
            reading=reading,
            clock=clock,
            now=now,
            table=store.delta_table,
            files=files,
        )
        try:
            _queues(report, reading, clock, now=now, table_id=table_id, pending=pending)
        except OutboxError as e:
            report.problems.append(f"queues: {e}")
        report.retention = retention_section(reading, clock, store, report.problems)
    finally:
        store.close()
    replay_status_section(report, reading, clock)
    return report


def _queues(
    report: StatusReport,
    settings: Settings,
    clock: Clock,
    *,
    now: datetime,
    table_id: str,
    pending: dict[str, dict[str, Any]],
) -> None:
    """The SQL queue's depths and dead letters, and the command queue's when the commands go
    elsewhere (Service Bus: its depth counts locked commands as active)."""
    from outbox.wiring import Backends

    with Backends(settings, clock=clock) as backends:
        queue = backends.sql_queue
        commands = backends.command_queue()
        _dead_lettered_commands(report, commands, settings.command_queue, table_id, pending)
        if commands is not queue:
            for q in commands.stats().values():
                report.queues.append(QueueDepth.of(q))
        for q in queue.stats().values():
            report.queues.append(QueueDepth.of(q))
        _unread(report, queue, settings, now)
        from dispatcher.queue.key_lines import SqlKeyLines

        report.paused_key_count = SqlKeyLines(queue.database).count()
        if report.paused_key_count:
            report.paused_keys = paused_keys(queue, now, PAUSED_KEYS_LISTED)
        dead = queue.list_dead_letters(limit=1)
        if dead:
            d = dead[0]
            report.oldest_dead_letter = DeadLetterInfo(
                d.id,
                d.queue,
                d.message_id,
                d.reason,
                d.description[:300],
                d.dead_lettered_at,
                round((now - utc(d.dead_lettered_at)).total_seconds(), 1),
            )


def _unread(report: StatusReport, queue: Any, settings: Settings, now: datetime) -> None:
    for depth in report.queues:
        if depth.queue == settings.command_queue or not depth.active or depth.locked:
            continue
        head = queue.peek(depth.queue, 1)
        if not head or head[0].state != "active" or head[0].delivery_count:
            continue
        age = (now - utc(head[0].enqueued_at)).total_seconds()
        if age > settings.lock_duration:
            report.unread_queues.append(UnreadQueue(depth.queue, depth.active, round(age, 1)))


def _rescuers(
    report: StatusReport,
    settings: Settings,
    *,
    reading: Settings,
    clock: Clock,
    now: datetime,
    table: Any,
    files: Any,
) -> None:
    """Each rescuer checkpoint with its lag, and a damaged commit a rescuer still reads."""
    from outbox.wiring import Backends

    listed = None
    try:
        with Backends(reading, clock=clock) as backends:
            checkpoints = backends.checkpoint_store()
            report.checkpoint_store = getattr(checkpoints, "where", settings.checkpoint_store)
            listed = checkpoints.list(settings.table_uri)
    except OutboxError as e:
        report.problems.append(f"rescuer checkpoints: {e}")
    damaged = _damaged_log(report, settings, files, listed) if files is not None else None
    try:
        for cp in listed or []:
            report.checkpoints.append(_checkpoint(cp, table, report.table_version, now, damaged))
    except OutboxError as e:
        report.problems.append(f"rescuer checkpoints: {e}")
    if listed:
        report.stale_rescuers = stale_rescuers(listed, latest_version=report.table_version, now=now)


def _damaged_log(
    report: StatusReport, settings: Settings, files: Any, checkpoints: list[Any] | None
) -> int | None:
    """Report a commit file a rescuer still reads that cannot be parsed (a "delta log" problem),
    and return its version (None: none is damaged). A checkpoint that covers such a commit keeps
    the table readable, so nothing else here would notice, while every rescue pass fails on it.
    With no checkpoints (or none readable) the whole log is checked."""
    from outbox.delta.log_check import find_damaged_commit

    needed = [-1 if cp.version is None else cp.version for cp in checkpoints or []]
    first = min(needed) + 1 if needed else None
    try:
        damaged = find_damaged_commit(
            settings.table_uri, settings.storage_options, first=first, files=files
        )
    except OutboxError as e:
        report.problems.append(f"delta log: {e}")
        return None
    if damaged is None:
        return None
    report.problems.append(f"delta log: {damaged.error(settings.table_uri)}")
    return damaged.version


def _checkpoint(
    cp: Any, delta_table: Any, latest: int, now: datetime, damaged: int | None = None
) -> CheckpointStatus:
    from rescuer.window import HISTORY_LIMIT, lag_seconds

    covered = cp.version if cp.version is not None else -1
    lag_versions = max(0, latest - covered)
    # The age of the oldest commit the checkpoint does not cover yet: how far behind it is.
    # Timed at most HISTORY_LIMIT commits back (and never across a damaged commit, which cannot
    # be read); beyond that the lag in seconds is a lower bound.
    limit = HISTORY_LIMIT if damaged is None else min(HISTORY_LIMIT, latest - damaged)
    lag = lag_seconds(delta_table, cp.version, latest, now, limit=limit)
    last = cp.last_pass_at
    return CheckpointStatus(
        rescuer=cp.rescuer_name,
        version=cp.version,
        lag_versions=lag_versions,
        lag_seconds=round(lag, 1),
        last_pass_at=last,
        last_pass_age_seconds=round(max(0.0, (now - last).total_seconds()), 1) if last else None,
        last_mode=cp.details.get("mode"),
    )


def _dead_lettered_commands(
    report: StatusReport,
    queue: Any,
    command_queue: str,
    table_id: str,
    pending: dict[str, dict[str, Any]],
) -> None:
    """Match the command queue's dead letters against the pending documents.

    A command counts when it names this table and a document that is still pending in the same
    incarnation (a dead letter for a document since dispatched, or deleted and created again, is
    history, not a stuck document). Malformed commands are left to ``oldest_dead_letter``.
    """
    from dispatcher.commands import COMMAND_SUBJECT, ProcessDocument
    from outbox.delta import schema as S

    report.dead_lettered_documents = 0
    if not pending:
        return
    found: dict[str, DeadLetteredCommand] = {}
    dead = queue.list_dead_letters(
        command_queue, DEAD_LETTER_SCAN_LIMIT, where={"subject": COMMAND_SUBJECT}
    )
    for d in dead:
        try:
            cmd = ProcessDocument.from_json(d.body)
        except OutboxError:
            continue
        row = pending.get(cmd.id)
        if cmd.table != table_id or row is None:
            continue
        if cmd.incarnation is not None and cmd.incarnation != row.get(S.INCARNATION):
            continue
        found[cmd.id] = DeadLetteredCommand(  # oldest first: the newest dead letter wins
            document_id=cmd.id,
            last_seq=int(row["last_seq"]),
            dispatched_seq=int(row["dispatched_seq"]),
            up_to_seq=cmd.up_to_seq,
            dead_letter_id=d.id,
            reason=d.reason,
            dead_lettered_at=d.dead_lettered_at,
        )
    report.dead_lettered_documents = len(found)
    report.dead_lettered_commands = sorted(found.values(), key=lambda c: c.dead_lettered_at)[
        :DEAD_LETTERED_LISTED
    ]
