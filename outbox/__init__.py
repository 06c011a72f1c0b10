"""delta-outbox: documents and their outgoing messages in one Delta commit.

>>> from outbox import Outbox
>>> ob = Outbox.open(".outbox")          # doctest: +SKIP

The package reads floor to roof: ``outbox.core`` (the kernel: model, errors, settings, clock),
``outbox.delta`` (the document table), ``outbox.unit_of_work``, then ``outbox.wiring`` (settings to
backends), ``outbox.testing`` (the kit) and ``outbox.app`` (the roof: facade, CLI, status, checker,
demos, Spark). The names below are resolved on first use (PEP 562), so importing
``outbox.core.errors`` from a lower floor never drags in the facade and, through it, the whole
dispatcher: the floors stay acyclic at run time as well as on paper (docs/design.md, "Layers").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.core.lazy import lazy_exports

if TYPE_CHECKING:
    from outbox.app.facade import Outbox
    from outbox.core.clock import Clock, ManualClock, SystemClock
    from outbox.core.errors import (
        ChangeDataFeedDisabledError,
        ClosedError,
        CommitConflictError,
        ConcurrencyError,
        ConfigurationError,
        LockLostError,
        MessageTooLargeError,
        OutboxError,
        SchemaMismatchError,
        SerializationError,
        UnprocessableMessageError,
        ValidationError,
    )
    from outbox.core.model import OutboxMessage
    from outbox.core.settings import Settings
    from outbox.unit_of_work import Document, UnitOfWork

_EXPORTS = {
    "Outbox": "outbox.app.facade",
    "Clock": "outbox.core.clock",
    "ManualClock": "outbox.core.clock",
    "SystemClock": "outbox.core.clock",
    "ChangeDataFeedDisabledError": "outbox.core.errors",
    "ClosedError": "outbox.core.errors",
    "CommitConflictError": "outbox.core.errors",
    "ConcurrencyError": "outbox.core.errors",
    "ConfigurationError": "outbox.core.errors",
    "LockLostError": "outbox.core.errors",
    "MessageTooLargeError": "outbox.core.errors",
    "OutboxError": "outbox.core.errors",
    "SchemaMismatchError": "outbox.core.errors",
    "SerializationError": "outbox.core.errors",
    "UnprocessableMessageError": "outbox.core.errors",
    "ValidationError": "outbox.core.errors",
    "OutboxMessage": "outbox.core.model",
    "Settings": "outbox.core.settings",
    "Document": "outbox.unit_of_work",
    "UnitOfWork": "outbox.unit_of_work",
}

__all__ = [
    "ChangeDataFeedDisabledError",
    "Clock",
    "ClosedError",
    "CommitConflictError",
    "ConcurrencyError",
    "ConfigurationError",
    "Document",
    "LockLostError",
    "ManualClock",
    "MessageTooLargeError",
    "Outbox",
    "OutboxError",
    "OutboxMessage",
    "SchemaMismatchError",
    "SerializationError",
    "Settings",
    "SystemClock",
    "UnitOfWork",
    "UnprocessableMessageError",
    "ValidationError",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
