"""Data builders for the console's tests and benchmark: many dead letters, a device fleet and a
history of samples, written straight into the queue's database in bulk.

Why not through the queue's API: a dead letter made by ``send``, ``receive`` and ``dead_letter``
costs three transactions, and ``benchmarks/console.py`` needs 100,000 of them (with a month of
``dead_lettered_at`` times no live queue would give in a test). These builders write the rows as
the queue itself writes them (the same SQLAlchemy tables, so the same column types and time
format) with one ``executemany`` per chunk, all in one transaction: 100,000 dead letters of 1 KB
in seconds on SQLite. What they write is only what the queue could have written; they never
bypass a constraint the schema holds.

The rows are deterministic for a given ``seed``, so two runs build the same workspace.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, func, insert, select

from dispatcher.queue.sql_queue import SqlQueue
from migrations.sql.tables import dead_letters as D
from migrations.sql.tables import queue_messages as M
from migrations.sql.tables import queue_sessions as S
from migrations.sql.tables import samples as T

__all__ = [
    "LAG_METRICS",
    "TABLE_METRICS",
    "FilledDevices",
    "Fleet",
    "fill_dead_letters",
    "fill_devices",
    "fill_samples",
]

#: Rows per ``executemany``: bounded memory (a chunk of 1 KB bodies is 10 MB), few round trips.
CHUNK = 10_000

#: The metric names of ``outbox.app.history`` (the console's history), spelled out because the
#: testing kit sits below ``outbox.app`` in the layers and may not import it; a console test or
#: the benchmark reading them back through ``History`` catches a drift.
RESCUE_LAG_SECONDS = "rescue_lag_seconds"
RESCUE_LAG_VERSIONS = "rescue_lag_versions"
LAG_METRICS = (RESCUE_LAG_SECONDS, RESCUE_LAG_VERSIONS)
TABLE_METRICS = (
    "pending_documents",
    "pending_messages",
    "oldest_pending_age_seconds",
    "geo_claims_in_flight",
)

Target = SqlQueue | Engine


@contextmanager
def _write(target: Target, action: str) -> Iterator[Connection]:
    """One write transaction: the queue's own (its writer mutex on SQLite) or the engine's."""
    if isinstance(target, SqlQueue):
        with target.database.write(action) as conn:
            yield conn
    else:
        with target.begin() as conn:
            yield conn


def _picker(choices: Sequence[str] | Mapping[str, float], rng: random.Random) -> list[str]:
    """``k`` draws at a time from ``choices`` (equal weights for a sequence)."""
    if not choices:
        raise ValueError("give at least one choice")
    if isinstance(choices, Mapping):
        names, weights = list(choices), [float(w) for w in choices.values()]
    else:
        names, weights = list(choices), [1.0] * len(choices)
    return rng.choices(names, weights, k=CHUNK)


def _body(i: int, queue: str, size: int, rng: random.Random) -> bytes:
    """A JSON body of about ``size`` bytes that looks like an order event."""
    doc: dict[str, Any] = {
        "event": "OrderPlaced",
        "queue": queue,
        "order": f"ord-{i:08d}",
        "customer": f"cust-{rng.randrange(100_000):06d}",
        "lines": [
            {"sku": f"sku-{rng.randrange(10_000):05d}", "qty": rng.randrange(1, 9)}
            for _ in range(3)
        ],
        "note": "",
    }
    text = json.dumps(doc, separators=(",", ":"))
    doc["note"] = "x" * max(0, size - len(text))
    return json.dumps(doc, separators=(",", ":")).encode()


def fill_dead_letters(
    target: Target,
    count: int,
    *,
    queues: Sequence[str] | Mapping[str, float],
    reasons: Sequence[str] | Mapping[str, float],
    sessions: Mapping[str, Sequence[str]] | None = None,
    start: datetime,
    step: timedelta,
    body_bytes: int = 1024,
) -> list[int]:
    """Write ``count`` dead letters in one transaction and return their ids, oldest first.

    Each one's queue and reason are drawn from ``queues`` and ``reasons`` (a mapping gives each
    name its weight); the dead letters of a queue named in ``sessions`` carry a session id drawn
    from its list (a device gateway's failed tasks), the others none. ``dead_lettered_at`` starts
    at ``start`` and grows by ``step`` per dead letter, in id order, as dead letters arrive.
    Bodies are JSON of about ``body_bytes`` bytes. The draws are seeded by the highest id
    before, so the same database gets the same dead letters."""
    by_queue = {q: list(s) for q, s in (sessions or {}).items()}
    at = start.astimezone(UTC)
    with _write(target, "fill dead letters") as conn:
        before = int(conn.execute(select(func.coalesce(func.max(D.c.id), 0))).scalar_one())
        rng = random.Random(before)
        for offset in range(0, count, CHUNK):
            n = min(CHUNK, count - offset)
            qs, rs = _picker(queues, rng), _picker(reasons, rng)
            rows = []
            for k in range(n):
                i = offset + k
                queue, reason = qs[k], rs[k]
                names = by_queue.get(queue)
                dead_at = at + step * i
                tries = 10 if reason == "MaxDeliveryCountExceeded" else rng.randrange(1, 10)
                rows.append(
                    {
                        "queue": queue,
                        "message_id": f"dead-{before + i + 1:09d}",
                        "session_id": rng.choice(names) if names else None,
                        "body": _body(i, queue, body_bytes, rng),
                        "subject": "OrderPlaced",
                        "content_type": "application/json",
                        "correlation_id": None,
                        "headers": json.dumps({"type": "OrderPlaced", "source": "bench"}),
                        "enqueued_at": dead_at - timedelta(seconds=30 + rng.randrange(3600)),
                        "sequence_number": 1_000_000 + i,
                        "delivery_count": tries,
                        "reason": reason,
                        "description": f"{reason} after {tries} deliveries of order {i}",
                        "dead_lettered_at": dead_at,
                    }
                )
            conn.execute(insert(D), rows)
        ids = conn.execute(select(D.c.id).where(D.c.id > before).order_by(D.c.id)).scalars()
        return [int(i) for i in ids]


@dataclass(frozen=True)
class Fleet:
    """The shape of ``fill_devices``'s fleet: what share of the devices is offline (paused),
    has no recorded status, or (of the online ones) has its head task out."""

    tasks_per_device: int = 5
    offline: float = 0.1
    unknown: float = 0.05
    out: float = 0.5
    prefix: str = "device-"
    seed: int = 0


@dataclass(frozen=True)
class FilledDevices:
    """What ``fill_devices`` wrote: the devices in name order, and which are offline or out."""

    names: list[str]
    offline: list[str]
    #: online devices with their head task published and not acked (a lock held)
    out: list[str]
    #: devices with tasks but no recorded status (``unknown``)
    unknown: list[str]
    tasks: int


def fill_devices(
    target: Target,
    destination: str,
    count: int,
    fleet: Fleet | None = None,
    *,
    now: datetime,
) -> FilledDevices:
    """A fleet of ``count`` devices on ``destination``: each a session with a recorded status
    (``fleet.offline`` of them offline and paused, ``fleet.unknown`` of them with no status row,
    the rest online) and ``fleet.tasks_per_device`` queued tasks, enqueued round-robin (every
    device's first task, then every second one) over the hour before ``now``. Of the online
    devices, ``fleet.out`` of them have their head task published (a try or more, a lock until a
    little after ``now``), as a gateway leaves them. One transaction."""
    f = fleet or Fleet()
    rng = random.Random(f.seed)
    width = max(5, len(str(count)))
    names = [f"{f.prefix}{i:0{width}d}" for i in range(count)]
    online = max(0.0, 1 - f.offline - f.unknown)
    kinds = rng.choices(["offline", "unknown", "online"], [f.offline, f.unknown, online], k=count)
    now = now.astimezone(UTC)
    out_set = {
        n for n, k in zip(names, kinds, strict=True) if k == "online" and rng.random() < f.out
    }
    states = [
        {
            "queue": destination,
            "session_id": name,
            "paused": kind == "offline",
            "state": kind,
            "since": now - timedelta(seconds=rng.randrange(7 * 24 * 3600)),
            "updated_at": now,
        }
        for name, kind in zip(names, kinds, strict=True)
        if kind != "unknown"
    ]
    total = count * f.tasks_per_device
    first = now - timedelta(hours=1)
    spacing = timedelta(hours=1) / max(1, total)
    with _write(target, "fill devices") as conn:
        for i in range(0, len(states), CHUNK):
            conn.execute(insert(S), states[i : i + CHUNK])
        rows = []
        for n in range(total):
            t, d = divmod(n, count)
            name = names[d]
            enqueued = first + spacing * n
            head_out = t == 0 and name in out_set
            tries = rng.randrange(1, 4) if head_out else 0
            rows.append(
                {
                    "queue": destination,
                    "message_id": f"{name}-t{t}",
                    "session_id": name,
                    "body": json.dumps({"task": "open", "door": f"D-{t}"}).encode(),
                    "subject": "",
                    "content_type": "application/json",
                    "correlation_id": None,
                    "headers": "{}",
                    "enqueued_at": enqueued,
                    "not_before": enqueued,
                    "delivery_count": tries,
                    "lock_token": str(uuid.UUID(int=rng.getrandbits(128))) if head_out else None,
                    "locked_until": now + timedelta(seconds=30) if head_out else None,
                    "locked_at": now - timedelta(seconds=rng.randrange(60)) if head_out else None,
                    "deferred": False,
                    "scheduled": False,
                }
            )
            if len(rows) == CHUNK:
                conn.execute(insert(M), rows)
                rows = []
        if rows:
            conn.execute(insert(M), rows)
    return FilledDevices(
        names=names,
        offline=[n for n, k in zip(names, kinds, strict=True) if k == "offline"],
        out=sorted(out_set),
        unknown=[n for n, k in zip(names, kinds, strict=True) if k == "unknown"],
        tasks=total,
    )


def _slot(at: datetime, interval: float) -> datetime:
    """``outbox.app.history.slot_start``: the start of the sampling slot ``at`` falls in."""
    ts = at.timestamp()
    step = max(1.0, float(interval))
    return datetime.fromtimestamp(ts - ts % step, tz=UTC)


def _lag(rng: random.Random, k: int, base: float) -> float:
    """A rescuer's lag: a sawtooth around its delay, with a rare spike."""
    value = base + (k % 15) * base / 15 + rng.random() * 2
    return round(value * (8 if rng.random() < 0.002 else 1), 1)


def fill_samples(
    target: Target,
    *,
    rescuers: Sequence[str],
    end: datetime,
    span: timedelta,
    interval: float = 60.0,
    pending_documents: float = 300.0,
    source: str = "fill",
    dead_letter_queues: Sequence[str] = (),
) -> int:
    """A history of samples every ``interval`` seconds over ``span`` up to ``end`` (the slots
    ``History.record`` would have written): each rescuer's lag in seconds and versions
    (``LAG_METRICS``) and the table's numbers (``TABLE_METRICS``) near ``pending_documents``,
    and each of ``dead_letter_queues``' dead-letter count, slowly growing.
    Returns the rows written (one transaction); the values are the same on every call."""
    rng = random.Random(0)
    last = _slot(end.astimezone(UTC), interval)
    slots = int(span.total_seconds() // interval)
    step = timedelta(seconds=interval)
    rows: list[dict[str, Any]] = []
    written = 0
    with _write(target, "fill console samples") as conn:
        for k in range(slots, -1, -1):
            taken = last - step * k
            values = [
                ("pending_documents", "", pending_documents + rng.randrange(-20, 21)),
                ("pending_messages", "", pending_documents * 1.2 + rng.randrange(-20, 21)),
                ("oldest_pending_age_seconds", "", round(5 + rng.random() * 40, 1)),
                ("geo_claims_in_flight", "", float(rng.randrange(5))),
            ]
            for q, name in enumerate(dead_letter_queues):  # each queue's count, growing
                values.append(("dead_letters", name, float(100 * (q + 1) + (slots - k) // 10)))
            for r, name in enumerate(rescuers):
                lag = _lag(rng, k, 15.0 * (r + 1))
                values += [
                    (RESCUE_LAG_SECONDS, name, lag),
                    (RESCUE_LAG_VERSIONS, name, float(int(lag // 5))),
                ]
            rows += [
                {
                    "metric": m,
                    "subject": s,
                    "taken_at_s": int(taken.timestamp()),
                    "value": float(v),
                    "source": source,
                }
                for m, s, v in values
            ]
            if len(rows) >= CHUNK:
                conn.execute(insert(T), rows)
                written += len(rows)
                rows = []
        if rows:
            conn.execute(insert(T), rows)
            written += len(rows)
    return written


def fill_live(
    target: Target, destination: str, count: int, *, now: datetime, seed: int = 7
) -> None:
    """``count`` live messages on ``destination`` over the hour before ``now``, in every state
    the console's live pages filter by: 85% active, 5% scheduled (due within the next hour), 5%
    deferred and 5% locked (a lock until a little after ``now``); each of 1,000 sessions, JSON
    bodies of about 100 bytes. One transaction."""
    rng = random.Random(seed)
    now = now.astimezone(UTC)
    first = now - timedelta(hours=1)
    spacing = timedelta(hours=1) / max(1, count)
    with _write(target, "fill live messages") as conn:
        rows = []
        for n in range(count):
            enqueued = first + spacing * n
            kind = rng.choices(["active", "scheduled", "deferred", "locked"], [85, 5, 5, 5])[0]
            locked = kind == "locked"
            rows.append(
                {
                    "queue": destination,
                    "message_id": f"live-{n:07d}",
                    "session_id": f"order-{n % 1000:04d}",
                    "body": json.dumps({"order": n, "status": "placed", "lines": n % 7}).encode(),
                    "subject": "OrderPlaced",
                    "content_type": "application/json",
                    "correlation_id": None,
                    "headers": "{}",
                    "enqueued_at": enqueued,
                    "not_before": now + timedelta(seconds=rng.randrange(60, 3600))
                    if kind == "scheduled"
                    else enqueued,
                    "delivery_count": 1 if locked or kind == "deferred" else 0,
                    "lock_token": str(uuid.UUID(int=rng.getrandbits(128))) if locked else None,
                    "locked_until": now + timedelta(seconds=60) if locked else None,
                    "locked_at": now - timedelta(seconds=rng.randrange(30)) if locked else None,
                    "deferred": kind == "deferred",
                    "scheduled": kind == "scheduled",
                }
            )
            if len(rows) == CHUNK:
                conn.execute(insert(M), rows)
                rows = []
        if rows:
            conn.execute(insert(M), rows)
