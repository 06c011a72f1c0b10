"""The durable ``ProcessDocument`` command: "send whatever this document still holds".

Deferred dispatch, the rescuer and a failed immediate dispatch all end here. The command id is
derived from (table, id, up_to_seq, incarnation), so enqueueing the same command twice (a repeated
rescue pass, a crash before the checkpoint) is dropped by the queue's duplicate detection, while a
document deleted and created again (a new incarnation, restarting at seq 1) is not mistaken for
its predecessor. The session is the
document id, so one worker handles a document at a time and its messages keep their order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from outbox.core import telemetry
from outbox.core.errors import ValidationError
from outbox.core.model import command_id_for

if TYPE_CHECKING:
    from dispatcher.queue.messages import QueueMessage

COMMAND_SUBJECT = "ProcessDocument"
COMMAND_CONTENT_TYPE = "application/json"


@dataclass(frozen=True, slots=True)
class ProcessDocument:
    table: str  # the table id (stable across URIs), see outbox.core.model.message_id_for
    id: str
    up_to_seq: int
    table_uri: str = ""
    incarnation: str | None = None  # None: a row written before incarnations existed

    @property
    def command_id(self) -> str:
        return command_id_for(self.table, self.id, self.up_to_seq, self.incarnation)

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "table": self.table,
            "table_uri": self.table_uri,
            "id": self.id,
            "up_to_seq": self.up_to_seq,
        }
        if self.incarnation is not None:  # a legacy command's body stays what it was
            data["incarnation"] = self.incarnation
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, body: str | bytes) -> ProcessDocument:
        try:
            data: Any = json.loads(body)
            return cls(
                table=str(data["table"]),
                id=str(data["id"]),
                up_to_seq=int(data["up_to_seq"]),
                table_uri=str(data.get("table_uri", "")),
                incarnation=_optional_str(data.get("incarnation")),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ValidationError(
                f"malformed ProcessDocument command: {e}",
                hint="commands must be JSON with table, id and up_to_seq",
            ) from e

    def to_queue_message(self, not_before: datetime | None = None) -> QueueMessage:
        """The queue message; ``not_before`` schedules it (a retry after a failed dispatch)."""
        from dispatcher.queue.messages import QueueMessage

        headers: dict[str, str] = {}
        telemetry.inject_headers(headers)  # the rescue pass (or dispatch) that asked for it
        return QueueMessage(
            body=self.to_json(),
            headers=dict(headers),
            message_id=self.command_id,
            session_id=self.id,
            not_before=not_before,
            subject=COMMAND_SUBJECT,
            content_type=COMMAND_CONTENT_TYPE,
        )


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


#: A document to command: (id, last_seq) or (id, last_seq, incarnation). The pair form is a
#: document whose incarnation is unknown or null (a legacy row).
DocRef = tuple[str, int] | tuple[str, int, str | None]


def commands_for(table_id: str, table_uri: str, docs: Iterable[DocRef]) -> list[ProcessDocument]:
    """One command per (document id, last_seq[, incarnation])."""
    return [_command(table_id, table_uri, d) for d in docs]


def _command(table_id: str, table_uri: str, doc: Sequence[Any]) -> ProcessDocument:
    incarnation = _optional_str(doc[2]) if len(doc) > 2 else None
    return ProcessDocument(table_id, str(doc[0]), int(doc[1]), table_uri, incarnation)
