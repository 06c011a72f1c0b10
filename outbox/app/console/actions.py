"""The dead letters' actions: requeue and purge, each behind a confirmation page and the token
(``security.check_action``), recorded in the audit trail; a requeue may go into another queue
and be held to a rate, in the background (``jobs``), its progress on a page of its own."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from flask import Flask, abort, flash, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from outbox.app.console import access, params
from outbox.app.console import security as sec
from outbox.app.console.jobs import Job, Jobs
from outbox.app.console.params import ACTIONS
from outbox.app.operators import Audit, ids_target
from outbox.core.pacing import Pacer

if TYPE_CHECKING:
    from outbox.app.console.config import ConsoleConfig

log = logging.getLogger("outbox.console")

#: Ticked ids per call when acting on them (a bounded IN list; the queue moves them in chunks).
ACTION_CHUNK = 500


@dataclass
class _Plan:
    """What an apply will do: how many, the work itself, and what the audit trail names."""

    total: int
    work: Callable[[Callable[[int], None]], int]
    target: str


def register(
    app: Flask, config: ConsoleConfig, sessions: sec.Sessions, audit: Audit, jobs: Jobs
) -> None:
    queue = config.queue

    @app.post("/dead-letters/confirm")
    def confirm() -> str | tuple[str, int]:
        if refused := access.refusal(config, sessions):
            return refused
        action = params.action(request.form)
        ids: list[int] = []
        up_to = None
        if request.form.get("scope") == "matching":
            selection, problems = params.selection(request.form)
            if problems:
                abort(400, "; ".join(problems))
            up_to = queue.browse.newest_id(selection)
            count = 0 if up_to is None else queue.browse.count(replace(selection, up_to_id=up_to))
        else:
            ids = queue.browse.existing(params.dead_letter_ids(request.form))
            count = len(ids)
        return render_template(
            "confirm.html",
            page="dead-letters",
            action=action,
            label=ACTIONS[action],
            count=count,
            ids=ids,
            shown=[queue.admin.get_dead_letter(i) for i in ids[:20]],
            filters=params.filter_args(request.form),
            up_to=up_to,
        )

    @app.post("/dead-letters/apply")
    def apply() -> Response | tuple[str, int]:
        if refused := access.refusal(config, sessions):
            return refused
        action = params.action(request.form)
        to_queue, rate = (None, None)
        if action == "requeue":
            to_queue, rate = params.requeue_options(request.form)
        pacer = Pacer(rate, config.clock) if rate else None
        extra: dict[str, Any] = {} if action != "requeue" else {"to_queue": to_queue}
        if pacer is not None:
            extra["chunk"] = pacer.chunk()
        plan = _plan(queue, action, extra)
        target = plan.target + (f" into {to_queue}" if to_queue else "")
        target += f" at {rate:g}/s" if rate else ""
        verb = "requeued" if action == "requeue" else "purged"
        who = access.actor(sessions)
        if pacer is not None:  # in the background, its progress on the job's page
            job = jobs.start(
                f"requeue {plan.total:,} dead letters" + (f" into {to_queue}" if to_queue else ""),
                actor=who, total=plan.total, rate=rate,
                work=lambda progress: plan.work(_paced(progress, pacer)),
                finished=lambda j: audit.record(j.actor, "dead-letters.requeue", target,
                                                _outcome(j, verb)),
            )  # fmt: skip
            return redirect(url_for("job", job_id=job.id))
        done = plan.work(lambda _n: None)
        log.info("console: %s %d dead letters", verb, done)
        audit.record(who, f"dead-letters.{action}", target, f"{done:,} {verb}")
        flash(f"{done:,} dead letter{'s' if done != 1 else ''} {verb}.")
        filters: dict[str, Any] = params.filter_args(request.form)
        return redirect(url_for("dead_letters", **filters))

    @app.get("/jobs")
    def jobs_page() -> str:
        return render_template("jobs.html", page="jobs", jobs=jobs.all())

    @app.get("/jobs/<int:job_id>")
    def job(job_id: int) -> str | tuple[str, int]:
        found = jobs.get(job_id)
        if found is None:
            return render_template("error.html", title=f"No job {job_id}", detail=(
                "This console has no such job (a restart forgets them; the audit trail keeps "
                "what each did)."), hint=None), 404  # fmt: skip
        running = found.state == "running"
        return render_template("job.html", page="jobs", job=found,
                               refresh=5 if running else None)  # fmt: skip


def _plan(queue: Any, action: str, extra: dict[str, Any]) -> _Plan:
    """The selected dead letters (ticked ids, or all matching up to the confirmed id) and the
    work that requeues or purges them."""
    admin = queue.admin
    if request.form.get("scope") == "matching":
        selection, problems = params.selection(request.form)
        up_to = params.dead_letter_id(request.form.get("up_to"), "up_to")
        if problems or up_to is None:
            abort(400, "; ".join(problems) or "the selection has no upper id")
        frozen = replace(selection, up_to_id=up_to)
        matching = admin.requeue_matching if action == "requeue" else admin.purge_matching
        named = params.filter_args(request.form)
        target = (
            "every dead letter matching "
            + (" ".join(f"{k}={v}" for k, v in named.items()) or "no filter")
            + f", id up to {up_to}"
        )
        return _Plan(
            int(queue.browse.count(frozen)),
            lambda progress: int(matching(frozen, on_progress=progress, **extra)),
            target,
        )
    run = admin.requeue if action == "requeue" else admin.purge
    ids = params.dead_letter_ids(request.form)

    def work(progress: Callable[[int], None]) -> int:
        done = 0
        for i in range(0, len(ids), ACTION_CHUNK):  # a bounded IN list per statement
            done += run(ids=ids[i : i + ACTION_CHUNK], on_progress=progress, **extra)
        return done

    return _Plan(len(ids), work, ids_target("dead letters", ids))


def _paced(progress: Callable[[int], None], pacer: Pacer) -> Callable[[int], None]:
    def step(n: int) -> None:
        progress(n)
        pacer.step(n)

    return step


def _outcome(job: Job, verb: str) -> str:
    if job.state == "failed":
        return f"failed after {job.done:,} {verb}: {job.error}"
    return f"{job.done:,} {verb}" + (f" at {job.rate:g}/s" if job.rate else "")
