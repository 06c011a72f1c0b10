"""What every list page of the console offers besides its rows (issue 46, item 6): refreshing
itself when asked, with no script (``?refresh=SECONDS`` puts a ``<meta http-equiv="refresh">``
in the page, as Hangfire's and RabbitMQ's dashboards poll), and an export of the whole list it
shows, not only the page (``?format=csv`` or ``?format=json``), streamed in pages so 100,000
rows never sit in memory at once.

Why a meta refresh: the pages forbid scripts outright (``security.CSP``), and a refresh the
browser does itself needs none; it is off unless the operator picks an interval."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from flask import Response, abort, request, stream_with_context, url_for

#: The intervals offered (seconds); any value from the smallest to an hour is accepted.
REFRESH_CHOICES = (10, 30, 60)
REFRESH_MIN, REFRESH_MAX = 5, 3600
FORMATS = ("csv", "json")
#: At most this many rows in one export (a larger list: narrow it with the page's filters).
EXPORT_MAX = 100_000


def refresh_seconds() -> int | None:
    """The page's refresh interval, or None (off; a value out of bounds is ignored)."""
    value = request.args.get("refresh", "")
    if not value.isdigit():
        return None
    seconds = int(value)
    return seconds if REFRESH_MIN <= seconds <= REFRESH_MAX else None


def refresh_links() -> list[tuple[str, str, bool]]:
    """(label, url, current) for each choice and "off", keeping the page's other arguments."""
    if request.endpoint is None or request.method != "GET":
        return []
    args: dict[str, Any] = {
        **(request.view_args or {}),
        **{k: v for k, v in request.args.items() if k not in ("refresh", "format")},
    }
    now = refresh_seconds()
    out = [("off", url_for(request.endpoint, **args), now is None)]
    for s in REFRESH_CHOICES:
        out.append((f"{s}s", url_for(request.endpoint, **args, refresh=s), now == s))
    return out


def export_format() -> str | None:
    value = request.args.get("format")
    if value is None or value == "":
        return None
    if value not in FORMATS:
        abort(400, f"format is one of {', '.join(FORMATS)}")
    return value


def export_links() -> list[tuple[str, str]]:
    """(label, url) of the page's list as CSV and JSON (its filters kept, no paging)."""
    if request.endpoint is None:
        return []
    skip = ("refresh", "format", "before", "after")
    args: dict[str, Any] = {
        **(request.view_args or {}),
        **{k: v for k, v in request.args.items() if k not in skip},
    }
    return [(f.upper(), url_for(request.endpoint, **args, format=f)) for f in FORMATS]


def _text(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def pages_of(read: Callable[[Any], Sequence[Any]], cursor: Callable[[Any], Any]) -> Iterator[Any]:
    """Every row ``read(after)`` gives, page after page (``cursor(row)``: the next ``after``),
    at most ``EXPORT_MAX``."""
    after: Any = None
    sent = 0
    while sent < EXPORT_MAX:
        rows = read(after)
        if not rows:
            return
        yield from rows[: EXPORT_MAX - sent]
        sent += len(rows)
        after = cursor(rows[-1])


def export(
    name: str, fmt: str, columns: Sequence[str], rows: Iterable[Any],
    value: Callable[[Any, str], Any] = getattr,
) -> Response:  # fmt: skip
    """``rows`` as a CSV file (a header row, then one line each) or a JSON array of objects with
    ``columns`` as keys; ``value(row, column)`` reads a cell (an attribute by default)."""

    def as_csv() -> Iterator[str]:
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_text(value(row, c)) for c in columns])
            if buffer.tell() > 64 * 1024:
                yield buffer.getvalue()
                buffer.seek(0)
                buffer.truncate()
        yield buffer.getvalue()

    def as_json() -> Iterator[str]:
        yield "["
        first = True
        for row in rows:
            item = json.dumps({c: _text(value(row, c)) for c in columns}, ensure_ascii=False)
            yield ("\n" if first else ",\n") + item
            first = False
        yield "\n]\n"

    body = as_csv() if fmt == "csv" else as_json()
    mimetype = "text/csv" if fmt == "csv" else "application/json"
    response = Response(stream_with_context(body), mimetype=mimetype)
    response.headers["Content-Disposition"] = f'attachment; filename="{name}.{fmt}"'
    return response
