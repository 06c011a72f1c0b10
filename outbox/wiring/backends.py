"""``Backends``: one process's settings turned into backends, built on first use, closed together.

Why one object: the SQL queue is shared by the SQL transport, the command queue (when commands go
to SQL), the worker and a consumer's inbox, so whoever builds them must hand out that one queue
and close it once. ``Backends`` owns everything it builds (``close`` closes it all); an object
handed in (``transport=``, ``queue=``) stays its giver's. Every accessor builds once and then
returns the same object.

    with Backends(settings, clock=clock) as b:
        store = b.document_store()
        rescue = RescuePass(store, b.rescuer_engine(), b.checkpoint_store(), b.command_sink(), ...)

The Delta document store is built here too (``open_document_store``, ``Backends.document_store``),
so every entry point (``Outbox.open``, ``SparkOutbox``, ``outbox rescue``, ``outbox maintain``,
``outbox status``, the probes and the console's sampler) opens it with the same arguments from the
same settings.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from outbox.core.clock import Clock, SystemClock
from outbox.core.errors import ClosedError, OutboxError
from outbox.core.settings import Settings
from outbox.wiring import builtin
from outbox.wiring.registry import Backend, Context, Registry

if TYPE_CHECKING:
    from dispatcher.claims.ports import ClaimLog
    from dispatcher.queue.command_queue import CommandQueue
    from dispatcher.queue.inbox import Inbox
    from dispatcher.queue.key_lines import KeyLines
    from dispatcher.queue.sql_queue import SqlQueue
    from dispatcher.transports.base import Transport
    from migrations.runner import MigrationReport
    from outbox.delta.store import DeltaDocumentStore
    from rescuer.checkpoint import ClosableCheckpointStore
    from rescuer.planner import Engine
    from rescuer.sink import QueueSink

T = TypeVar("T")


def open_document_store(settings: Settings, *, clock: Clock | None = None) -> DeltaDocumentStore:
    """A new store on the settings' Delta table (``table_uri``, ``storage_options``,
    ``max_commit_retries``, ``group_commit``), for a caller that keeps its own: a probe on a
    server thread, a sampler, a command that opens it once. The table must exist."""
    from outbox.delta.store import DeltaDocumentStore

    return DeltaDocumentStore(
        settings.table_uri,
        storage_options=settings.storage_options,
        clock=clock,
        max_commit_retries=settings.max_commit_retries,
        group_commit=settings.group_commit,
    )


class Backends:
    """The backends ``settings`` name, for one process (thread safe)."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock | None = None,
        transport: Transport | None = None,
        queue: SqlQueue | None = None,
        commands: CommandQueue | None = None,
        spark: Any = None,
    ) -> None:
        builtin.check(settings)  # an unknown name or a missing setting fails here, not later
        self.settings = settings
        self.clock = clock or SystemClock()
        #: The SparkSession the ``spark`` rescuer engine runs on (None: the engine's own).
        self.spark_session = spark
        self._lock = threading.RLock()
        self._built: dict[str, Any] = {}
        self._owned: list[Any] = []  # closed by ``close``, last built first
        self._closed = False
        self._given: list[Any] = []  # handed in: the giver's, never closed here
        for key, given in (("transport", transport), ("sql_queue", queue), ("commands", commands)):
            if given is not None:
                self._built[key] = given
                self._given.append(given)

    # --- the shared SQL queue ---------------------------------------------------------------

    @property
    def sql_queue(self) -> SqlQueue:
        """The SQL queue on ``sql_url``: the SQL transport's and (by default) the commands'."""

        def build() -> SqlQueue:
            from dispatcher.queue.sql_queue import SqlQueue

            s = self.settings
            return SqlQueue.from_settings(s, clock=self.clock, pool_size=s.max_in_flight + 2)

        return self._once("sql_queue", build)

    # --- one per kind -------------------------------------------------------------------------

    def document_store(self, *, clock: Clock | None = None) -> DeltaDocumentStore:
        """The process's document store (``open_document_store``), on ``clock`` (default: these
        backends' clock); closed with the backends."""
        return self._once(
            "document_store", lambda: open_document_store(self.settings, clock=clock or self.clock)
        )

    def transport(self) -> Transport:
        """Where outbox messages go (``transport``)."""
        return self._build("transport", builtin.TRANSPORTS)

    def key_lines(self) -> KeyLines:
        """Where paused ordering keys wait (``dispatcher.queue.key_lines``): the SQL queue's
        database, shared by every process that sends (the writer, the command worker, the Spark
        job), or this process's memory when the transport is ``memory`` (one process)."""

        def build() -> KeyLines:
            from dispatcher.queue.key_lines import MemoryKeyLines, SqlKeyLines

            if self.settings.transport == "memory":
                return MemoryKeyLines()
            return SqlKeyLines(lambda: self.sql_queue.database)

        return self._once("key_lines", build, owned=False)

    def command_queue(self) -> CommandQueue:
        """Where ``ProcessDocument`` commands go (``command_transport``)."""
        return self._build("commands", builtin.COMMAND_QUEUES)

    def command_sink(self) -> QueueSink:
        """The rescuer's sink into the command queue (``command_queue`` names the queue)."""

        def build() -> QueueSink:
            from rescuer.sink import QueueSink

            return QueueSink(self.command_queue(), self.settings.command_queue)

        return self._once("sink", build, owned=False)  # it closes nothing of its own

    def checkpoint_store(self) -> ClosableCheckpointStore:
        """The rescuers' checkpoints (``checkpoint_store``)."""
        return self._build("checkpoints", builtin.CHECKPOINT_STORES)

    def rescuer_engine(self, name: str | None = None) -> Engine:
        """The change-feed engine ``name`` (default: ``rescuer_engine``)."""
        chosen = name or self.settings.rescuer_engine
        backend = builtin.RESCUER_ENGINES.get(chosen)
        engine: Engine = self._once(
            f"engine:{chosen}", lambda: self._call(builtin.RESCUER_ENGINES, backend)
        )
        return engine

    def claim_log(self) -> ClaimLog:
        """The geo claim log (``claim_log``; docs/geo.md)."""
        return self._build("claims", builtin.CLAIM_LOGS)

    def inbox(self, consumer: str) -> Inbox:
        """The inbox of ``consumer`` (``inbox_store``)."""
        backend = builtin.INBOXES.checked(self.settings)
        inbox: Inbox = self._once(
            f"inbox:{consumer}", lambda: self._call(builtin.INBOXES, backend, consumer)
        )
        return inbox

    def migrate(
        self, *, only_if_missing: bool = False, raise_on_conflict: bool = True
    ) -> MigrationReport:
        """``outbox migrate`` with the chosen backends' provisioning."""
        from migrations.runner import migrate

        return migrate(
            self.settings,
            provisioners=builtin.provisioners(self.settings),
            only_if_missing=only_if_missing,
            raise_on_conflict=raise_on_conflict,
        )

    def built(self, key: str) -> Any:
        """What was built under ``key`` (``transport``, ``sql_queue``, ``commands``...), or None:
        for a caller that must not build a backend only to look at it."""
        with self._lock:
            return self._built.get(key)

    # --- plumbing ---------------------------------------------------------------------------

    def _build(self, key: str, registry: Registry[Callable[[Context], T]]) -> T:
        backend = registry.checked(self.settings)
        built: T = self._once(key, lambda: self._call(registry, backend))
        return built

    def _call(self, registry: Registry[Any], backend: Backend[Any], *args: Any) -> Any:
        try:
            return backend.build(self, *args)
        except ImportError as e:
            raise registry.missing(backend, e) from e

    def _once(self, key: str, build: Callable[[], T], *, owned: bool = True) -> T:
        with self._lock:
            if self._closed:
                raise ClosedError("these backends are closed", hint="build new Backends")
            if key not in self._built:
                made = build()
                self._built[key] = made
                mine = all(made is not x for x in (*self._given, *self._owned))
                if owned and mine and callable(getattr(made, "close", None)):
                    self._owned.append(made)
            return self._built[key]  # type: ignore[no-any-return]

    def close(self) -> None:
        """Close everything built here, the last built first (the SQL queue after the transport
        that sends into it). Errors are swallowed: this runs on shutdown."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            owned, self._owned = self._owned, []
        for made in reversed(owned):
            with contextlib.suppress(OutboxError):
                made.close()

    def __enter__(self) -> Backends:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
