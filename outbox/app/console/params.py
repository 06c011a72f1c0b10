"""What the console's pages read from a request (ids, actions, times, a dead-letter filter) and
how they write times: a request's mistake is its own 400, never a database error."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, NoReturn

from flask import abort

from dispatcher.queue.browse import DeadLetterFilter
from outbox.core.clock import Clock, utc
from outbox.core.durations import format_duration

ACTIONS = {"requeue": "Requeue", "purge": "Purge"}
#: The largest id a dead letter can have (a 64-bit key): a larger one names none, and reaching
#: the database with it would overflow the driver.
MAX_ID = 2**63 - 1


# --- request parsing ---------------------------------------------------------------------------


def dead_letter_id(value: str | None, name: str) -> int | None:
    """A dead letter id from a query or a form (None: not given). Anything but a whole number
    from 1 to ``MAX_ID`` is the request's mistake (400), never a database error."""
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:  # also a number of more than 4,300 digits
        bad_id(name, value)
    if not 1 <= number <= MAX_ID:
        bad_id(name, value)
    return number


def bad_id(name: str, value: str) -> NoReturn:
    shown = value if len(value) <= 40 else value[:40] + "…"
    abort(400, f"{name}: {shown!r} is not a dead letter id (a whole number from 1 to {MAX_ID})")


def dead_letter_ids(form: Any) -> list[int]:
    return sorted({i for raw in form.getlist("id") if (i := dead_letter_id(raw, "id")) is not None})


def action(form: Any) -> str:
    action = form.get("action", "")
    if action not in ACTIONS:
        abort(400, f"unknown action {action!r}")
    return str(action)


def utc_time(value: str | None, name: str, problems: list[str]) -> datetime | None:
    """A time from a datetime-local field (``YYYY-MM-DDTHH:MM``), read as UTC; one with an
    offset (typed into the address) is converted to UTC, not read as if it were UTC."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        problems.append(f"{name}: {value!r} is not a time (use YYYY-MM-DD HH:MM, UTC)")
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def utc_field(value: str) -> str:
    """A time as the form's UTC field shows it (a time with an offset, converted), so the field
    and the next page's link say what the list shows. Anything unreadable is left as given."""
    when = utc_time(value, "", [])
    if when is None:
        return value
    spec = "minutes" if when.second == when.microsecond == 0 else "seconds"
    return when.replace(tzinfo=None).isoformat(timespec=spec)


def selection(args: Any) -> tuple[DeadLetterFilter, list[str]]:
    problems: list[str] = []
    selection = DeadLetterFilter(
        queue=args.get("queue") or None,
        reason=args.get("reason") or None,
        session_id=args.get("session") or None,
        since=utc_time(args.get("since"), "since", problems),
        until=utc_time(args.get("until"), "until", problems),
    )
    return selection, problems


def filter_args(args: Any) -> dict[str, str]:
    out = {k: args[k] for k in ("queue", "reason", "session", "since", "until") if args.get(k)}
    for k in ("since", "until"):
        if k in out:
            out[k] = utc_field(out[k])
    return out


# --- formatting --------------------------------------------------------------------------------


def at(when: datetime | None) -> str:
    return "-" if when is None else utc(when).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(when: datetime | None, clock: Clock) -> str:
    if when is None:
        return "-"
    seconds = (utc(clock.now()) - utc(when)).total_seconds()
    if seconds < 0:
        return f"in {format_duration(-seconds)}"
    return f"{format_duration(seconds)} ago"


#: The fastest rate a paced requeue may ask for (dead letters a second).
MAX_RATE = 100_000


def requeue_options(form: Any) -> tuple[str | None, float | None]:
    """(into which queue, at what rate) from a requeue's form: each optional, 400 when bad."""
    from dispatcher.queue import validation
    from outbox.core.errors import ValidationError

    to_queue = (form.get("to_queue") or "").strip() or None
    if to_queue is not None:
        try:
            validation.queue_name(to_queue)
        except ValidationError as e:
            abort(400, str(e))
    raw = (form.get("rate") or "").strip()
    if not raw:
        return to_queue, None
    try:
        rate = float(raw)
    except ValueError:
        abort(400, f"rate is a number of dead letters a second, got {raw!r}")
    if not 0 < rate <= MAX_RATE:
        abort(400, f"rate is above 0 and at most {MAX_RATE:,} a second")
    return to_queue, rate
