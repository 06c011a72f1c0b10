"""Old and young rows of every retention item, written through their own code with a clock set
in the past (no sleeps), and the checks that the old ones went and the young ones stayed.

The CLI runs ``outbox maintain`` on the real clock; the rows are days older or younger than each
retention (hours for the duplicate ids, whose window the tests set to a day), so no check depends
on how long a run takes. One workspace holds every item: ``seed`` writes them all, ``CHECKS``
holds one check per registry item (tests/retention/test_retention.py runs them, and runs each
again with that item's pruner disabled, where it must fail).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result
from sqlalchemy import delete, func, select

from dispatcher.claims.sql import SqlClaimLog
from dispatcher.queue import QueueMessage, SqlQueue
from dispatcher.queue.inbox import SqlInbox
from migrations.sql.tables import (
    audit,
    duplicate_ids,
    inbox,
    queue_messages,
    replay_chunks,
    replays,
    rescues,
    samples,
)
from outbox import Outbox
from outbox.app.cli import main
from outbox.app.history import History, Sample
from outbox.app.operators import Audit
from outbox.core.clock import ManualClock
from outbox.delta.log import list_log
from rescuer.journal import RescueEntry, SqlRescueJournal

DAY = timedelta(days=1)
HOUR = timedelta(hours=1)
DOC = "pkg-1"


@dataclass
class Seeded:
    ws: Path
    url: str
    env: dict[str, str]
    #: commit versions older than the log retention, and the first kept checkpoint's version
    old_commits: list[int]
    kept_from: int
    #: the seeded replays' ids: "old" and "young" finished, "unfinished" (old)
    replays: dict[str, str] = field(default_factory=dict)


def cli(seeded: Seeded, *args: str) -> Result:
    return CliRunner().invoke(main, ["-w", str(seeded.ws), *args], env=seeded.env)


def workspace(path: Path, url: str) -> Seeded:
    """A migrated workspace on ``url`` (SQLite file or PostgreSQL) with one document saved four
    times (superseded versions for the fold)."""
    env = {"OUTBOX_SQL_URL": url, "OUTBOX_DUPLICATE_DETECTION_WINDOW": "1d", "COLUMNS": "200"}
    env["OUTBOX_AUDIT_RETENTION"] = "30d"  # kept for ever by default
    with Outbox.open(
        path, transport="memory", default_destination="shipments", sql_url=url, compact_every=0
    ) as ob:
        with ob.unit_of_work() as uow:
            uow.create(DOC, type="Package").send("Left", {"at": "Seattle"})
        for i in range(3):
            _touch(ob, "step", i)
    return Seeded(path, url, env, [], 0)


def _touch(ob: Outbox, key: str, value: int) -> None:
    """A new version of the document (its state changed)."""
    with ob.unit_of_work() as uow:
        doc = uow.get(DOC)
        assert doc is not None
        doc.state[key] = value


def seed(seeded: Seeded) -> None:
    """Every item's old and young rows (the table's first: its ``outbox maintain`` would prune
    the others)."""
    _old_history(seeded)
    now = datetime.now(UTC)
    url = seeded.url
    for name, at in (("old", now - 31 * DAY), ("young", now - DAY)):
        with SqlQueue(url, clock=ManualClock(at)) as queue:
            queue.send("poison", QueueMessage(b"x", message_id=f"dead-{name}"))
            (got,) = queue.receive("poison")
            queue.dead_letter(got, "Bad", "kept for the retention test")
    _replays(seeded, now)
    with SqlQueue(url) as queue, queue.database.write("forget the sends' ids") as conn:
        conn.execute(delete(duplicate_ids))  # those sends' own ids: only the two below count
        conn.execute(delete(queue_messages).where(queue_messages.c.queue == PARKED))
    # young first: a send forgets the ids older than its own time less the window
    for name, at in (("young", now - HOUR), ("old", now - 2 * DAY)):
        window = DAY.total_seconds()
        with SqlQueue(url, clock=ManualClock(at), duplicate_detection_window=window) as queue:
            queue.send("orders", QueueMessage(b"x", message_id=f"dup-{name}"))
    with SqlQueue(url) as queue:
        billing = SqlInbox(queue.database, "billing")
        billing.record("inbox-old", at=now - 8 * DAY)
        billing.record("inbox-young", at=now - DAY)
        history = History(queue.database)  # young first: a write prunes by its own time
        for name, at in (("young", now - DAY), ("old", now - 9 * DAY)):
            history.record([Sample(f"retention-{name}", "", 1.0)], at=at, interval=60, source="t")
            entry = RescueEntry(
                "t", f"rescued-{name}", 1, f"pd-{name}", "r", "local", "feed", 1, at
            )
            SqlRescueJournal(queue.database).record([entry])
    with SqlQueue(url) as queue:
        for name, at in (("old", now - 31 * DAY), ("young", now - DAY)):
            Audit(queue.database, ManualClock(at)).record("ops", "requeue", f"audit-{name}", "ok")
    claims = SqlClaimLog(url)
    try:
        for name, at in (("old", now - 8 * DAY), ("young", now - DAY)):
            key = f"claim-{name}"
            claims.claim(key, "east", lease=HOUR, at=at)
            claims.complete(key, "east", at=at)
        claims.claim("claim-working", "east", lease=HOUR, at=now - 8 * DAY)  # live state: stays
    finally:
        claims.close()


#: Where the seeded replays' commands go (no worker reads it; the seed empties it).
PARKED = "retention-parked"


def _replays(seeded: Seeded, now: datetime) -> None:
    """Three replays of version 1 (one message, one chunk), planned and recorded by their own
    code on a clock set to each one's time: an old finished one (31 days ago, past
    ``replay_retention``), a young finished one (a day ago), and an old unfinished one whose
    planner stopped before it marked the replay enqueued while its one chunk was sent and
    recorded (31 days ago too: status ``planning``, with a chunk row)."""
    from dispatcher.replay_handler import ChunkLog
    from outbox.app.replay import ReplayRequest, Replays

    for name, started, finished in (
        ("old", now - 32 * DAY, now - 31 * DAY),
        ("young", now - 2 * DAY, now - DAY),
        ("unfinished", now - 32 * DAY, now - 31 * DAY),
    ):
        clock = ManualClock(started)
        with Outbox.open(
            seeded.ws,
            transport="memory",
            sql_url=seeded.url,
            compact_every=0,
            command_queue=PARKED,
            clock=clock,
        ) as ob:
            db = ob.runtime.queue.database
            runs = Replays(ob.settings, ob.store, db, ob.runtime.commands, clock)
            run = runs.start(ReplayRequest("1", "1"))
            assert (len(run.chunks), run.messages) == (1, 1), run
            if name != "unfinished":
                runs.enqueue(run)
            ChunkLog(db).record(run.replay_id, 0, run.messages, finished)
            seeded.replays[name] = run.replay_id


def _old_history(seeded: Seeded) -> None:
    """A checkpoint (``outbox maintain`` without the trim), commits after it, and every commit
    before it made a day old: the log trim may take those, never the young ones after."""
    result = cli(seeded, "maintain", "--no-trim-log", "--no-compact")
    assert result.exit_code == 0, result.output
    with Outbox.open(seeded.ws, transport="memory", sql_url=seeded.url, compact_every=0) as ob:
        for i in range(2):
            _touch(ob, "later", i)
    files = list_log(str(seeded.ws / "documents"))
    kept_from = max(f.version for f in files if f.checkpoint)
    old = [f for f in files if f.commit and f.version <= kept_from]  # the checkpoint's too
    stamp = (datetime.now(UTC) - DAY).timestamp()
    for f in old:
        os.utime(seeded.ws / "documents" / f.path, (stamp, stamp))
    seeded.old_commits = sorted(f.version for f in old if f.version < kept_from)
    seeded.kept_from = kept_from


# --- the checks, one per registry item ---------------------------------------------------------


def _count(url: str, table: Any, *where: Any) -> int:
    with SqlQueue(url) as queue, queue.database.read("count") as conn:
        return int(conn.execute(select(func.count()).select_from(table).where(*where)).scalar())


def check_versions(seeded: Seeded, report: dict[str, Any]) -> None:
    with Outbox.open(seeded.ws, transport="memory", sql_url=seeded.url, create=False) as ob:
        rows = ob.store._query("SELECT id, version FROM t").to_pylist()
        assert [r["id"] for r in rows] == [DOC], rows  # one row left: the newest version
    assert (_deleted(report, "compact_every") or 0) >= 4


def check_history(seeded: Seeded, report: dict[str, Any]) -> None:
    commits = {f.version for f in list_log(str(seeded.ws / "documents")) if f.commit}
    assert seeded.old_commits, "the seed made no old commit"
    assert not commits & set(seeded.old_commits), sorted(commits)
    assert max(commits) > seeded.kept_from  # the young commits after the checkpoint stay
    assert (_deleted(report, "log_retention") or 0) >= len(seeded.old_commits)


def check_duplicate_ids(seeded: Seeded, report: dict[str, Any]) -> None:
    left = _ids(seeded.url, duplicate_ids, duplicate_ids.c.message_id)
    assert left == ["dup-young"], left
    assert _deleted(report, "duplicate_detection_window") == 1


def check_inbox(seeded: Seeded, report: dict[str, Any]) -> None:
    assert _ids(seeded.url, inbox, inbox.c.message_id) == ["inbox-young"]
    assert _deleted(report, "inbox_retention") == 1


def check_dead_letters(seeded: Seeded, report: dict[str, Any]) -> None:
    with SqlQueue(seeded.url) as queue:
        left = [d.message_id for d in queue.list_dead_letters()]
    assert left == ["dead-young"], left
    assert _deleted(report, "dead_letter_retention") == 1


def check_claims(seeded: Seeded, report: dict[str, Any]) -> None:
    claims = SqlClaimLog(seeded.url)
    try:
        assert claims.read("claim-old") is None
        assert claims.read("claim-young") is not None
        assert claims.read("claim-working") is not None  # old, but not finished: live state
    finally:
        claims.close()
    assert _deleted(report, "claim_retention") == 1


def check_samples(seeded: Seeded, report: dict[str, Any]) -> None:
    assert _ids(seeded.url, samples, samples.c.metric) == ["retention-young"]
    assert _ids(seeded.url, rescues, rescues.c.doc_id) == ["rescued-young"]
    assert _deleted(report, "sample_retention") == 2  # a sample and a journal row


def check_replays(seeded: Seeded, report: dict[str, Any]) -> None:
    r = seeded.replays
    with SqlQueue(seeded.url) as queue, queue.database.read("read the replays") as conn:
        rows = conn.execute(select(replays.c.replay_id, replays.c.status))
        left = {replay_id: status for replay_id, status in rows}
        chunks = set(conn.execute(select(replay_chunks.c.replay_id)).scalars())
    # the old finished one went with its chunk row; the unfinished one stays, however old
    assert left == {r["young"]: "done", r["unfinished"]: "planning"}, (left, r)
    assert chunks == {r["young"], r["unfinished"]}, (chunks, r)
    assert _deleted(report, "replay_retention") == 1


def check_audit(seeded: Seeded, report: dict[str, Any]) -> None:
    assert _ids(seeded.url, audit, audit.c.target) == ["audit-young"]
    assert _deleted(report, "audit_retention") == 1


def _ids(url: str, table: Any, column: Any) -> list[str]:
    with SqlQueue(url) as queue, queue.database.read("read") as conn:
        return sorted(str(v) for v in conn.execute(select(column).select_from(table)).scalars())


def _deleted(report: dict[str, Any], setting: str) -> Any:
    (item,) = [i for i in report["retention"] if i["setting"] == setting]
    return item["deleted"]


#: One check per registry item, by its setting.
CHECKS: dict[str, Callable[[Seeded, dict[str, Any]], None]] = {
    "compact_every": check_versions,
    "log_retention": check_history,
    "duplicate_detection_window": check_duplicate_ids,
    "inbox_retention": check_inbox,
    "dead_letter_retention": check_dead_letters,
    "claim_retention": check_claims,
    "sample_retention": check_samples,
    "replay_retention": check_replays,
    "audit_retention": check_audit,
}

#: Each pruner, and the edit that disables it (``tests.mutate.mutated``).
DISABLED: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "compact_every": (
        "outbox.app.maintenance:_upkeep",
        (("report.folded = fold_table(store, at=opts.fold_at).to_dict()", "report.folded = {}"),),
    ),
    "log_retention": (
        "outbox.app.maintenance:_upkeep",
        (("if opts.log_retention_seconds is not None:", "if False:"),),
    ),
    "duplicate_detection_window": (
        "outbox.app.retention:DuplicateIds.prune",
        (("return place.queue.forget_expired_duplicates(limit=None)", "return 0"),),
    ),
    "inbox_retention": (
        "outbox.app.retention:InboxIds.prune",
        (("return inbox.prune(", "return 0 and inbox.prune("),),
    ),
    "dead_letter_retention": (
        "dispatcher.queue.admin:SqlQueueAdministration.prune_dead_letters",
        (("return self._purge(", "return 0 and self._purge("),),
    ),
    "claim_retention": (
        "dispatcher.claims.sql:SqlClaimLog.prune",
        (("C.updated_at < before]", "C.updated_at < before, C.version < 0]"),),
    ),
    "sample_retention": (
        "outbox.app.retention:Samples.prune",
        (
            ("T.c.taken_at_s < cutoff", "T.c.taken_at_s < 0"),
            ("gone = journal.prune(", "gone = 0 and ("),
        ),
    ),
    "audit_retention": (
        "outbox.app.operators:Audit.prune",
        (("A.c.at < before", "A.c.at < before, A.c.id < 0"),),
    ),
    "replay_retention": (
        "outbox.app.replay:prune_finished",
        (
            (
                "replays.c.finished_at < before)",
                "replays.c.finished_at < before, replays.c.chunks < 0)",
            ),
        ),
    ),
}
