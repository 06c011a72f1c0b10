"""``outbox replay``: re-send the messages committed in a range of the table's history, through
the command queue (``outbox.app.replay``; docs/replay.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from outbox.app.cli.output import echo_err, emit_json, print_kv, print_table, progress
from outbox.app.cli.support import CliContext, json_option, pass_cli

if TYPE_CHECKING:
    from outbox.app.replay_status import ReplayStatus


@click.command()
@click.option(
    "--from", "start", metavar="V|TIME", help="First table version (or time) of the range."
)
@click.option("--to", "end", metavar="V|TIME", help="Last table version (or time) of the range.")
@click.option(
    "--where",
    "predicate",
    metavar="SQL",
    help="Only the documents whose rows match this SQL predicate (e.g. \"type = 'Package'\").",
)
@click.option("--destination", metavar="D", help="Only the messages to this destination.")
@click.option(
    "--new-ids",
    is_flag=True,
    help="Give the replayed messages new ids (the same on every retry) instead of their own.",
)
@click.option(
    "--dry-run", is_flag=True, help="Count the messages per destination and type; send nothing."
)
@click.option(
    "--resume", "resume_id", metavar="ID", help="Finish enqueueing a replay that stopped."
)
@click.option("--status", "show_status", is_flag=True, help="List the replays and their progress.")
@json_option
@pass_cli
def replay(
    cli: CliContext,
    *,
    start: str | None,
    end: str | None,
    predicate: str | None,
    destination: str | None,
    new_ids: bool,
    dry_run: bool,
    resume_id: str | None,
    show_status: bool,
    as_json: bool,
) -> None:
    """Re-send the messages committed between two table versions (or times), from the table's
    retained history, through the command queue: the workers (`outbox run-dispatcher`) send them
    in commit order per document, with their own ids unless --new-ids. Start with --dry-run."""
    from outbox.app.replay import ReplayRequest, make_plan, open_replays
    from outbox.app.replay_status import statuses
    from outbox.core.clock import SystemClock

    ctx = click.get_current_context()
    _check_options(
        ctx,
        {
            "--from": start is not None,
            "--to": end is not None,
            "--where": predicate is not None,
            "--destination": destination is not None,
            "--new-ids": new_ids,
            "--dry-run": dry_run,
        },
        resume_id=resume_id,
        show_status=show_status,
    )
    settings = cli.settings()
    clock = SystemClock()
    with open_replays(settings, clock) as replays:
        if show_status:
            listed = statuses(replays.db)
            if as_json:
                emit_json({"replays": [s.to_dict() for s in listed]})
            else:
                print_replays(listed)
            return
        if resume_id is None:
            assert start is not None  # _check_options
            assert end is not None
            request = ReplayRequest(start, end, predicate, destination, new_ids)
            if dry_run:
                plan = make_plan(replays.store, settings, request)
                _dry_run(plan, replays.chunk_messages, as_json)
                return
            run = replays.start(request)
        else:
            run = replays.resume(resume_id)
        with progress(f"replay {run.replay_id}: enqueueing", run.messages) as advance:
            status = replays.enqueue(run, advance)
    if as_json:
        emit_json(status.to_dict())
    else:
        print_kv(f"replay {status.replay_id}", _fields(status))
    echo_err(
        f"replay {status.replay_id}: {status.messages} message(s) in {status.chunks} chunk(s) "
        "enqueued; `outbox run-dispatcher` sends them (`outbox replay --status` shows the "
        "progress)"
    )


def _check_options(
    ctx: click.Context, given: dict[str, bool], *, resume_id: str | None, show_status: bool
) -> None:
    """Which of the three forms was meant: a new replay, --resume ID or --status (``given``:
    which of the options of a new replay were given)."""
    extra = [name for name, on in given.items() if on]
    if show_status and (extra or resume_id is not None):
        raise click.UsageError(
            f"--status takes no other option (got {', '.join(extra or ['--resume'])})", ctx=ctx
        )
    if resume_id is not None and extra:
        raise click.UsageError(
            f"--resume goes on with the replay's own range and options; leave out "
            f"{', '.join(extra)}",
            ctx=ctx,
        )
    if not show_status and resume_id is None and not (given["--from"] and given["--to"]):
        raise click.UsageError(
            "a replay needs --from and --to (table versions or times), or --resume ID, or --status",
            ctx=ctx,
        )


def _dry_run(plan: Any, chunk_messages: int, as_json: bool) -> None:
    from outbox.app.replay import counts_dict

    chunks = len(plan.chunks(chunk_messages))
    summary = {
        "dry_run": True,
        "from_version": plan.range.start,
        "to_version": plan.range.end,
        "messages": plan.messages.num_rows,
        "documents": plan.documents,
        "chunks": chunks,
        "by_destination_type": counts_dict(plan),
    }
    if as_json:
        emit_json(summary)
        return
    print_kv(
        "replay (dry run: nothing sent)",
        [
            ("range", f"versions {plan.range.start}..{plan.range.end}"),
            ("messages", summary["messages"]),
            ("documents", summary["documents"]),
            ("chunks", chunks),
        ],
    )
    print_table(
        "messages per destination and type",
        ["destination", "type", "messages"],
        [(d, t, n) for d, t, n in plan.counts()] or [("(none)", "", "")],
    )


def _fields(s: ReplayStatus) -> list[tuple[str, Any]]:
    return [
        ("range", f"versions {s.from_version}..{s.to_version}"),
        ("status", s.status),
        ("messages", s.messages),
        ("chunks", s.chunks),
        ("enqueued chunks", s.enqueued_chunks),
        ("sent chunks", s.sent_chunks),
        ("sent messages", s.sent_messages),
        ("new ids", s.new_ids),
        ("where", s.predicate or "-"),
        ("destination", s.destination or "-"),
    ]


def print_replays(listed: list[ReplayStatus], title: str = "replays") -> None:
    """The replays as a table (``--status``, and ``outbox status``'s section)."""
    print_table(
        title,
        ["replay", "range", "status", "messages", "enqueued", "sent", "new ids", "started"],
        [
            (
                s.replay_id,
                f"{s.from_version}..{s.to_version}",
                s.status,
                "-" if s.messages is None else s.messages,
                f"{s.enqueued_chunks}/{'-' if s.chunks is None else s.chunks}",
                f"{s.sent_messages} ({s.sent_chunks} chunk(s))",
                s.new_ids,
                s.created_at.isoformat(sep=" ", timespec="seconds"),
            )
            for s in listed
        ]
        or [("(none)", "", "", "", "", "", "", "")],
    )


def register(group: click.Group) -> None:
    group.add_command(replay)
