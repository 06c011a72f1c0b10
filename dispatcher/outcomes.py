"""What one dispatch did: each document's outcome, and the report ``Dispatcher.dispatch`` returns
(the sends, and the watermark write after them).

Why apart from ``dispatch.py``: the report is what callers read (the runtime, the worker's
command handler, the Spark executors, ``Outbox``'s users); the dispatcher only fills it in.

**Sent whole.** A shared send that took every message of its documents is recorded as its plans,
once (``sent_whole``), not as an outcome per document: after a 1,000-document unit of work on a
healthy transport, nobody reads 1,000 outcomes, and building them was a tenth of the dispatch.
``outcomes`` builds them when someone asks; ``failed``, ``tally`` and ``marks`` answer from the
plans directly while nothing else was recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from outbox.core.errors import PermanentTransportError
from outbox.core.model import DocumentRow, OutboxMessage

#: A document and its messages to send, in seq order.
Plan = tuple[DocumentRow, list[OutboxMessage]]


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

    messages_sent: int = 0
    watermark_version: int | None = None
    watermark_error: Exception | None = None
    watermark_seconds: float = 0.0
    #: The marks went to the ``WatermarkWriter`` (written later, off the caller's path).
    watermark_deferred: bool = False
    _outcomes: dict[str, DocumentOutcome] = field(default_factory=dict, init=False, repr=False)
    #: Shared sends that took all their documents' messages, in the order they were recorded.
    _whole: list[Sequence[Plan]] = field(default_factory=list, init=False, repr=False)

    @property
    def outcomes(self) -> dict[str, DocumentOutcome]:
        """Each document's outcome (the dict itself: a caller may add to it)."""
        if self._whole:
            self._settle_whole()
        return self._outcomes

    def record(self, o: DocumentOutcome, row: DocumentRow) -> None:
        """Record ``o``; a later round's outcome goes on from where the first one stopped (its
        start stays the first's)."""
        if self._whole:  # in the order they happened
            self._settle_whole()
        first = self._outcomes.get(o.doc_id)
        self._outcomes[o.doc_id] = o if first is None else replace(o, start_seq=first.start_seq)
        self.messages_sent += _count_sent(o, row, first)

    def sent_whole(self, chunk: Sequence[Plan]) -> None:
        """Every message of ``chunk``'s plans was taken by one send."""
        self._whole.append(chunk)
        self.messages_sent += sum([len(msgs) for _, msgs in chunk])

    def _mixed(self) -> bool:
        """Outcomes and whole sends both recorded: the outcomes are built (a document may be in
        both, held back first and sent whole in a later round)."""
        if self._whole and self._outcomes:
            self._settle_whole()
            return True
        return False

    def _settle_whole(self) -> None:
        whole, self._whole = self._whole, []
        outcomes = self._outcomes
        for chunk in whole:
            for row, msgs in chunk:
                last = msgs[-1].seq
                first = outcomes.get(row.id)
                start = row.dispatched_seq if first is None else first.start_seq
                outcomes[row.id] = DocumentOutcome(row.id, start, last, last)

    @property
    def failed(self) -> list[str]:
        """Documents that still hold unsent messages, or whose watermark was not written."""
        self._mixed()
        out = [d for d, o in self._outcomes.items() if not o.complete]
        if self.watermark_error is not None:
            out += [d for d, o in self._outcomes.items() if o.complete and o.progressed]
            out += [row.id for chunk in self._whole for row, _ in chunk]
        return out

    @property
    def ok(self) -> bool:
        return not self.failed

    def tally(self) -> tuple[int, int]:
        """(documents whose pending messages all went, documents left with some unsent)."""
        self._mixed()
        if self._whole:
            return sum([len(chunk) for chunk in self._whole]), 0
        complete = sum([o.complete for o in self._outcomes.values()])
        return complete, len(self._outcomes) - complete

    def marks(self, rows: Iterable[DocumentRow]) -> dict[str, tuple[int, str | None]]:
        """(the highest seq the transport took, the document's life) of each document that made
        progress; ``rows`` are the dispatch's (their lives, for outcomes recorded one by one)."""
        self._mixed()
        if self._whole:
            return {
                row.id: (msgs[-1].seq, row.incarnation)
                for chunk in self._whole
                for row, msgs in chunk
            }
        lives = {r.id: r.incarnation for r in rows}
        return {d: (o.sent_up_to, lives.get(d)) for d, o in self._outcomes.items() if o.progressed}


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
