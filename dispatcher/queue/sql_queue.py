"""``SqlQueue``: a durable queue in SQL with Service Bus semantics (duplicate detection, scheduled
delivery, session FIFO with one lock holder per session, peek-lock settlement, delivery counts and
dead letters), as one convenient object.

It is a facade over three parts, one per port of ``dispatcher.queue.ports``: ``sender``
(``SqlQueueSender``), ``receiver`` (``SqlQueueReceiver``) and ``admin``
(``SqlQueueAdministration``). They share one ``Database`` (engine, transactions, error
translation) and one ``QueueOptions``; how each stays correct under concurrency is told in its own
module. Every time comes from the injected clock and is stored as UTC.

Why the ports' methods are declared forwards (``send = _Forward("sender", SqlQueueSender.send)``)
rather than written out: each was a copy of its part's signature around a one-line call, so a
change to a part had to be made twice. A declared forward takes the part's signature itself, so
mypy still checks ``queue.send(...)`` and ``SqlQueue`` against the ports, and ``queue.send`` is
the part's own bound method. Not inheritance from the parts: each part keeps private state of its
own (the receiver's prepared statements, the sender's cleanup hook) that would collide on one
object, and ``queue.sender`` (etc.) must stay a separate object of one role. What the facade adds
is written out here: construction, the shared settings, the schema check, pool growth, closing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from sqlalchemy import Engine

from dispatcher.queue.admin import SqlQueueAdministration
from dispatcher.queue.browse import DeadLetterBrowser
from dispatcher.queue.database import Database, open_engine
from dispatcher.queue.live import LiveBrowser
from dispatcher.queue.options import QueueOptions
from dispatcher.queue.ports import DEDUP_CLEANUP_LIMIT, Settleable
from dispatcher.queue.receiver import MAX_DELIVERY_REASON, SqlQueueReceiver
from dispatcher.queue.sender import SqlQueueSender
from dispatcher.queue.sessions import SqlSessions
from outbox.core.clock import Clock
from outbox.core.errors import QueueError

if TYPE_CHECKING:
    from outbox.core.settings import Settings

__all__ = ["DEDUP_CLEANUP_LIMIT", "MAX_DELIVERY_REASON", "Settleable", "SqlQueue"]

P = ParamSpec("P")
R = TypeVar("R")


class _Forward(Generic[P, R]):
    """A method of ``SqlQueue`` that is the same-named method of one of its parts: on an instance,
    the part's bound method; on the class, a function with the part's signature and docstring."""

    def __init__(self, part: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self._part = part
        self._name = method.__name__

        def forward(queue: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
            return getattr(getattr(queue, part), method.__name__)(*args, **kwargs)  # type: ignore[no-any-return]

        self._unbound = functools.wraps(method)(forward)

    @overload
    def __get__(self, queue: None, owner: type[Any]) -> Callable[Concatenate[Any, P], R]: ...

    @overload
    def __get__(self, queue: object, owner: type[Any]) -> Callable[P, R]: ...

    def __get__(
        self, queue: object | None, owner: type[Any]
    ) -> Callable[Concatenate[Any, P], R] | Callable[P, R]:
        if queue is None:
            return self._unbound
        return getattr(getattr(queue, self._part), self._name)  # type: ignore[no-any-return]


class SqlQueue:
    """A set of named queues in one SQL database (SQLite file or PostgreSQL).

    Queues need no creation: the first send to a valid name creates it. The instance is thread
    safe; use one per process and share it. It is a ``QueueSender``, a ``QueueReceiver`` and a
    ``QueueAdministration`` at once; pass ``queue.sender`` (etc.) where one role is enough.
    """

    def __init__(
        self,
        url_or_engine: str | Engine,
        *,
        clock: Clock | None = None,
        lock_duration: float = 30.0,
        max_delivery_count: int = 10,
        duplicate_detection_window: float = 600.0,
        max_body_bytes: int = 256 * 1024,
        check_schema: bool = True,
        pool_size: int | None = None,
    ) -> None:
        self._options = QueueOptions.checked(
            clock=clock,
            lock_duration=lock_duration,
            max_delivery_count=max_delivery_count,
            duplicate_detection_window=duplicate_detection_window,
            max_body_bytes=max_body_bytes,
        )
        if isinstance(url_or_engine, str):
            self._db = Database(open_engine(url_or_engine, pool_size=pool_size), owned=True)
        else:
            self._db = Database(url_or_engine, owned=False)
        self.admin = SqlQueueAdministration(self._db, self._options)
        self.receiver = SqlQueueReceiver(self._db, self._options)
        #: session states and settlement by message id (a device gateway's part)
        self.sessions = SqlSessions(self._db, self._options)
        #: dead letters a page at a time, filtered by time too (the console's)
        self.browse = DeadLetterBrowser(self._db)
        #: live messages by state and sessions with their heads, read-only (the console's)
        self.live = LiveBrowser(self._db, self._options)
        # A committed send prunes expired duplicate ids when due (at most every half window).
        self.sender = SqlQueueSender(
            self._db, self._options, after_commit=self.admin.maybe_forget_expired_duplicates
        )
        if check_schema:
            self._check_schema()

    @classmethod
    def from_settings(
        cls, settings: Settings, *, clock: Clock | None = None, pool_size: int | None = None
    ) -> SqlQueue:
        """A queue configured from ``outbox.core.settings.Settings``."""
        return cls(
            settings.sql_url,
            clock=clock,
            lock_duration=settings.lock_duration,
            max_delivery_count=settings.max_delivery_count,
            duplicate_detection_window=settings.duplicate_detection_window,
            max_body_bytes=settings.max_message_bytes,
            pool_size=pool_size,
        )

    def ensure_pool_size(self, size: int) -> None:
        """Grow the connection pool to at least ``size`` (for a queue built from a URL; an engine
        passed in is the caller's). Calls in progress finish on their connections."""
        if not self._db.owned:
            return
        current = getattr(self._db.engine.pool, "size", None)
        if not callable(current) or current() >= size:
            return
        old = self._db.engine
        self._db.engine = open_engine(old.url.render_as_string(hide_password=False), pool_size=size)
        old.dispose()

    @property
    def engine(self) -> Engine:
        """The engine, for a consumer handler's own SQL work in the same transaction."""
        return self._db.engine

    @property
    def database(self) -> Database:
        return self._db

    def _check_schema(self) -> None:
        from migrations.sql import current_revision, head_revision

        revision = current_revision(self._db.engine)
        if revision != head_revision():
            state = "is not migrated" if revision is None else f"is at revision {revision}"
            raise QueueError(
                f"the queue database {self._db.engine.url.render_as_string(hide_password=True)} "
                f"{state}; this version needs {head_revision()}",
                hint="run `outbox migrate`",
            )

    # --- settings, shared by the three parts (assignable, as before the split) -------------

    @property
    def clock(self) -> Clock:
        return self._options.clock

    @clock.setter
    def clock(self, value: Clock) -> None:
        self._options.clock = value

    @property
    def lock_duration(self) -> timedelta:
        return self._options.lock_duration

    @lock_duration.setter
    def lock_duration(self, value: timedelta) -> None:
        self._options.lock_duration = value

    @property
    def max_delivery_count(self) -> int:
        return self._options.max_delivery_count

    @max_delivery_count.setter
    def max_delivery_count(self, value: int) -> None:
        self._options.max_delivery_count = value

    @property
    def duplicate_detection_window(self) -> timedelta:
        return self._options.duplicate_detection_window

    @duplicate_detection_window.setter
    def duplicate_detection_window(self, value: timedelta) -> None:
        self._options.duplicate_detection_window = value

    @property
    def max_body_bytes(self) -> int:
        return self._options.max_body_bytes

    @max_body_bytes.setter
    def max_body_bytes(self, value: int) -> None:
        self._options.max_body_bytes = value

    # --- the ports, each method its part's own -----------------------------------------------

    send = _Forward("sender", SqlQueueSender.send)
    send_batch = _Forward("sender", SqlQueueSender.send_batch)
    validate = _Forward("sender", SqlQueueSender.validate)

    receive = _Forward("receiver", SqlQueueReceiver.receive)
    receive_and_delete = _Forward("receiver", SqlQueueReceiver.receive_and_delete)
    complete = _Forward("receiver", SqlQueueReceiver.complete)
    abandon = _Forward("receiver", SqlQueueReceiver.abandon)
    dead_letter = _Forward("receiver", SqlQueueReceiver.dead_letter)
    renew_lock = _Forward("receiver", SqlQueueReceiver.renew_lock)
    defer = _Forward("receiver", SqlQueueReceiver.defer)
    receive_deferred = _Forward("receiver", SqlQueueReceiver.receive_deferred)
    peek = _Forward("receiver", SqlQueueReceiver.peek)

    stats = _Forward("admin", SqlQueueAdministration.stats)
    list_dead_letters = _Forward("admin", SqlQueueAdministration.list_dead_letters)
    get_dead_letter = _Forward("admin", SqlQueueAdministration.get_dead_letter)
    count_dead_letters = _Forward("admin", SqlQueueAdministration.count_dead_letters)
    requeue = _Forward("admin", SqlQueueAdministration.requeue)
    purge = _Forward("admin", SqlQueueAdministration.purge)
    forget_expired_duplicates = _Forward("admin", SqlQueueAdministration.forget_expired_duplicates)
    maybe_forget_expired_duplicates = _Forward(
        "admin", SqlQueueAdministration.maybe_forget_expired_duplicates
    )

    # --- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Release connections; any later call raises ``ClosedError``."""
        self._db.close()

    def __enter__(self) -> SqlQueue:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
