"""``outbox console``: the operator's pages (overview, dead letters, devices) as a Flask app.

Why Flask: it is the best-kept small WSGI framework (Pallets), synchronous like every store here,
with Jinja2's autoescaping for pages that show message bodies, and Werkzeug's threaded server
for one operator's browser; it is already what the S3 test server runs on. The pages are HTML
rendered on the server with one style sheet from the package: no CDN, no build step, no script.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from flask import (
    Flask,
    abort,
    render_template,
    request,
    send_from_directory,
    session,
)
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response

from dispatcher.mqtt.devices import device_page, presence_counts
from outbox.app import history as H
from outbox.app.console import (
    access,
    actions,
    kafka_page,
    keys_page,
    listing,
    live_page,
    params,
    reads,
    trace_page,
)
from outbox.app.console import security as sec
from outbox.app.console.chart import line_chart
from outbox.app.console.config import ConsoleConfig
from outbox.app.console.jobs import Jobs
from outbox.app.console.params import ACTIONS, MAX_ID
from outbox.app.operators import Audit, Operators
from outbox.core.clock import utc
from outbox.core.durations import format_duration
from outbox.core.errors import MessageNotFoundError, OutboxError

log = logging.getLogger("outbox.console")

PAGE_SIZE = 50
#: Ticked dead letters a selection spanning pages may carry (more: "all matching" does it).
MAX_TICKED = 10_000
STATIC = Path(__file__).parent / "static"
#: What an export of the dead letters holds (no body: the list never reads them).
DEAD_LETTER_COLUMNS = (
    "id", "queue", "message_id", "session_id", "subject", "correlation_id", "reason",
    "description", "delivery_count", "enqueued_at", "dead_lettered_at",
)  # fmt: skip


def create_app(config: ConsoleConfig) -> Flask:
    app = Flask("outbox.app.console")
    app.config.update(
        SECRET_KEY=config.secret_key or sec.new_token().encode(),
        SESSION_COOKIE_NAME=sec.cookie_name(config.port),
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        MAX_CONTENT_LENGTH=1024 * 1024,
    )
    sessions = sec.Sessions(config.clock)
    loopback_only = sec.is_loopback(config.host)
    app.jinja_env.filters["at"] = params.at
    app.jinja_env.filters["ago"] = lambda when: params.ago(when, config.clock)
    app.jinja_env.filters["duration"] = lambda s: "-" if s is None else format_duration(s)
    app.jinja_env.filters["count"] = lambda n: f"{int(n):,}"

    @app.before_request
    def only_trusted_hosts() -> Response | None:
        if sec.host_allowed(request.host, loopback_only=loopback_only):
            return None
        # plain text: a page would show the workspace to the page that asked
        return Response("This console answers only to loopback names.\n", 400,
                        mimetype="text/plain")  # fmt: skip

    @app.context_processor
    def common() -> dict[str, Any]:
        if sec.CSRF not in session:
            session[sec.CSRF] = sec.new_token()
        return {
            "read_only": config.read_only,
            "unlocked": (unlocked := sessions.find(session.get(sec.SESSION_ID))) is not None,
            "who": "" if unlocked is None else f"{unlocked.actor} ({unlocked.role})",
            "csrf": session[sec.CSRF],
            "table_uri": config.table_uri,
            "sql_url": config.sql_url,
            "can_trace": config.trace is not None,
            "kafka_topics": config.kafka_topics,
            "refresh": listing.refresh_seconds(),
            "refresh_links": listing.refresh_links(),
            "export_links": listing.export_links(),
        }

    @app.after_request
    def headers(response: Response) -> Response:
        response.headers.update(sec.HEADERS)
        return response

    @app.errorhandler(OutboxError)
    def outbox_error(e: OutboxError) -> tuple[str, int]:
        log.warning("console: %s", e)
        hint = getattr(e, "hint", None)
        return render_template("error.html", title="The queue database failed",
                               detail=str(e), hint=hint), 503  # fmt: skip

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> tuple[str, int]:
        """A bad request or an unknown page as a page of the console (not Werkzeug's bare one)."""
        return render_template("error.html", title=e.name, detail=e.description,
                               hint=None), e.code or 500  # fmt: skip

    @app.get("/favicon.ico")
    def favicon() -> Response:
        """Where a browser looks for an icon when a page names none (Werkzeug's own error
        pages): the same icon as the pages link."""
        return send_from_directory(STATIC, "favicon.svg", mimetype="image/svg+xml")

    _pages(app, config)
    trace_page.register(app, config)
    live_page.register(app, config)
    operators = Operators(config.queue.database, config.clock)
    audit = Audit(config.queue.database, config.clock)
    access.register(app, config, sessions, operators, audit)
    keys_page.register(app, config, sessions, audit)
    jobs = Jobs(config.clock)
    app.extensions["outbox_jobs"] = jobs  # the tests wait for a job's thread through it
    actions.register(app, config, sessions, audit, jobs)
    kafka_page.register(app, config, sessions, audit)
    return app


def _pages(app: Flask, config: ConsoleConfig) -> None:
    """What the console shows: nothing here changes anything."""
    queue, history = config.queue, config.history

    @app.get("/")
    def overview() -> str:
        now = utc(config.clock.now())
        data = reads.overview(
            queue, history, now=now, range_name=request.args.get("range", reads.DEFAULT_RANGE)
        )
        return render_template("overview.html", o=data, ranges=list(reads.RANGES), page="overview")

    @app.get("/dead-letters")
    def dead_letters() -> str | Response:
        selection, problems = params.selection(request.args)
        if (fmt := listing.export_format()) is not None:
            if problems:
                abort(400, "; ".join(problems))
            every = listing.pages_of(
                lambda before: queue.browse.page(selection, before_id=before, limit=1000),
                lambda d: d.id,
            )
            return listing.export("dead-letters", fmt, DEAD_LETTER_COLUMNS, every)
        return listed(request.args, selection, problems, ticked=[])

    @app.post("/dead-letters/turn")
    def dead_letters_turn() -> str | tuple[str, int]:
        """Another page of the list, keeping what was ticked (a selection spanning pages): the
        selection form posts here, its ticked ids carried to the next page as hidden fields."""
        if not sec.from_this_console(session, request.form):
            return access.refuse(sec.FOREIGN_FORM)
        selection, problems = params.selection(request.form)
        ticked = params.dead_letter_ids(request.form)
        if len(ticked) > MAX_TICKED:
            abort(400, f"at most {MAX_TICKED:,} ticked at once: use 'all matching' instead")
        return listed(request.form, selection, problems, ticked=ticked)

    def listed(source: Any, selection: Any, problems: list[str], *, ticked: list[int]) -> str:
        before = params.dead_letter_id(source.get("before") or None, "before")
        rows = [] if problems else queue.browse.page(selection, before_id=before, limit=PAGE_SIZE)
        total = 0 if problems else queue.browse.count(selection)
        more = len(rows) == PAGE_SIZE and not problems
        shown = {d.id for d in rows}
        return render_template(
            "dead_letters.html",
            page="dead-letters",
            rows=rows,
            total=total,
            problems=problems,
            filters=params.filter_args(source),
            queues=queue.browse.queues(),
            reasons=queue.browse.reasons(selection.queue),
            next_before=rows[-1].id if more else None,
            first_page=before is None,
            actions=ACTIONS,
            ticked=set(ticked),
            carried=[i for i in dict.fromkeys(ticked) if i not in shown],
        )

    @app.get("/dead-letters/summary")
    def dead_letters_summary() -> str:
        """Counts per queue and reason now, and each queue's count over time (the samples)."""
        counts = queue.browse.counts()
        queues = sorted({q for q, _ in counts})
        reasons = sorted({r for _, r in counts})
        now = utc(config.clock.now())
        range_name = request.args.get("range", reads.DEFAULT_RANGE)
        span = reads.RANGES.get(range_name, reads.RANGES[reads.DEFAULT_RANGE])
        series = history.series(H.DEAD_LETTERS, since=now - span, until=now)
        chart = line_chart(series, start=now - span, end=now, label=lambda v: f"{v:,.0f}")
        return render_template(
            "dead_letters_summary.html", page="dead-letters", counts=counts, queues=queues,
            reasons=reasons, total=sum(counts.values()),
            per_queue={q: sum(n for (qq, _), n in counts.items() if qq == q) for q in queues},
            per_reason={r: sum(n for (_, rr), n in counts.items() if rr == r) for r in reasons},
            chart=chart if series else None, ranges=list(reads.RANGES),
            range_name=range_name if range_name in reads.RANGES else reads.DEFAULT_RANGE,
        )  # fmt: skip

    @app.get("/dead-letters/<int:dead_letter_id>")
    def dead_letter(dead_letter_id: int) -> str | tuple[str, int]:
        d = None
        if 1 <= dead_letter_id <= MAX_ID:  # any other id is not there (nor asked of the database)
            with contextlib.suppress(MessageNotFoundError):
                d = queue.admin.get_dead_letter(dead_letter_id)
        if d is None:
            return render_template(
                "error.html",
                title=f"No dead letter has id {dead_letter_id}",
                detail="It may have been requeued or purged since the list was shown.",
                hint=None,
            ), 404
        return render_template(
            "dead_letter.html",
            page="dead-letters",
            d=d,
            body=reads.show_body(d.body),
            headers=reads.pretty(d.headers),
            actions=ACTIONS,
        )

    @app.get("/devices")
    def devices() -> str:
        counts = presence_counts(queue)
        name = request.args.get("queue") or config.devices_queue
        presence = request.args.get("presence") or None
        if presence not in (None, "online", "offline"):
            presence = None
        found = device_page(
            queue, name, after=request.args.get("after") or None, limit=PAGE_SIZE,
            presence=presence,
        )  # fmt: skip
        return render_template(
            "devices.html",
            page="devices",
            queue_name=name,
            queues=sorted({*counts, name}),
            presence=presence,
            counts=counts.get(name, {}),
            found=found,
            first_page=not request.args.get("after"),
        )
