"""A broker that is one append-only file: every accepted send is a line, re-sends included.

Why not the SQL queue: it drops a repeated ``message_id`` inside its duplicate-detection window,
which is right for consumers but hides exactly what the checker must count (every re-send, and
that it carries the same id and content). Why a file: several writer and worker *processes* send at
once and any of them may be SIGKILLed. Each batch is one ``write(2)`` on an ``O_APPEND`` descriptor,
so a batch is either wholly in the log (accepted) or not at all, and the file order is the order the
"broker" accepted messages in, across processes. A sender killed after the write but before it
returned re-sends later: that is a real duplicate, and the log shows it.

A second file, the *outage flag*, makes every sender in every process fail with a retryable error
while it exists: a broker outage that the supervisor switches on and off.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from dispatcher.transports.base import TransportMessage
from outbox.core.errors import RetryableTransportError


@dataclass(frozen=True, slots=True)
class Delivery:
    """One accepted message: what was sent, when (wall time), and by which process role."""

    message: TransportMessage
    at: float
    role: str  # "writer" (immediate dispatch) or "worker" (a ProcessDocument command)
    pid: int


class LogTransport:
    """A transport whose broker is ``path``; fails while ``outage_flag`` exists."""

    atomic_batches = True

    def __init__(self, path: str | Path, *, role: str, outage_flag: str | Path | None = None):
        self.path = Path(path)
        self.role = role
        self.outage_flag = Path(outage_flag) if outage_flag is not None else None
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.accepted = 0

    def send(self, batch: Sequence[TransportMessage]) -> None:
        if self.outage_flag is not None and self.outage_flag.exists():
            first = batch[0].message_id if batch else None
            raise RetryableTransportError(
                f"message {first}: the broker is unreachable (injected outage)",
                message_id=first,
            )
        if not batch:
            return
        now, pid = time.time(), os.getpid()
        data = "".join(_line(m, now, self.role, pid) for m in batch).encode("utf-8")
        written = os.write(self._fd, data)  # one write: the batch is accepted all or nothing
        if written != len(data):  # pragma: no cover - only on a full disk
            raise RetryableTransportError(f"the broker log took {written} of {len(data)} bytes")
        self.accepted += len(batch)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _line(m: TransportMessage, at: float, role: str, pid: int) -> str:
    return (
        json.dumps(
            {
                "id": m.message_id,
                "dest": m.destination,
                "body": m.body.decode("utf-8"),
                "subject": m.subject,
                "ct": m.content_type,
                "session": m.session_id,
                "sched": m.scheduled_at.isoformat() if m.scheduled_at else None,
                "corr": m.correlation_id,
                "headers": m.headers,
                "at": at,
                "role": role,
                "pid": pid,
            },
            separators=(",", ":"),
        )
        + "\n"
    )


def read_log(path: str | Path) -> list[Delivery]:
    """Every delivery in acceptance order. A torn last line (impossible with one ``write`` per
    batch, but cheap to guard) is ignored: its send never returned."""
    p = Path(path)
    if not p.exists():
        return []
    out: list[Delivery] = []
    for raw in p.read_text("utf-8").splitlines():
        try:
            d = json.loads(raw)
        except ValueError:
            continue
        msg = TransportMessage(
            message_id=d["id"],
            destination=d["dest"],
            body=d["body"].encode("utf-8"),
            subject=d["subject"],
            content_type=d["ct"],
            session_id=d["session"],
            scheduled_at=datetime.fromisoformat(d["sched"]) if d["sched"] else None,
            correlation_id=d["corr"],
            headers=dict(d["headers"]),
        )
        out.append(Delivery(msg, float(d["at"]), str(d["role"]), int(d["pid"])))
    return out
