"""The gateway's places (``--max-in-flight``): the tasks it has out, and which ready tasks get the
places that are free.

A place is held by a task this process published until its ack, its dead letter or the end of
its lock (its next try). When fewer places are free than tasks are ready, the queue's receive
alone chose badly: it hands out the line in sequence order, and a silent device's task whose lock
ran out is older than the tasks of the devices queued behind it. With two places and two silent
devices queued before an acking one, each lapse freed a place and the next receive took the
silent device's task again, try after try, until both were dead-lettered: the acking device got
its first task after ``max_tries`` intervals instead of one.

The rule: a free place goes to the task that has waited longest **since it became ready**: a
first try since it was enqueued, a retry since its last try ran out (the lapse this process saw;
a retry of a try it did not make, another process's or one before a restart, counts from now).
A silent device's retry so waits behind the tasks that were ready before it timed out, and goes
ahead of those that came later: a silent device holds up no other device at any
``--max-in-flight``, and no retry waits for ever behind a stream of newer tasks.

To apply it the gateway takes more of the line than it has places (``enough`` says when it has
seen every task that could win a place), publishes the tasks that win (``choose``) and gives the
others back with their try not counted (``SqlSessions.return_to_line``). That happens only when
retries are at the head of the line and the places are fewer than the ready tasks; otherwise a
receive of as many tasks as there are free places is already the right choice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from dispatcher.queue.messages import ReceivedMessage

#: A task, as the gateway keys it: (device, message id).
Key = tuple[str, str]
P = TypeVar("P")
#: Lapses remembered (a retry's readiness) for the tasks not yet received again.
_REMEMBERED = 10_000


@dataclass(frozen=True, slots=True)
class Out:
    """A task this process published: when, and when its lock (the next try) ends."""

    at: datetime
    due: datetime


class Places:
    """The tasks out (in publish order, so lapsed ones are at the front: every lock lasts one
    interval) and the lapses of those whose lock ran out."""

    def __init__(self) -> None:
        self._out: OrderedDict[Key, Out] = OrderedDict()
        self._lapsed: OrderedDict[Key, datetime] = OrderedDict()

    def __len__(self) -> int:
        return len(self._out)

    def __contains__(self, key: object) -> bool:
        return key in self._out

    def held(self, now: datetime) -> int:
        """The places held at ``now``: a task whose next try has come is the line's again, and
        when its lock ran out is when its retry became ready."""
        while self._out:
            key, out = next(iter(self._out.items()))
            if out.due > now:
                break
            del self._out[key]
            self._lapsed[key] = out.due
            self._lapsed.move_to_end(key)
        while len(self._lapsed) > _REMEMBERED:
            self._lapsed.popitem(last=False)
        return len(self._out)

    def take(self, key: Key, at: datetime, due: datetime) -> None:
        """``key`` was published at ``at``; it holds a place until ``due``."""
        self._lapsed.pop(key, None)
        self._out[key] = Out(at, due)
        self._out.move_to_end(key)

    def release(self, key: Key) -> Out | None:
        """``key`` was settled (acked, dead-lettered, or its publish failed); what it held."""
        self._lapsed.pop(key, None)
        return self._out.pop(key, None)

    def release_devices(self, devices: Collection[str]) -> None:
        """The devices went offline: their tasks went back to the line, their tries taken back."""
        for key in [k for k in self._out if k[0] in devices]:
            del self._out[key]
        for key in [k for k in self._lapsed if k[0] in devices]:
            del self._lapsed[key]

    def ready_since(self, msg: ReceivedMessage, now: datetime) -> datetime:
        """When ``msg`` became ready: its enqueue for a first try, its last lapse for a retry."""
        if msg.delivery_count <= 1:
            return msg.enqueued_at
        assert msg.session_id is not None
        return self._lapsed.get((msg.session_id, msg.message_id), now)

    def enough(
        self, ready: Sequence[tuple[ReceivedMessage, P]], room: int, now: datetime, last: datetime
    ) -> bool:
        """Whether the line past the tasks in hand can stay there: its tasks were enqueued at or
        after ``last`` (the line is in sequence order), so none became ready before the ``room``
        tasks in hand that became ready first."""
        if len(ready) < room:
            return False
        first = sorted(self.ready_since(m, now) for m, _ in ready)[room - 1]
        return last >= first

    def choose(
        self, ready: Sequence[tuple[ReceivedMessage, P]], room: int, now: datetime
    ) -> tuple[list[tuple[ReceivedMessage, P]], list[ReceivedMessage]]:
        """The ``room`` tasks that became ready first (ties: the line's order), in the line's
        order, and the messages left over."""
        if len(ready) <= room:
            return list(ready), []
        order = sorted(ready, key=lambda r: (self.ready_since(r[0], now), r[0].sequence_number))
        won = {r[0].sequence_number for r in order[:room]}
        chosen = [r for r in ready if r[0].sequence_number in won]
        return chosen, [m for m, _ in ready if m.sequence_number not in won]
