"""The checker's truth (what the change data feed says was committed) on hand-made feed rows.

Found by issue 42's work on the delete-and-re-create step: a re-created document whose new
messages all carried the deleted life's ids (the ``ids-ignore-incarnation`` build, when the deleted
life had as many messages as the new one) had no message of its own, so the truth skipped it and
I1 held; only I6 caught the build.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from outbox.app.checker.truth import truth_from_images
from outbox.core.model import OutboxMessage, message_id_for
from outbox.delta.schema import message_to_struct

AT = datetime(2026, 12, 1, tzinfo=UTC)


def _message(doc: str, seq: int, incarnation: str | None, body: str) -> dict[str, Any]:
    m = OutboxMessage(
        seq=seq,
        message_id=message_id_for("t", doc, seq, incarnation),
        destination="shipments",
        type="StatusChanged",
        body=body,
    )
    return message_to_struct(m)


def _image(
    commit: int, incarnation: str, outbox: list[dict[str, Any]], *, change: str = "insert"
) -> dict[str, Any]:
    return {
        "id": "pkg-1",
        "version": 1,
        "incarnation": incarnation,
        "last_seq": len(outbox),
        "dispatched_seq": 0,
        "outbox": outbox,
        "_change_type": change,
        "_commit_version": commit,
        "_commit_timestamp": AT,
    }


def _lives(second_life_ids: str | None) -> list[dict[str, Any]]:
    """pkg-1 with two messages, deleted, created again with two new ones whose ids are drawn with
    ``second_life_ids`` as the incarnation (the first life's own: ids without the difference)."""
    first = [_message("pkg-1", s, "a" * 32, f'{{"life": 1, "seq": {s}}}') for s in (1, 2)]
    second = [_message("pkg-1", s, second_life_ids, f'{{"life": 2, "seq": {s}}}') for s in (1, 2)]
    return [
        _image(1, "a" * 32, first),
        _image(2, "a" * 32, first, change="delete"),
        _image(3, "b" * 32, second),
    ]


def test_a_re_created_life_is_counted_on_its_own() -> None:
    truth = truth_from_images(_lives("b" * 32))
    assert sorted(truth.committed) == ["pkg-1", "pkg-1~1"]
    assert [m.seq for m in truth.committed["pkg-1~1"]] == [1, 2]
    assert truth.seq_gaps == truth.changed_content == []


def test_a_life_whose_messages_all_carry_an_earlier_lifes_ids_has_a_seq_gap() -> None:
    truth = truth_from_images(_lives("a" * 32))
    assert "pkg-1~1" not in truth.committed  # every id was the first life's
    assert len(truth.changed_content) == 2  # I6
    assert truth.seq_gaps == ["pkg-1~1: committed seqs []... vs last_seq 2"]  # I1
