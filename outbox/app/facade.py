"""``Outbox``: the entry point applications hold on to.

``Outbox.open`` resolves settings (arguments > ``OUTBOX_*`` > settings file > defaults), turns
them into backends (``outbox.wiring.Backends``), opens the Delta document store and wires the
dispatcher (immediate or deferred) behind every commit. Use it as ``with Outbox.open(...) as
ob:``; an outbox still open when the program ends is closed before the interpreter shuts down
(``outbox.core.shutdown``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from dispatcher.runtime import DispatcherRuntime
from dispatcher.transports.base import Transport
from outbox.app.maintenance import AutoCompactor, AutoLogTrimmer
from outbox.core.clock import Clock, SystemClock
from outbox.core.errors import ClosedError, ConfigurationError
from outbox.core.model import DocumentRow
from outbox.core.settings import Settings
from outbox.core.shutdown import close_at_exit
from outbox.delta import reads
from outbox.delta.store import DeltaDocumentStore
from outbox.unit_of_work import UnitOfWork
from outbox.wiring import Backends

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("outbox")

CommitListener = Callable[[Sequence[DocumentRow], int], None]


class _Closeable(Protocol):
    def close(self) -> None: ...


class Outbox:
    """Documents in a Delta table, with their outgoing messages committed alongside."""

    def __init__(
        self,
        settings: Settings,
        store: DeltaDocumentStore,
        *,
        clock: Clock,
    ) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock
        self._listeners: list[CommitListener] = []
        self._closeables: list[_Closeable] = []
        self._closed = False
        self._runtime: DispatcherRuntime | None = None
        self._backends: Backends | None = None

    @classmethod
    def open(
        cls,
        workspace: str | Path | None = None,
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
        transport: Transport | str | None = None,
        create: bool = True,
        **overrides: Any,
    ) -> Outbox:
        """Open (and, with ``create=True``, create) the outbox in ``workspace``.

        ``overrides`` are settings by name: ``table_uri``, ``storage_options``, ``sql_url``,
        ``transport`` (a name, or pass a ``Transport`` object as ``transport``), ``rescue_delay``,
        ``dispatch`` and the rest of ``Settings``.
        """
        if isinstance(transport, str):
            overrides["transport"] = transport
            transport = None
        if settings is None:
            settings = Settings.load(workspace, **overrides)
        elif overrides:
            settings = settings.replace(**overrides)
        clock = clock or SystemClock()
        backends = Backends(settings, clock=clock, transport=transport)
        try:
            if create:
                backends.migrate(only_if_missing=True)
            store = backends.document_store(clock=clock)
        except BaseException:
            backends.close()
            raise
        ob = cls(settings, store, clock=clock)
        close_at_exit(ob)  # its threads stop before the interpreter finalizes
        ob._backends = backends
        ob._closeables.append(backends)  # closed last: after the runtime that uses them
        ob._wire_dispatch(backends)
        if settings.compact_every:
            ob.add_commit_listener(AutoCompactor(store, settings.compact_every))
            ob.add_commit_listener(
                AutoLogTrimmer(
                    store,
                    settings.compact_every,
                    sql_url=settings.sql_url,
                    retention_seconds=settings.log_retention,
                    clock=clock,
                    storage_options=settings.storage_options,
                    settings=settings,
                )
            )
        return ob

    def _wire_dispatch(self, backends: Backends) -> None:
        """Connect the dispatcher (immediate or deferred) to every commit.

        The dispatcher package owns the runtime; the outbox only knows it as a commit listener.
        """
        runtime = DispatcherRuntime(self.store, self.settings, backends, clock=self.clock)
        self._runtime = runtime
        self._listeners.append(runtime.after_commit)
        self._closeables.append(runtime)

    @property
    def backends(self) -> Backends:
        """The backends ``open`` built from the settings (transport, queues, stores)."""
        if self._backends is None:
            raise ConfigurationError(
                "this Outbox has no backends: it was built directly, not with Outbox.open",
                hint="use Outbox.open(...)",
            )
        return self._backends

    @property
    def runtime(self) -> DispatcherRuntime:
        """The dispatcher runtime (transport, command queue, dispatcher) that ``open`` wired."""
        if self._runtime is None:
            raise ConfigurationError(
                "this Outbox has no dispatcher: it was built directly, not with Outbox.open",
                hint="use Outbox.open(...) to get the dispatcher wired behind every commit",
            )
        return self._runtime

    def add_commit_listener(self, listener: CommitListener) -> None:
        self._listeners.append(listener)

    def _after_commit(self, rows: Sequence[DocumentRow], version: int) -> None:
        for listener in self._listeners:
            try:
                listener(rows, version)
            except Exception:  # the commit happened; the rescuer finishes the job (I4)
                log.exception("after-commit listener failed; the rescuer will cover it")

    def unit_of_work(self) -> UnitOfWork:
        """A new unit of work: one Delta commit when its ``with`` block exits cleanly."""
        if self._closed:
            raise ClosedError("this Outbox is closed", hint="open a new one with Outbox.open(...)")
        return UnitOfWork(self.store, self.settings, self.clock, on_commit=self._after_commit)

    def documents(
        self,
        ids: Sequence[str] | None = None,
        *,
        type: str | None = None,
        as_of: reads.AsOf | None = None,
        columns: Sequence[str] | None = None,
        include_deleted: bool = False,
    ) -> pa.Table:
        """The current documents as an Arrow table, one row per document, ordered by id
        (docs/readers.md): all of them, those of ``ids``, or those of one ``type``; now, or
        ``as_of`` a table version (int) or a time (a datetime, naive meaning UTC, or ISO 8601
        text). ``columns``: a subset of the document columns. ``include_deleted``: tombstones
        too (with a ``deleted`` column). pandas: ``.to_pandas()``; polars:
        ``polars.from_arrow(...)``.

        The rule is the library's own (``outbox.delta.current``): the rows of ids are read as
        ``uow.get`` reads them. A time is resolved once to the newest version committed at or
        before it; before the history the table keeps, ``HistoryGoneError``."""
        if self._closed:
            raise ClosedError("this Outbox is closed", hint="open a new one with Outbox.open(...)")
        return reads.read_store(
            self.store,
            ids,
            as_of=as_of,
            log_retention=self.settings.log_retention,
            type=type,
            columns=columns,
            include_deleted=include_deleted,
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for c in reversed(self._closeables):
            try:
                c.close()
            except Exception:  # pragma: no cover - best effort on shutdown
                log.exception("closing %r failed", c)
        self.store.close()

    def __enter__(self) -> Outbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def read_documents(
    workspace_or_uri: str | Path | None = None,
    ids: Sequence[str] | None = None,
    *,
    type: str | None = None,
    as_of: reads.AsOf | None = None,
    columns: Sequence[str] | None = None,
    include_deleted: bool = False,
    settings: Settings | None = None,
    **overrides: Any,
) -> pa.Table:
    """``Outbox.documents`` without an outbox: for a notebook or a reporting job that only reads.

    ``workspace_or_uri``: a workspace folder (its settings are loaded as ``Outbox.open`` loads
    them), or the table's own location (a URI, or a folder holding ``_delta_log``). ``settings``
    and ``overrides`` (``storage_options=...``) as for ``Outbox.open``. Opens the table only: no
    SQL database, no dispatcher, nothing written."""
    from outbox.wiring.backends import open_document_store

    if settings is None:
        workspace, given = _workspace_and_table(workspace_or_uri, overrides)
        settings = Settings.load(workspace, **given)
    elif overrides:
        settings = settings.replace(**overrides)
    store = open_document_store(settings)
    try:
        return reads.read_store(
            store,
            ids,
            as_of=as_of,
            log_retention=settings.log_retention,
            type=type,
            columns=columns,
            include_deleted=include_deleted,
        )
    finally:
        store.close()


def _workspace_and_table(
    where: str | Path | None, overrides: dict[str, Any]
) -> tuple[str | Path | None, dict[str, Any]]:
    """(workspace, settings overrides): a table's location becomes ``table_uri``."""
    text = None if where is None else str(where)
    if text is not None and "table_uri" not in overrides:
        is_table = "://" in text or (Path(text) / "_delta_log").is_dir()
        if is_table:
            return None, {**overrides, "table_uri": text}
    return where, overrides
