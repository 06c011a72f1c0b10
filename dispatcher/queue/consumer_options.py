"""What a ``Consumer`` takes besides its queue, queue name and handler: ``ConsumerOptions``.

Why one object: the knobs (the inbox, the claim log, the timings, the batches) are eighteen,
too many for a parameter list. ``Consumer(queue, name, handler, options=ConsumerOptions(...))``
takes them at once, and each is still a keyword of its own (``Consumer(queue, name, handler,
inbox=True)``, typed by ``ConsumerKeywords``), applied over ``options``. The meaning of each is
in ``dispatcher.queue.consumer``'s docstring. ``inbox_of`` and ``claimed_receive`` read the two
options that name more than a value (the inbox, the claim log).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from dispatcher.queue.claimed import ClaimedReceive, Granularity
from dispatcher.queue.inbox import Inbox, SqlInbox
from outbox.core.backoff import ExponentialBackoff
from outbox.core.clock import Clock
from outbox.core.errors import ConfigurationError, UnprocessableMessageError

if TYPE_CHECKING:
    from dispatcher.claims.ports import ClaimLog
    from dispatcher.queue.sql_queue import SqlQueue

#: Redelivery delays when the caller gives none: 1 s, 2 s, 4 s ... up to 5 min, no jitter.
DEFAULT_BACKOFF = ExponentialBackoff()


@dataclass(frozen=True)
class ConsumerOptions:
    """``clock`` defaults to the queue's; ``inbox``: False, True (the SQL inbox named after the
    queue), a consumer name, or any ``Inbox``; ``inbox_lease`` defaults to the queue's lock
    duration; ``inbox_retention`` (seconds an id stays handled, at least the queue's
    duplicate-detection window) to ``inbox_retention``'s default, a week; ``max_messages``
    (a receive's batch) to ``max(concurrency, 16)``, from which ``run_forever``'s receives grow
    up to 100 while the queue is deep and the handlers quick (``receive_size``; a named number
    is kept as it is). ``complete_batch``: handled messages
    completed by one statement, and the most ever handled but not completed (a process that
    dies repeats at most that many; 1 completes each as its handler returns);
    ``complete_delay``: seconds the oldest handled message waits for its batch to fill, by the
    clock (the loop also completes whenever it has nothing more in hand); ``prefetch``:
    ``run_forever`` with ``concurrency`` > 1 receives the next batch while one runs."""

    clock: Clock | None = None
    inbox: bool | str | Inbox = False
    permanent_errors: tuple[type[BaseException], ...] = (UnprocessableMessageError,)
    backoff: Callable[[int], float] = DEFAULT_BACKOFF
    concurrency: int = 1
    poll_interval: float = 1.0
    renew_check_interval: float = 1.0
    claims: ClaimLog | None = None
    granularity: Granularity | str = Granularity.MESSAGE
    claim_lease: float = 30.0
    claim_owner: str | None = None
    look_again: float = 1.0
    max_messages: int | None = None
    inbox_lease: float | None = None
    inbox_retention: float | None = None
    complete_batch: int = 100
    complete_delay: float = 0.1
    prefetch: bool = True


class ConsumerKeywords(TypedDict, total=False):
    """``ConsumerOptions``' fields as ``Consumer``'s keyword arguments (the same names and types;
    tests/test_option_objects.py keeps the two in step)."""

    clock: Clock | None
    inbox: bool | str | Inbox
    permanent_errors: tuple[type[BaseException], ...]
    backoff: Callable[[int], float]
    concurrency: int
    poll_interval: float
    renew_check_interval: float
    claims: ClaimLog | None
    granularity: Granularity | str
    claim_lease: float
    claim_owner: str | None
    look_again: float
    max_messages: int | None
    inbox_lease: float | None
    inbox_retention: float | None
    complete_batch: int
    complete_delay: float
    prefetch: bool


def inbox_of(inbox: bool | str | Inbox | None, queue: SqlQueue, queue_name: str) -> Inbox | None:
    """The inbox ``inbox`` names: an ``Inbox`` as given, True or a consumer name the SQL inbox
    in the queue's database (named after the queue for True), False or None none."""
    if isinstance(inbox, Inbox):
        return inbox
    if inbox is None or isinstance(inbox, bool | str):
        name = inbox if isinstance(inbox, str) else queue_name
        return SqlInbox(queue.database, name) if inbox else None
    raise ConfigurationError(
        f"{type(inbox).__name__} is not an inbox: it lacks claim, renew, release or "
        "record (dispatcher.queue.inbox.Inbox)",
        hint="implement the Inbox protocol; outbox.testing.contracts.inbox checks it",
    )


def claimed_receive(
    opts: ConsumerOptions, queue_name: str, clock: Clock, *, plain: bool
) -> ClaimedReceive | None:
    """The claim-log receive protocol, with ``claims``; None without. ``plain``: the consumer
    has no inbox and a handler without a ``Connection`` (the claim log needs both)."""
    if opts.claims is None:
        return None
    if not plain:
        raise ConfigurationError(
            "a consumer with a claim log takes neither an inbox nor a handler with a "
            "Connection: the claim log decides what runs and cannot join a SQL "
            "transaction",
            hint="drop inbox=... and take only the message in the handler",
        )
    return ClaimedReceive(
        opts.claims,
        queue_name,
        clock,
        granularity=opts.granularity,
        lease=opts.claim_lease,
        owner=opts.claim_owner,
        look_again=opts.look_again,
        renew_check_interval=opts.renew_check_interval,
    )
