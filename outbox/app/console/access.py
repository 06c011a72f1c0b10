"""Who may act on the console, and what they did: unlocking a browser with the console's own
token or a named operator's (``outbox.app.operators``), locking it, ending the sessions of a
revoked token at their next request, and the audit trail's page.

Why the revocation check is a database read per request of a named session: "revoked" must
take effect at once, in every console that serves the workspace (a console started before the
revocation holds the session in its memory; only the database knows), and the read is one
primary-key lookup."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from flask import Flask, flash, redirect, render_template, request, session, url_for
from werkzeug.wrappers import Response

from outbox.app.console import listing, params
from outbox.app.console import security as sec
from outbox.app.operators import CONSOLE, Audit, Operators

if TYPE_CHECKING:
    from outbox.app.console.config import ConsoleConfig

log = logging.getLogger("outbox.console")

AUDIT_PAGE = 50
AUDIT_COLUMNS = ("id", "at", "actor", "action", "target", "outcome")


def actor(sessions: sec.Sessions) -> str:
    """Who is acting in this request (the caller has checked the action: it is unlocked)."""
    unlocked = sessions.find(session.get(sec.SESSION_ID))
    return CONSOLE if unlocked is None else unlocked.actor


def register(
    app: Flask, config: ConsoleConfig, sessions: sec.Sessions, operators: Operators, audit: Audit
) -> None:
    @app.before_request
    def end_revoked_sessions() -> None:
        unlocked = sessions.find(session.get(sec.SESSION_ID))
        if unlocked is not None and unlocked.named and not operators.is_active(unlocked.actor):
            sessions.close(unlocked.id)
            session.pop(sec.SESSION_ID, None)
            log.warning("console: %s's token was revoked; its session ended", unlocked.actor)

    @app.route("/unlock", methods=["GET", "POST"])
    def unlock() -> Response | str | tuple[str, int]:
        if config.read_only:
            return refuse(sec.READ_ONLY)
        if request.method == "GET" and "token" not in request.args:
            return render_template("unlock.html", page="unlock", wrong=False)
        if request.method == "POST" and not sec.from_this_console(session, request.form):
            return refuse(sec.FOREIGN_FORM)
        given = request.values.get("token")
        if sec.same(given, config.token):
            who, role, named = CONSOLE, "operator", False
        else:
            found = operators.find(given)
            if found is None:
                log.warning("console: a wrong token was given")
                audit.record("?", "unlock", "the console", "refused: no such token")
                return render_template("unlock.html", page="unlock", wrong=True), 403
            who, role, named = found.name, found.role, True
        sessions.close(session.get(sec.SESSION_ID))  # unlocking again replaces it
        session.clear()  # a new session: nothing set before the token carries over
        session[sec.SESSION_ID] = sessions.open(who, role, named=named).id
        session[sec.CSRF] = sec.new_token()
        audit.record(who, "unlock", "the console", f"unlocked ({role})")
        if role == "operator":
            flash(f"Unlocked as {who}: this browser may requeue, purge and resume keys until "
                  "you lock it or the console stops.")  # fmt: skip
        else:
            flash(f"Unlocked as {who} (read-only): this token may not change anything.")
        return redirect(url_for("overview"))  # also drops the token from the address bar

    @app.post("/lock")
    def lock() -> Response:
        if sec.from_this_console(session, request.form):
            unlocked = sessions.find(session.get(sec.SESSION_ID))
            sessions.close(session.pop(sec.SESSION_ID, None))
            if unlocked is not None:
                audit.record(unlocked.actor, "lock", "the console", "locked")
        return redirect(url_for("overview"))

    @app.get("/audit")
    def audit_page() -> str | Response:
        if (fmt := listing.export_format()) is not None:
            every = listing.pages_of(lambda b: audit.page(before=b, limit=1000), lambda e: e.id)
            return listing.export("audit", fmt, AUDIT_COLUMNS, every)
        before = params.dead_letter_id(request.args.get("before"), "before")
        rows = audit.page(before=before, limit=AUDIT_PAGE)
        return render_template(
            "audit.html", page="audit", rows=rows, first_page=before is None,
            next_before=rows[-1].id if len(rows) == AUDIT_PAGE else None,
        )  # fmt: skip


def refusal(config: ConsoleConfig, sessions: sec.Sessions) -> tuple[str, int] | None:
    """The refusal page for this request's posted action (``security.check_action``), or None
    when it may run: every action's first line."""
    refused = sec.check_action(session, request.form, read_only=config.read_only, sessions=sessions)
    return None if refused is None else refuse(refused)


def refuse(r: sec.Refusal) -> tuple[str, int]:
    """The page of a refused action (read-only, a foreign form, locked, a read-only token),
    logged: every page module's refusals go through here."""
    log.warning("console: refused an action: %s", r.title)
    return render_template("error.html", title=r.title, detail=r.detail, hint=None), r.status
