"""The SQL queue blocks (``sql_queue.json``, ``sql_queue_profile.json`` and ``consumer.json``),
for ``benchmarks.report``."""

# ruff: noqa: RUF001  (the docs print multiplication signs and en dashes: their typography)

from __future__ import annotations

from typing import Any

from benchmarks.report_common import load, n, table

_table = table

#: The queue's four rates, in the order every table prints them.
QUEUE_KEYS = (
    "send_single_per_s",
    "send_batch100_per_s",
    "receive_complete_1_per_s",
    "receive_complete_4_per_s",
)


def sql_queue() -> str:
    q = load("sql_queue")
    labels = (
        "send, single",
        "send, batches of 100",
        "receive + complete, 1 receiver",
        "receive + complete, 4 threads",
    )
    rows = []
    for key, label in zip(QUEUE_KEYS, labels, strict=True):
        row = [label]
        for b in ("sqlite", "postgresql"):
            row += [
                f"{n(q[b]['queue'][key])}/s",
                f"{n(q[b]['floor'][key])}/s",
                f"{n(q[b]['floor_over_queue'][key], 2)}×",
            ]
        rows.append(row)
    procs = "receive_complete_4_processes_per_s"
    if all(procs in q[b]["queue"] for b in ("sqlite", "postgresql")):
        row = ["receive + complete, 4 processes"]
        for b in ("sqlite", "postgresql"):
            row.append(f"{n(q[b]['queue'][procs])}/s")
            if procs in q[b]["floor"]:  # the floor drains in processes on PostgreSQL only
                row += [f"{n(q[b]['floor'][procs])}/s", f"{n(q[b]['floor_over_queue'][procs], 2)}×"]
            else:
                row += ["", ""]
        rows.append(row)
        scale = q["postgresql"].get("four_processes_over_one")
        if scale:
            rows.append(
                [
                    "4 processes over 1 receiver",
                    "",
                    "",
                    "",
                    f"{n(scale['queue'], 2)}×",
                    f"{n(scale['floor'], 2)}×",
                    "",
                ]
            )
    lat = [q[b]["queue"]["latency"] for b in ("sqlite", "postgresql")]
    rows.append(
        [
            "end-to-end latency p50 / p99",
            f"{n(lat[0]['p50_ms'], 1)} / {n(lat[0]['p99_ms'], 1)} ms",
            "",
            "",
            f"{n(lat[1]['p50_ms'], 1)} / {n(lat[1]['p99_ms'], 1)} ms",
            "",
            "",
        ]
    )
    header = [
        f"{n(q['sqlite']['messages'])} messages",
        "SQLite queue",
        "SQLite floor",
        "floor/queue",
        "PostgreSQL queue",
        "PostgreSQL floor",
        "floor/queue",
    ]
    return _table(header, rows)


def sql_queue_profile() -> str:
    """``python -m benchmarks.sql_queue --profile LABEL``: each operation under cProfile, the
    code before and after issue 19 (docs/performance-queue.md)."""
    p = load("sql_queue_profile")
    rows = []
    for b, label in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL")):
        for op in ("send_batch100", "send_single", "receive_complete"):
            row = [f"{label}: {op.replace('_', ' ')}"]
            for when in ("before", "after"):
                r = p[when][b][op]
                shares = r["share_of_profiled_time_pct"]
                sa = shares.get("SQLAlchemy", 0.0)
                db = sum(v for k, v in shares.items() if k.startswith("driver and database"))
                row += [
                    f"{n(r['client_cpu_us_per_message_profiled'], 1)} µs",
                    n(r["statements_per_message"], 2),
                    f"{n(sa, 1)}% / {n(db, 1)}%",
                ]
            rows.append(row)
    header = [
        "operation",
        "before: client CPU per message",
        "statements per message",
        "SQLAlchemy / driver+database share",
        "after: client CPU per message",
        "statements per message",
        "SQLAlchemy / driver+database share",
    ]
    return _table(header, rows)


def consumer(data: dict[str, Any] | None = None) -> str:
    """``python -m benchmarks.consumer`` (issue 45, P18): the ``Consumer`` with an empty handler
    against the batched raw-SQL floor, per database (tests/benchmarks also renders it from a
    smoke run)."""
    c = data if data is not None else load("consumer")
    backends = _databases(c)
    rows = [
        [f"Consumer, {k} handler{'s' if k > 1 else ''}"]
        + [f"{n(c[b][f'consumer_{k}']['per_s'])}/s" for b, _ in backends]
        for k in (1, 4, 16)
    ]
    rows.append(
        ["Consumer, 1 handler, receives of 100"]
        + [f"{n(c[b]['consumer_1_receive_100']['per_s'])}/s" for b, _ in backends]
    )
    rows.append(
        ["floor: take 100 + delete 100 per transaction"]
        + [f"{n(c[b]['floor']['per_s'])}/s" for b, _ in backends]
    )
    rows.append(
        ["Consumer (1) / floor"] + [f"{n(c[b]['consumer_1_over_floor'], 2)}×" for b, _ in backends]
    )
    for what in ("handled", "completed"):
        rows.append(
            [f"lone message, send → {what}, p50 / p99"]
            + [
                f"{n(c[b]['latency'][f'{what}_p50_ms'], 1)} / "
                f"{n(c[b]['latency'][f'{what}_p99_ms'], 1)} ms"
                for b, _ in backends
            ]
        )
    first = c[backends[0][0]]["messages"] if backends else 0
    return table([f"{n(first)} messages", *(label for _, label in backends)], rows)


def _databases(c: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, label) of each database a consumer results file holds, SQLite first."""
    return [
        (b, label) for b, label in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL")) if b in c
    ]


def consumer_row(data: dict[str, Any] | None = None) -> list[str]:
    """The performance table's line for the consumer (issue 45, P18)."""
    c = data if data is not None else load("consumer")
    named = _databases(c)
    return [
        f"the queue's `Consumer` (one handler, empty, complete after it) draining "
        f"{n(c[named[0][0]]['messages'])} messages, vs a raw-SQL floor taking and deleting 100 a "
        "transaction with the same durability, best of "
        f"{n(c[named[0][0]]['rounds'])} interleaved rounds, "
        + " / ".join(label for _, label in named),
        " / ".join(f"**{n(c[b]['consumer_1']['per_s'])}/s**" for b, _ in named)
        + " (floor "
        + " / ".join(f"{n(c[b]['floor']['per_s'])}/s" for b, _ in named)
        + ": "
        + " / ".join(f"{n(c[b]['consumer_1_over_floor'], 3)}×" for b, _ in named)
        + f"; goal ≥ {n(c['goal']['per_s'])}/s and ≥ {n(c['goal']['over_floor'], 2)}×)",
        "`consumer.json`",
    ]


RENDERERS = {
    "sql-queue": sql_queue,
    "sql-queue-profile": sql_queue_profile,
    "consumer": consumer,
}
