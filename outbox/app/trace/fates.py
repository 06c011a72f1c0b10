"""Where a traced document's messages are in the SQL queue (waiting, or dead-lettered), which
``ProcessDocument`` commands name it, and which rescue passes commanded it: the existing indexed
reads of one session each (``peek_session``, ``DeadLetterBrowser.page``, ``list_dead_letters``),
joined by message id, and the rescuer's journal (``rescuer.journal``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from outbox.app.trace.model import (
    CommandSeen,
    DeadLettered,
    DocumentTrace,
    QueuedCopy,
    RescueSeen,
)
from outbox.core.clock import Clock
from outbox.core.errors import OutboxError
from outbox.core.settings import Settings
from rescuer.journal import kept

#: Messages read from the head of one queue session; a backlog past it is not looked at.
SESSION_LIMIT = 500
#: Dead letters read per (queue, session), newest first; commands per document.
DEAD_LETTER_LIMIT = 200


def fates(settings: Settings, clock: Clock, table_id: str, docs: list[DocumentTrace]) -> None:
    """Where each message is in the SQL queue (waiting, or dead-lettered) and which commands
    name each document. Read-only, like ``outbox status``."""
    from outbox.core.sql import read_only_url
    from outbox.wiring import Backends
    from outbox.wiring.builtin import waits_in_sql

    reading = settings.replace(sql_url=read_only_url(settings.sql_url))
    look_messages, look_commands = waits_in_sql(settings)
    for doc in docs:
        if not look_messages:
            doc.notes.append(
                f"messages went to transport {settings.transport!r}: only the table's view "
                "(pending or accepted) is shown"
            )
        if not look_commands:
            doc.notes.append(f"commands go to {settings.command_transport!r}: not looked at")
    journal = kept(settings)  # where the rescuer writes its journal
    if not (look_messages or look_commands or journal):
        return
    with Backends(reading, clock=clock) as backends:
        queue = backends.sql_queue
        for doc in docs:
            if look_messages:
                _message_places(queue, doc)
            if look_commands:
                doc.commands = list(_commands(queue, settings.command_queue, table_id, doc))
            if journal:
                doc.rescues = _rescues(queue.database, table_id, doc.id)


def _rescues(database: Any, table_id: str, doc_id: str) -> list[RescueSeen]:
    from rescuer.journal import SqlRescueJournal

    return [
        RescueSeen(e.at, e.rescuer, e.engine, e.mode, e.window_end, e.up_to_seq, e.command_id)
        for e in SqlRescueJournal(database).of_document(table_id, doc_id, DEAD_LETTER_LIMIT)
    ]


def _message_places(queue: Any, doc: DocumentTrace) -> None:
    from dispatcher.queue.browse import DeadLetterBrowser, DeadLetterFilter

    by_id = {m.message_id: m for m in doc.messages}
    browser = DeadLetterBrowser(queue.database)
    for destination, session in sorted({(m.destination, m.session_id) for m in doc.messages}):
        selection = DeadLetterFilter(queue=destination, session_id=session)
        for d in reversed(browser.page(selection, limit=DEAD_LETTER_LIMIT)):  # newest wins
            if (fate := by_id.get(d.message_id)) is not None:
                fate.dead_letter = DeadLettered(
                    d.id,
                    d.queue,
                    d.reason,
                    d.description[:300],
                    d.delivery_count,
                    d.dead_lettered_at,
                )
                fate.fate = "dead-lettered"
        for p in queue.receiver.peek_session(destination, session, SESSION_LIMIT):
            if (fate := by_id.get(p.message_id)) is not None:
                fate.queued = QueuedCopy(
                    p.queue,
                    p.state,
                    p.sequence_number,
                    p.delivery_count,
                    p.enqueued_at,
                    p.not_before,
                    p.locked_at,
                    p.locked_until,
                )
                fate.fate = p.state  # in the queue again after a requeue: waiting, not dead


def _commands(
    queue: Any, command_queue: str, table_id: str, doc: DocumentTrace
) -> Iterable[CommandSeen]:
    from dispatcher.commands import COMMAND_SUBJECT, ProcessDocument

    def ours(body: bytes) -> ProcessDocument | None:
        try:
            cmd = ProcessDocument.from_json(body)
        except OutboxError:
            return None
        return cmd if cmd.table == table_id and cmd.id == doc.id else None

    for p in queue.receiver.peek_session(command_queue, doc.id, DEAD_LETTER_LIMIT):
        if (cmd := ours(p.body)) is not None:
            yield CommandSeen(p.message_id, cmd.up_to_seq, p.state, p.delivery_count, p.enqueued_at)
    where = {"session_id": doc.id, "subject": COMMAND_SUBJECT}
    for d in queue.list_dead_letters(command_queue, DEAD_LETTER_LIMIT, where=where):
        if (cmd := ours(d.body)) is not None:
            yield CommandSeen(
                d.message_id,
                cmd.up_to_seq,
                "dead-lettered",
                d.delivery_count,
                d.dead_lettered_at,
                d.id,
                d.reason,
            )
