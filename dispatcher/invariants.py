"""Check a delivery log against what was committed: I1 (no loss), I2 (order), I3 (no phantom) and
I6 (duplicates share a message_id).

The fault-injection tests, the end-to-end checker and the demo all ask the same question of a run,
so the answer lives here once. Input is what was committed (per document, the messages in seq
order) and every delivery in the order the broker accepted them, re-sends included.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from dispatcher.transports.base import TransportMessage
from outbox.core.model import OutboxMessage


@dataclass
class InvariantReport:
    committed: int = 0
    delivered: int = 0  # deliveries, re-sends included
    duplicates: int = 0  # deliveries beyond the first of a message_id
    lost: list[str] = field(default_factory=list)  # I1: committed, never delivered
    out_of_order: list[str] = field(default_factory=list)  # I2: docs with unordered firsts
    phantoms: list[str] = field(default_factory=list)  # I3: delivered, never committed
    mismatched: list[str] = field(default_factory=list)  # I6: a re-send differs from its first

    @property
    def ok(self) -> bool:
        return not (self.lost or self.out_of_order or self.phantoms or self.mismatched)

    def describe(self) -> str:
        parts = [
            f"committed {self.committed}",
            f"delivered {self.delivered}",
            f"duplicates {self.duplicates}",
        ]
        for name in ("lost", "out_of_order", "phantoms", "mismatched"):
            items = getattr(self, name)
            if items:
                parts.append(f"{name.upper()} {len(items)}: {items[:5]}")
        return ", ".join(parts)


def verify_deliveries(
    committed: Mapping[str, Sequence[OutboxMessage]], deliveries: Iterable[TransportMessage]
) -> InvariantReport:
    """``committed``: document id -> its committed messages; ``deliveries``: in acceptance order."""
    by_id: dict[str, tuple[str, OutboxMessage]] = {
        m.message_id: (doc, m) for doc, msgs in committed.items() for m in msgs
    }
    report = InvariantReport(committed=len(by_id))
    first: dict[str, TransportMessage] = {}
    first_seqs: dict[str, list[int]] = {}
    counts: Counter[str] = Counter()
    for d in deliveries:
        report.delivered += 1
        counts[d.message_id] += 1
        known = by_id.get(d.message_id)
        if known is None:
            report.phantoms.append(d.message_id)
            continue
        if d.message_id in first:
            if first[d.message_id] != d:
                report.mismatched.append(d.message_id)
            continue
        first[d.message_id] = d
        doc, msg = known
        if d.body != msg.body.encode("utf-8"):
            report.phantoms.append(d.message_id)  # same id, content that was never committed
        first_seqs.setdefault(doc, []).append(msg.seq)
    report.duplicates = sum(c - 1 for c in counts.values())
    report.lost = [mid for mid in by_id if mid not in first]
    report.out_of_order = [doc for doc, seqs in first_seqs.items() if seqs != sorted(seqs)]
    return report
