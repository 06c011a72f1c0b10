"""The ``ReplayMessages`` command: one chunk of an ``outbox replay``, as the planner
(``outbox.app.replay``) enqueues it and the worker (``dispatcher.replay_handler``) reads it.

Why apart from the handler: the planner writes it and the worker reads it; its shape (the body,
the command id, the session) is the contract between the two, whatever either does with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from outbox.core.errors import ValidationError

if TYPE_CHECKING:
    from dispatcher.queue.messages import QueueMessage

REPLAY_SUBJECT = "ReplayMessages"


@dataclass(frozen=True, slots=True)
class ReplayMessages:
    """One chunk of a replay: message ids of one bucket, first written in ``from_version`` to
    ``to_version`` (both inclusive)."""

    table: str  # the table id
    replay: str
    chunk: int
    bucket: int
    from_version: int
    to_version: int
    message_ids: tuple[str, ...]
    new_ids: bool = False

    @property
    def command_id(self) -> str:
        return f"rp-{self.replay}-{self.chunk}"

    @property
    def session_id(self) -> str:
        return f"replay:{self.replay}:{self.bucket}"

    def to_json(self) -> str:
        return json.dumps(
            {
                "table": self.table,
                "replay": self.replay,
                "chunk": self.chunk,
                "bucket": self.bucket,
                "from_version": self.from_version,
                "to_version": self.to_version,
                "message_ids": list(self.message_ids),
                "new_ids": self.new_ids,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, body: str | bytes) -> ReplayMessages:
        try:
            data: Any = json.loads(body)
            return cls(
                table=str(data["table"]),
                replay=str(data["replay"]),
                chunk=int(data["chunk"]),
                bucket=int(data["bucket"]),
                from_version=int(data["from_version"]),
                to_version=int(data["to_version"]),
                message_ids=tuple(str(m) for m in data["message_ids"]),
                new_ids=bool(data.get("new_ids", False)),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ValidationError(
                f"malformed ReplayMessages command: {e}",
                hint="replay commands are written by `outbox replay`; requeue none by hand",
            ) from e

    def to_queue_message(self) -> QueueMessage:
        from dispatcher.queue.messages import QueueMessage

        return QueueMessage(
            body=self.to_json(),
            message_id=self.command_id,
            session_id=self.session_id,
            subject=REPLAY_SUBJECT,
            content_type="application/json",
        )
