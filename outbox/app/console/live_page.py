"""The console's live messages (issue 46, item 2): per queue, the messages waiting in each state
(active, scheduled, deferred, locked) a page at a time, one message with its body and headers
(shown as the dead-letter page shows them), and the sessions with their head message.

Read-only on purpose: a consumer may receive any of these the next moment, so the pages offer no
action that could race one (``dispatcher.queue.live`` only reads). A lock's holder is not shown
because the queue does not know it: a lock is a token its receiver keeps; the pages show when
the lock was taken and until when it holds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import Flask, Response, abort, render_template, request

from dispatcher.queue import validation
from dispatcher.queue.live import STATES, LiveSession
from outbox.app.console import listing, reads
from outbox.core.errors import ValidationError

if TYPE_CHECKING:
    from outbox.app.console.config import ConsoleConfig

PAGE_SIZE = 50
#: The largest sequence number a page may start after (the column is a 64-bit integer).
MAX_SEQUENCE = 2**63 - 1
LIVE_COLUMNS = (
    "sequence_number", "message_id", "session_id", "subject", "state", "delivery_count",
    "enqueued_at", "not_before", "locked_at", "locked_until",
)  # fmt: skip
SESSION_COLUMNS = (
    "session_id", "messages", "paused", "state", "head_message_id", "head_sequence_number",
    "head_state", "head_delivery_count",
)  # fmt: skip


def _session_cell(s: LiveSession, column: str) -> object:
    if column.startswith("head_"):
        return getattr(s.head, column.removeprefix("head_"))
    return getattr(s, column)


def register(app: Flask, config: ConsoleConfig) -> None:
    live_reads = config.queue.live

    @app.get("/live")
    def live() -> str | Response:
        queue = _queue_arg()
        state = request.args.get("state") or None
        if state is not None and state not in STATES:
            abort(400, f"state is one of {', '.join(STATES)}")
        after = _sequence_arg("after")
        if (fmt := listing.export_format()) is not None:
            every = listing.pages_of(
                lambda a: live_reads.page(queue, state, after=a, limit=1000),
                lambda m: m.sequence_number,
            )
            return listing.export(f"{queue}-{state or 'all'}", fmt, LIVE_COLUMNS, every)
        rows = live_reads.page(queue, state, after=after, limit=PAGE_SIZE)
        return render_template(
            "live.html", page="live", queue=queue, state=state, states=STATES,
            counts=live_reads.counts(queue), rows=rows, first_page=after is None,
            next_after=rows[-1].sequence_number if len(rows) == PAGE_SIZE else None,
        )  # fmt: skip

    @app.get("/live/message")
    def live_message() -> str | tuple[str, int]:
        queue = _queue_arg()
        seq = _sequence_arg("seq")
        if seq is None:
            abort(400, "seq names the message (its sequence number)")
        m = live_reads.message(queue, seq)
        if m is None:
            return render_template(
                "error.html",
                title=f"No message {seq} waits in {queue}",
                detail="It may have been completed, dead-lettered or purged since the list was "
                "shown.",
                hint=None,
            ), 404
        return render_template(
            "live_message.html", page="live", m=m, body=reads.show_body(m.body),
            headers=reads.pretty(live_reads.headers(queue, seq)),
        )  # fmt: skip

    @app.get("/live/sessions")
    def live_sessions() -> str | Response:
        queue = _queue_arg()
        after = request.args.get("after") or None
        if after is not None and len(after) > validation.MAX_ID:
            abort(400, f"a session id is at most {validation.MAX_ID} characters")
        if (fmt := listing.export_format()) is not None:
            every = listing.pages_of(
                lambda a: live_reads.sessions(queue, after=a, limit=1000), lambda s: s.session_id
            )
            return listing.export(f"{queue}-sessions", fmt, SESSION_COLUMNS, every, _session_cell)
        found = live_reads.sessions(queue, after=after, limit=PAGE_SIZE)
        return render_template(
            "live_sessions.html", page="live", queue=queue, sessions=found,
            first_page=after is None,
            next_after=found[-1].session_id if len(found) == PAGE_SIZE else None,
        )  # fmt: skip


def _queue_arg() -> str:
    try:
        return validation.queue_name(request.args.get("queue", ""))
    except ValidationError as e:
        abort(400, str(e))


def _sequence_arg(name: str) -> int | None:
    value = request.args.get(name)
    if value is None or value == "":
        return None
    if not value.isdigit() or not 0 <= int(value) <= MAX_SEQUENCE:
        abort(400, f"{name} is a sequence number (a whole number from 0 to 2^63 - 1)")
    return int(value)
