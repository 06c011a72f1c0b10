"""What one dispatch did: each document's outcome, and the report ``Dispatcher.dispatch`` returns
(the sends, and the watermark write after them).

Why apart from ``dispatch.py``: the report is what callers read (the runtime, the worker's
command handler, the Spark executors, ``Outbox``'s users); the dispatcher only fills it in.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from outbox.core.errors import PermanentTransportError
from outbox.core.model import DocumentRow


@dataclass(slots=True)  # not frozen, as TransportMessage: one per document dispatched
class DocumentOutcome:
    """What happened to one document's pending messages in one dispatch."""

    doc_id: str
    start_seq: int  # dispatched_seq when the dispatch began
    target_seq: int  # the highest pending seq it tried to send
    sent_up_to: int  # the highest seq the transport accepted (start_seq when none)
    error: Exception | None = None

    @property
    def complete(self) -> bool:
        return self.error is None and self.sent_up_to >= self.target_seq

    @property
    def progressed(self) -> bool:
        return self.sent_up_to > self.start_seq

    @property
    def permanent(self) -> bool:
        return isinstance(self.error, PermanentTransportError)


@dataclass
class DispatchReport:
    """The result of one dispatch: per-document outcomes and the watermark write."""

    outcomes: dict[str, DocumentOutcome] = field(default_factory=dict)
    messages_sent: int = 0
    watermark_version: int | None = None
    watermark_error: Exception | None = None
    watermark_seconds: float = 0.0
    #: The marks went to the ``WatermarkWriter`` (written later, off the caller's path).
    watermark_deferred: bool = False

    @property
    def failed(self) -> list[str]:
        """Documents that still hold unsent messages, or whose watermark was not written."""
        out = [d for d, o in self.outcomes.items() if not o.complete]
        if self.watermark_error is not None:
            out += [d for d, o in self.outcomes.items() if o.complete and o.progressed]
        return out

    @property
    def ok(self) -> bool:
        return not self.failed


def merge(report: DispatchReport, o: DocumentOutcome, row: DocumentRow) -> None:
    """Record ``o`` in ``report``; a later round's outcome goes on from where the first one
    stopped (its start stays the first's)."""
    first = report.outcomes.get(o.doc_id)
    report.outcomes[o.doc_id] = o if first is None else replace(o, start_seq=first.start_seq)
    report.messages_sent += _count_sent(o, row, first)


def _count_sent(
    outcome: DocumentOutcome, row: DocumentRow, before: DocumentOutcome | None = None
) -> int:
    low = outcome.start_seq if before is None else before.sent_up_to
    high = outcome.sent_up_to
    if high <= low:
        return 0
    if len(row.outbox) == 1:  # the usual case: one message per document
        return int(low < row.outbox[0].seq <= high)
    return sum(1 for m in row.outbox if low < m.seq <= high)
