"""Inboxes forget what nothing needs any more: handled ids older than the retention, and claims
nobody holds.

An inbox gained a row per handled message for ever. Now an id handled longer ago than
``inbox_retention`` (default 7 days, never shorter than the queue's duplicate-detection window)
is deleted, with the claims released (at any age: a released claim records nothing) or whose
lease ended that long ago; a live claim never is,
however long ago it was taken. ``outbox maintain`` prunes every consumer's records
(``outbox.app.maintenance.forget_old_records``), and a running ``Consumer`` its own
(``InboxPruner``), at most once per ``PRUNE_EVERY`` by its clock. Both shipped inboxes can
(``inbox.SqlInbox``, ``inbox_cosmos.CosmosInbox``); an inbox that cannot is left alone.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

from dispatcher.queue.inbox import PRUNE_CHUNK, Inbox
from outbox.core.clock import Clock
from outbox.core.durations import format_duration
from outbox.core.errors import ConfigurationError, OutboxError
from outbox.core.settings import DEFAULT_INBOX_RETENTION

log = logging.getLogger("outbox.queue.consumer")

#: Rows one ``InboxPruner`` run deletes at most (a backlog is worked off over the next runs,
#: between the messages).
PRUNE_BATCH = 10 * PRUNE_CHUNK
#: How often a running consumer prunes its own inbox, by its clock.
PRUNE_EVERY = timedelta(hours=1)


@runtime_checkable
class PrunableInbox(Protocol):
    """An inbox that can forget what nothing needs any more (both shipped inboxes can)."""

    def prune(
        self, before: datetime, *, limit: int | None = None, every_consumer: bool = False
    ) -> int:
        """Delete this consumer's (``every_consumer``: every consumer's) ids handled before
        ``before``, its released claims, and those whose lease ended before ``before``; at most
        ``limit`` (None: all). A live claim is never deleted. Returns how many were."""
        ...


class InboxPruner:
    """A running consumer's own upkeep of its inbox: at most once per ``every`` by the clock, it
    deletes up to ``PRUNE_BATCH`` records older than ``retention`` (``PrunableInbox.prune``);
    a full batch leaves the next run due at once. An inbox that cannot prune is left alone.

    ``retention`` may not be shorter than the queue's duplicate-detection ``window``: the inbox
    drops the repeats that detection lets through (a resend after it, the other region's copy, a
    redelivery after a crash), so it has to remember an id at least as long.
    """

    def __init__(
        self,
        inbox: Inbox,
        clock: Clock,
        *,
        retention: float | None = None,
        window: timedelta = timedelta(0),
        every: timedelta = PRUNE_EVERY,
    ) -> None:
        seconds = DEFAULT_INBOX_RETENTION if retention is None else retention
        if seconds < window.total_seconds():
            raise ConfigurationError(
                f"inbox_retention {format_duration(seconds)} is shorter than the queue's "
                f"duplicate-detection window ({format_duration(window.total_seconds())}): the "
                "inbox drops the repeats that detection lets through, so it must remember an "
                "id at least as long",
                hint=f"use an inbox_retention of at least the window, e.g. the default "
                f"{format_duration(DEFAULT_INBOX_RETENTION)}",
            )
        self.inbox = inbox
        self.clock = clock
        self.retention = timedelta(seconds=seconds)
        self.every = every
        self.pruned = 0
        self._last: datetime | None = None  # None: due at the first chance
        self._guard = threading.Lock()

    def maybe_prune(self) -> int:
        """Prune when due; how many records went. Never raises: a failure is logged and tried
        again after ``every``."""
        if not isinstance(self.inbox, PrunableInbox):
            return 0
        now = self.clock.now()
        if self._last is not None and now - self._last < self.every:
            return 0
        if not self._guard.acquire(blocking=False):
            return 0  # another thread of this consumer is at it
        try:
            deleted = self.inbox.prune(now - self.retention, limit=PRUNE_BATCH)
        except OutboxError as e:
            log.warning("pruning the inbox failed (tried again later): %s", e)
            deleted = 0
        finally:
            self._guard.release()
        self._last = None if deleted >= PRUNE_BATCH else now
        if deleted:
            log.info(
                "pruned %d inbox record(s) of %s older than %s",
                deleted,
                self.inbox.consumer,
                format_duration(self.retention.total_seconds()),
            )
        self.pruned += deleted
        return deleted
