"""One dead-letter selection for every administration (issue 43): ids, a ``where`` filter, or
all, exactly one, checked the same whether the dead letters are in SQL, on Service Bus or in a
Kafka topic. Before, an empty filter selected every dead letter on Service Bus (and none on
SQL), and only SQL checked the ids."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dispatcher.queue.messages import DeadLetter
from dispatcher.queue.selection import DeadLetterSelection
from outbox.core.errors import ValidationError

AT = datetime(2026, 1, 1, tzinfo=UTC)


def letter(id: int, reason: str = "Poison", queue: str = "q") -> DeadLetter:
    return DeadLetter(id, queue, f"m{id}", None, b"", "", "", None, {}, AT, id, 1, reason, "", AT)


def test_exactly_one_of_ids_a_filter_or_all() -> None:
    none_or_two: list[dict[str, object]] = [
        {},
        {"where": {}},  # an empty filter is no filter (it meant "all" on Service Bus)
        {"ids": [1], "all": True},
        {"where": {"reason": "x"}, "all": True},
    ]
    for bad in none_or_two:
        with pytest.raises(ValidationError, match="exactly one"):
            DeadLetterSelection.of(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="filter dead letters by 'body'"):
        DeadLetterSelection.of(where={"body": "x"})
    with pytest.raises(ValidationError, match="dead letter id must be a positive integer"):
        DeadLetterSelection.of([0])


def test_a_selection_matches_what_it_says() -> None:
    letters = [letter(1), letter(2, reason="Timeout"), letter(3, queue="other")]
    picked = {
        "ids": DeadLetterSelection.of([1, 3]),
        "where": DeadLetterSelection.of(where={"reason": "Poison", "queue": "q"}),
        "all": DeadLetterSelection.of(all=True),
    }
    assert {k: [d.id for d in letters if s.matches(d)] for k, s in picked.items()} == {
        "ids": [1, 3],
        "where": [1],
        "all": [1, 2, 3],
    }
