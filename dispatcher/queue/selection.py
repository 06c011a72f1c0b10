"""Which dead letters a count, a requeue or a purge touches: ids, a ``where`` filter, or all.

One type for every administration that takes the selection (the SQL queue's, the Service Bus
command queue's, the Kafka dead-letter topic's; ``QueueAdministration`` declares it): each had
written its own rules, and they differed (an empty filter meant every dead letter on Service Bus
and none on SQL; ids were checked on SQL only; three messages for the same mistake). Their
methods still take ``ids``, ``where=`` and ``all=`` (the shipped contract suite and users call
them so) and build one ``DeadLetterSelection`` from them first, with ``of``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dispatcher.queue import validation
from outbox.core.errors import ValidationError

if TYPE_CHECKING:
    from dispatcher.queue.messages import DeadLetter

#: The fields a ``where`` filter may name (each must equal its value).
FILTER_KEYS = ("queue", "reason", "session_id", "message_id", "subject")


def check_where(where: Mapping[str, str] | None) -> None:
    """A ``where`` filter names only ``FILTER_KEYS``."""
    for key in where or {}:
        if key not in FILTER_KEYS:
            raise ValidationError(
                f"cannot filter dead letters by {key!r}",
                hint=f"use one of {', '.join(FILTER_KEYS)}",
            )


@dataclass(frozen=True, slots=True)
class DeadLetterSelection:
    """Exactly one of: dead letters by id, those matching every pair of ``where``, or ``all``."""

    ids: tuple[int, ...] | None = None
    where: Mapping[str, str] | None = None
    all: bool = False

    @classmethod
    def of(
        cls,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
    ) -> DeadLetterSelection:
        """The selection the arguments say, checked: exactly one of them given (an empty
        filter is none), positive ids, known filter keys."""
        if sum([ids is not None, bool(where), all]) != 1:
            raise ValidationError(
                "say which dead letters: ids, a where filter, or all (exactly one)",
                hint="e.g. requeue 12 13, requeue --where reason=Timeout, or requeue --all",
            )
        if ids is not None:
            return cls(ids=tuple(validation.positive("dead letter id", i) for i in ids))
        if all:
            return cls(all=True)
        check_where(where)
        return cls(where=dict(where or {}))

    def matches(self, dead_letter: DeadLetter) -> bool:
        """Does ``dead_letter`` belong to the selection (for stores read whole, not queried)?"""
        if self.all:
            return True
        if self.ids is not None:
            return dead_letter.id in self.ids
        return all(str(getattr(dead_letter, k)) == v for k, v in (self.where or {}).items())
