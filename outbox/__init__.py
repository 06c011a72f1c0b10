"""delta-outbox: documents and their outgoing messages in one Delta commit.

>>> from outbox import Outbox
>>> ob = Outbox.open(".outbox")          # doctest: +SKIP

The public API is this package and a few modules beside it, each a list of names re-exported from
where they live (tests/test_exported_members.py pins every list; docs/design.md, "Layers", "The
public API"): ``outbox`` (the outbox, its unit of work, ``read_documents`` and ``current_sql``,
settings, clocks and the error tree), ``outbox.spark`` (``SparkOutbox`` and a local Delta-enabled
session), ``outbox.queue`` (the SQL queue, its consumer and inboxes), ``outbox.kafka``,
``outbox.transports``, ``outbox.rescuer`` and ``outbox.testing`` (contract suites and fakes).
Everything else is internal and may move.

The package reads floor to roof: ``outbox.core`` (the kernel: model, errors, settings, clock),
``outbox.delta`` (the document table), ``outbox.unit_of_work``, then ``outbox.wiring`` (settings to
backends), ``outbox.testing`` (the kit) and ``outbox.app`` (the roof: facade, CLI, status, checker,
demos, Spark). The names below are resolved on first use (PEP 562), so importing
``outbox.core.errors`` from a lower floor never drags in the facade and, through it, the whole
dispatcher: the floors stay acyclic at run time as well as on paper (docs/design.md, "Layers").
Before the first name that needs ``dispatcher``, ``rescuer`` or ``migrations`` is resolved, a
user's module hiding one of them is reported as ``ShadowedPackageError``
(``outbox.core.shadowing``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.core.lazy import guard, lazy_exports

if TYPE_CHECKING:
    from dispatcher.outcomes import DispatchReport
    from outbox.app.facade import Outbox, read_documents
    from outbox.core.clock import Clock, ManualClock, SystemClock
    from outbox.core.errors import (
        ChangeDataFeedDisabledError,
        ClosedError,
        CommitConflictError,
        ConcurrencyError,
        ConfigurationError,
        DeltaNotConfiguredError,
        DocumentNotFoundError,
        EngineError,
        HistoryGoneError,
        LockLostError,
        MessageTooLargeError,
        MissingDependencyError,
        OutboxError,
        PermanentTransportError,
        QueueError,
        QueueUnavailableError,
        RescuerError,
        RetryableTransportError,
        SchemaMismatchError,
        SerializationError,
        ShadowedPackageError,
        StoreError,
        TableNotFoundError,
        TombstoneNotSentError,
        TransportError,
        TransportUnavailableError,
        UnknownDestinationError,
        UnprocessableMessageError,
        ValidationError,
        WorkspaceError,
    )
    from outbox.core.model import OutboxMessage
    from outbox.core.settings import Settings
    from outbox.delta.current import current_sql
    from outbox.unit_of_work import Document, UnitOfWork
    from outbox.wiring.backends import Backends

_EXPORTS = {
    "Outbox": "outbox.app.facade",
    "read_documents": "outbox.app.facade",
    "current_sql": "outbox.delta.current",
    "Backends": "outbox.wiring.backends",
    "DispatchReport": "dispatcher.outcomes",
    "Clock": "outbox.core.clock",
    "ManualClock": "outbox.core.clock",
    "SystemClock": "outbox.core.clock",
    "OutboxError": "outbox.core.errors",
    "ConfigurationError": "outbox.core.errors",
    "ShadowedPackageError": "outbox.core.errors",
    "DeltaNotConfiguredError": "outbox.core.errors",
    "ValidationError": "outbox.core.errors",
    "MessageTooLargeError": "outbox.core.errors",
    "SerializationError": "outbox.core.errors",
    "MissingDependencyError": "outbox.core.errors",
    "StoreError": "outbox.core.errors",
    "TableNotFoundError": "outbox.core.errors",
    "ChangeDataFeedDisabledError": "outbox.core.errors",
    "SchemaMismatchError": "outbox.core.errors",
    "ConcurrencyError": "outbox.core.errors",
    "CommitConflictError": "outbox.core.errors",
    "ClosedError": "outbox.core.errors",
    "WorkspaceError": "outbox.core.errors",
    "QueueError": "outbox.core.errors",
    "QueueUnavailableError": "outbox.core.errors",
    "LockLostError": "outbox.core.errors",
    "UnprocessableMessageError": "outbox.core.errors",
    "TransportError": "outbox.core.errors",
    "RetryableTransportError": "outbox.core.errors",
    "TransportUnavailableError": "outbox.core.errors",
    "PermanentTransportError": "outbox.core.errors",
    "UnknownDestinationError": "outbox.core.errors",
    "RescuerError": "outbox.core.errors",
    "HistoryGoneError": "outbox.core.errors",
    "DocumentNotFoundError": "outbox.core.errors",
    "TombstoneNotSentError": "outbox.core.errors",
    "EngineError": "outbox.core.errors",
    "OutboxMessage": "outbox.core.model",
    "Settings": "outbox.core.settings",
    "Document": "outbox.unit_of_work",
    "UnitOfWork": "outbox.unit_of_work",
}

__all__ = [
    "Backends",
    "ChangeDataFeedDisabledError",
    "Clock",
    "ClosedError",
    "CommitConflictError",
    "ConcurrencyError",
    "ConfigurationError",
    "DeltaNotConfiguredError",
    "DispatchReport",
    "Document",
    "DocumentNotFoundError",
    "EngineError",
    "HistoryGoneError",
    "LockLostError",
    "ManualClock",
    "MessageTooLargeError",
    "MissingDependencyError",
    "Outbox",
    "OutboxError",
    "OutboxMessage",
    "PermanentTransportError",
    "QueueError",
    "QueueUnavailableError",
    "RescuerError",
    "RetryableTransportError",
    "SchemaMismatchError",
    "SerializationError",
    "Settings",
    "ShadowedPackageError",
    "StoreError",
    "SystemClock",
    "TableNotFoundError",
    "TombstoneNotSentError",
    "TransportError",
    "TransportUnavailableError",
    "UnitOfWork",
    "UnknownDestinationError",
    "UnprocessableMessageError",
    "ValidationError",
    "WorkspaceError",
    "current_sql",
    "read_documents",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, guard=guard)
