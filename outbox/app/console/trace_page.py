"""The console's trace page (``/trace``): ``outbox trace``'s answer (``outbox.app.trace``) for a
document, message or correlation id typed in. Read-only; it reads the Delta table, which nothing
else of the console needs, through the function the CLI binds to the workspace's settings."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from flask import Flask, abort, render_template, request

from outbox.core.errors import (
    DocumentNotFoundError,
    HistoryGoneError,
    OutboxError,
    ValidationError,
)

if TYPE_CHECKING:
    from outbox.app.console.config import ConsoleConfig

log = logging.getLogger("outbox.console")

#: The longest id the trace page looks for (a document id's own limit is lower).
MAX_QUERY = 1024


def register(app: Flask, config: ConsoleConfig) -> None:
    @app.get("/trace")
    def trace() -> str | tuple[str, int]:
        """A document's life (``outbox trace``'s answer): found by a document, message or
        correlation id typed in, or linked from elsewhere."""
        if config.trace is None:
            abort(404)
        query = (request.args.get("q") or "").strip()
        page = {"page": "trace", "query": query, "max_query": MAX_QUERY}
        if not query:
            return render_template("trace.html", result=None, problem=None, **page)
        if len(query) > MAX_QUERY:
            return render_template("trace.html", result=None, problem=(
                f"an id is at most {MAX_QUERY} characters"), hint=None, **page), 400  # fmt: skip
        try:
            result = config.trace(query)
        except OutboxError as e:  # not found, a bad id, history gone; or the table failed
            status = (
                404 if isinstance(e, DocumentNotFoundError)
                else 400 if isinstance(e, ValidationError | HistoryGoneError)
                else 503
            )  # fmt: skip
            if status == 503:
                log.warning("console: trace of %r failed: %s", query, e)
            return render_template("trace.html", result=None, problem=str(e),
                                   hint=getattr(e, "hint", None), **page), status  # fmt: skip
        return render_template("trace.html", result=result, problem=None, **page)
