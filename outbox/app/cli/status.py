"""``outbox status``: the operator's view of a workspace, and a health check by exit code."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from outbox.app.cli import exit_codes
from outbox.app.cli.output import echo_err, emit_json, print_kv, print_table
from outbox.app.cli.replay import print_replays
from outbox.app.cli.support import DURATION_OR_ZERO, CliContext, json_option, pass_cli
from outbox.core.durations import format_duration

if TYPE_CHECKING:  # the report's module reads Delta and SQL: import it when the command runs
    from outbox.app.keys import PausedKey
    from outbox.app.status import StatusReport


@click.command()
@click.option(
    "--fail-if-pending-older-than",
    "max_pending_age",
    type=DURATION_OR_ZERO,
    help=f"Exit {exit_codes.PENDING_TOO_OLD} when the oldest pending message is older (e.g. 5m).",
)
@click.option(
    "--fail-if-dead-letters",
    is_flag=True,
    help=f"Exit {exit_codes.DEAD_LETTERS} when any queue holds dead letters.",
)
@json_option
@pass_cli
def status(
    cli: CliContext, max_pending_age: float | None, fail_if_dead_letters: bool, as_json: bool
) -> None:
    """Pending documents and messages, the oldest pending age, each rescuer's checkpoint and lag,
    queue depths and the oldest dead letter. Read-only.

    Exit codes for health checks: 0 healthy, 1 cannot read the workspace (the error says why),
    3 a pending message is older than --fail-if-pending-older-than, 4 dead letters exist and
    --fail-if-dead-letters was given."""
    from outbox.app.status import collect_status
    from outbox.core.clock import SystemClock

    report = collect_status(cli.settings(), SystemClock())
    if as_json:
        emit_json(report.to_dict())
    else:
        _print_status(report)
    for problem in report.problems:
        echo_err(f"error: {problem}")
    for stale in report.stale_rescuers:
        echo_err(
            f"warning: {stale.describe()} (fix: if it is retired, `outbox rescue --name "
            f"{stale.rescuer_name} --forget --yes`; else start its scheduled job again)"
        )
    age = report.oldest_pending_age_seconds
    if max_pending_age is not None and age is not None and age > max_pending_age:
        echo_err(
            f"unhealthy: the oldest pending message ({report.oldest_pending_document}) is "
            f"{format_duration(age)} old, over {format_duration(max_pending_age)}"
        )
        raise SystemExit(exit_codes.PENDING_TOO_OLD)
    if fail_if_dead_letters and any(q.dead_lettered for q in report.queues):
        echo_err("unhealthy: dead letters are waiting (see `outbox dead-letters list`)")
        raise SystemExit(exit_codes.DEAD_LETTERS)
    if report.problems:
        raise SystemExit(exit_codes.ERROR)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else format_duration(seconds)


def _setting(name: str, seconds: float | None) -> str:
    if seconds is None:
        return name
    return f"{name} = {format_duration(seconds) if seconds else 'keep'}"


def _print_status(report: StatusReport) -> None:
    # A part that could not be read is never shown as empty: "(empty)" or "(no rescue pass yet)"
    # would read as all clear at 3 a.m. while the database is down.
    unread = [p.split(":", 1)[0] for p in report.problems]
    cannot = "(could not read: see the error below)"
    print_kv(
        "outbox status",
        [
            *([("not read", ", ".join(unread))] if unread else []),
            ("table", f"{report.table_uri} (version {report.table_version})"),
            ("database", report.sql_url),
            ("pending documents", report.pending_documents),
            ("pending messages", report.pending_messages),
            (
                "oldest pending",
                f"{_age(report.oldest_pending_age_seconds)} ({report.oldest_pending_document})"
                if report.oldest_pending_document
                else "-",
            ),
            (
                "delta log",
                f"{report.log_files} files from version {report.oldest_log_version}"
                if report.log_files is not None
                else "-",
            ),
        ],
    )
    print_table(
        "rescuer checkpoints",
        ["rescuer", "version", "lag (versions)", "lag", "last pass", "mode"],
        [
            (
                c.rescuer,
                "-" if c.version is None else c.version,
                c.lag_versions,
                _age(c.lag_seconds),
                f"{_age(c.last_pass_age_seconds)} ago" if c.last_pass_at else "never",
                c.last_mode or "-",
            )
            for c in report.checkpoints
        ]
        or [
            (
                cannot if "rescuer checkpoints" in unread else "(no rescue pass yet)",
                "",
                "",
                "",
                "",
                "",
            )
        ],
    )
    print_table(
        "queues",
        ["queue", "active", "scheduled", "locked", "deferred", "dead-lettered"],
        [
            (q.queue, q.active, q.scheduled, q.locked, q.deferred, q.dead_lettered)
            for q in report.queues
        ]
        or [(cannot if "queues" in unread else "(empty)", "", "", "", "", "")],
    )
    if report.unread_queues:
        print_table(
            "queues nobody receives from (a misspelt destination, or no consumer running; "
            "the destinations setting stops typos at send)",
            ["queue", "active", "oldest, never received"],
            [(u.queue, u.active, _age(u.oldest_age_seconds)) for u in report.unread_queues],
        )
    if report.dead_lettered_documents:
        print_table(
            f"{report.dead_lettered_documents} pending document(s) whose command is dead-lettered "
            "(nothing re-drives them: `outbox dead-letters requeue --where session_id=<id>`)",
            ["document", "last_seq", "dispatched_seq", "dead letter", "reason", "since"],
            [
                (
                    c.document_id,
                    c.last_seq,
                    c.dispatched_seq,
                    c.dead_letter_id,
                    c.reason,
                    c.dead_lettered_at.isoformat(),
                )
                for c in report.dead_lettered_commands
            ],
        )
    if report.paused_key_count:
        print_paused_keys(
            f"{report.paused_key_count} paused ordering key(s): their later messages wait "
            "(`outbox keys list`, `outbox keys resume`)",
            report.paused_keys,
        )
    if report.replays:
        print_replays(report.replays, "replays (`outbox replay --status`)")
    if report.retention:
        print_table(
            "retention (what is kept: docs/operations.md, Retention)",
            ["kept", "setting", "rows", "oldest"],
            [
                (
                    r["item"],
                    _setting(r["setting"], r["setting_s"]),
                    "-" if r["rows"] is None else r["rows"],
                    _age(r["oldest_age_s"]),
                )
                for r in report.retention
            ],
        )
    d = report.oldest_dead_letter
    if d is not None:
        print_kv(
            "oldest dead letter",
            [
                ("id", d.id),
                ("queue", d.queue),
                ("message id", d.message_id),
                ("reason", d.reason),
                ("description", d.description),
                ("age", _age(d.age_seconds)),
            ],
        )


def print_paused_keys(title: str, keys: list[PausedKey]) -> None:
    print_table(
        title,
        ["destination", "key", "waits for", "document", "seq", "paused for", "held", "why"],
        [
            (
                k.destination,
                k.ordering_key,
                k.waits_for_message,
                k.document_id,
                k.seq,
                _age(k.age_seconds),
                k.held,
                k.reason[:80],
            )
            for k in keys
        ],
    )


def register(group: click.Group) -> None:
    group.add_command(status)
