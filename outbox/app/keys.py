"""The paused ordering keys, as operators see them: ``outbox status``, ``outbox keys`` and the
console read them here (``dispatcher.queue.key_lines`` is the store).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from outbox.core.clock import utc


@dataclass
class PausedKey:
    """A paused ordering key (``dispatcher.queue.key_lines``): the message it waits for (its
    gate), since when and why, and how many holds wait behind it. ``outbox keys resume`` gives
    up on the gate or opens the key."""

    destination: str
    ordering_key: str
    waits_for_message: str
    document_id: str
    seq: int
    since: datetime | None
    age_seconds: float | None
    held: int
    reason: str


#: How many paused keys ``outbox status`` lists (the count covers them all).
PAUSED_KEYS_LISTED = 20


def paused_keys(queue: Any, now: datetime, limit: int | None = None) -> list[PausedKey]:
    """The paused keys in ``queue``'s database, the longest paused first."""
    from dispatcher.queue.key_lines import SqlKeyLines

    out = []
    for (dest, key), line in SqlKeyLines(queue.database).lines(limit).items():
        gate = line[0]
        age = None if gate.since is None else round((now - utc(gate.since)).total_seconds(), 1)
        out.append(
            PausedKey(
                dest,
                key,
                gate.message_id,
                gate.doc_id,
                gate.seq,
                gate.since,
                age,
                len(line) - 1,
                gate.reason,
            )
        )
    return out
