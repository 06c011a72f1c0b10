"""The console's paused ordering keys (``/keys``, issue 46 item 4): each key a failed send paused,
with the message it waits for (its gate), since when, why and how many documents wait behind
it; and, behind a confirmation and the token, what ``outbox keys resume`` does: give up on the
gate (the next held document goes next, in order) or open the key (every held document goes on
its next retry, in no set order). Why here and not only in the CLI: a gate whose command was
dead-lettered holds its key until someone acts, and the operator triaging dead letters is on
this console (docs/dispatcher.md, "Order per ordering key")."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from flask import Flask, abort, flash, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from outbox.app.console import access, listing
from outbox.app.console import security as sec
from outbox.app.keys import paused_keys
from outbox.app.operators import Audit
from outbox.core.clock import utc

if TYPE_CHECKING:
    from outbox.app.console.config import ConsoleConfig

log = logging.getLogger("outbox.console")

#: Keys shown, the longest paused first (``outbox keys list --limit`` shows more).
KEYS_LISTED = 200
#: The two ways to resume a key, as the buttons say them.
RESUMES = {"skip": "Skip the gate", "open": "Open the key"}
KEY_COLUMNS = (
    "destination", "ordering_key", "waits_for_message", "document_id", "seq", "since",
    "age_seconds", "held", "reason",
)  # fmt: skip
#: The longest destination, key or message id a form may name (the queue's own limits are lower).
MAX_FIELD = 1024


def register(app: Flask, config: ConsoleConfig, sessions: sec.Sessions, audit: Audit) -> None:
    queue = config.queue

    @app.get("/keys")
    def keys() -> str | Response:
        now = utc(config.clock.now())
        if (fmt := listing.export_format()) is not None:
            return listing.export("paused-keys", fmt, KEY_COLUMNS, paused_keys(queue, now))
        return render_template(
            "keys.html", page="keys", keys=paused_keys(queue, now, KEYS_LISTED),
            listed=KEYS_LISTED, resumes=RESUMES,
        )  # fmt: skip

    @app.post("/keys/confirm")
    def keys_confirm() -> str | tuple[str, int]:
        if refused := access.refusal(config, sessions):
            return refused
        how, destination, key, gate = _form()
        now = utc(config.clock.now())
        shown = [
            k
            for k in paused_keys(queue, now)
            if (k.destination, k.ordering_key) == (destination, key)
        ]
        return render_template(
            "keys_confirm.html", page="keys", how=how, label=RESUMES[how],
            destination=destination, key=key, gate=gate, paused=shown[0] if shown else None,
        )  # fmt: skip

    @app.post("/keys/apply")
    def keys_apply() -> Response | tuple[str, int]:
        if refused := access.refusal(config, sessions):
            return refused
        from dispatcher.keys import KeyOrder
        from dispatcher.queue.key_lines import SqlKeyLines

        how, destination, key, gate = _form()
        done = KeyOrder(SqlKeyLines(queue.database)).resume(
            (destination, key), gate if how == "skip" else None
        )
        log.info("console: %s %s/%s (gate %s): %s", how, destination, key, gate, done)
        audit.record(
            access.actor(sessions), f"keys.{how}",
            f"{destination}/{key}" + (f", gate {gate}" if how == "skip" else ""),
            ("skipped the gate" if how == "skip" else "opened") if done else "nothing to do",
        )  # fmt: skip
        if not done:
            flash(
                f"{destination}/{key}: nothing to do (it is not paused"
                + (f", or its gate is no longer {gate})" if how == "skip" else ")")
            )
        elif how == "skip":
            flash(f"{destination}/{key}: gave up on {gate}; the next held document goes next.")
        else:
            flash(f"{destination}/{key}: opened.")
        return redirect(url_for("keys"))


def _form() -> tuple[str, str, str, str]:
    """(how, destination, key, gate) from a posted form; 400 when one is missing or absurd."""
    form = request.form
    how = form.get("how", "")
    if how not in RESUMES:
        abort(400, "say how to resume the key: skip its gate or open it")
    values = [form.get(name, "") for name in ("destination", "key", "gate")]
    if not values[0] or not values[1] or (how == "skip" and not values[2]):
        abort(400, "the form names no key (or, to skip, no gate message)")
    if any(len(v) > MAX_FIELD for v in values):
        abort(400, f"a destination, key or message id is at most {MAX_FIELD} characters")
    return how, values[0], values[1], values[2]
