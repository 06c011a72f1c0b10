"""A consumer inbox in a Cosmos DB container: a handled message id is a *conditional create*.

One item per (consumer, message id)::

    {"id": sha256(consumer, message_id), "pk": <the same>, "consumer": ..., "message_id": ...,
     "handled_at": "..."}

* ``create_item`` succeeds for the first recorder; a repeat gets HTTP 409 (``record`` -> False).
  Cosmos DB checks id uniqueness per logical partition, so the id and the partition key are the
  same hash: uniqueness per (consumer, message id), items spread over every partition, and each
  lookup is a single-partition query. The id is a hash because ids may not contain ``/``.
* ``handled`` is a query, not a point read: the local test server answers a read of a missing
  item with HTTP 500 instead of 404.

What is and isn't atomic, compared with the SQL inbox: the SQL inbox commits its record, the
handler's SQL work and the message's completion in ONE transaction (exactly-once effect in that
database). A Cosmos inbox cannot join a SQL transaction, so the consumer runs: check -> handler ->
record -> complete, each its own step. A crash between any two steps never loses a message:

* before the record: the message is redelivered and the handler runs again (at-least-once);
* after the record, before the completion: the redelivery is dropped by the inbox (dedup), which
  is right because the handler had succeeded.

So the handler must tolerate running twice for one message id in the first case (idempotent
effects, or effects in the same Cosmos partition guarded by their own etags). A handler that
takes a SQL ``Connection`` needs the SQL inbox; the consumer refuses that pairing.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from outbox.core.clock import utc
from outbox.core.cosmos import CosmosAdapter, status_code
from outbox.core.errors import QueueError, QueueUnavailableError
from outbox.core.settings import Settings

_CONFLICT = 409


def item_id(consumer: str, message_id: str) -> str:
    raw = json.dumps([consumer, message_id], separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()


class CosmosInbox(CosmosAdapter):
    """Handled ids of ``consumer`` in the container ``cosmos_inbox_container`` (partition key
    ``/pk``, created by ``outbox migrate``). ``container`` is an azure-cosmos ``ContainerProxy``.

    Records are never deleted by the framework; give the container a default time-to-live
    (``defaultTtl``) longer than any redelivery or resend window if it should not grow forever.
    """

    unavailable = QueueUnavailableError
    failed = QueueError

    def __init__(
        self, container: Any, consumer: str, *, endpoint: str = "", client: Any = None
    ) -> None:
        super().__init__(container, endpoint=endpoint, client=client)
        self.consumer = consumer

    @classmethod
    def from_settings(cls, settings: Settings, consumer: str) -> CosmosInbox:
        client, container = cls._open(settings, settings.cosmos_inbox_container)
        return cls(container, consumer, endpoint=settings.cosmos_endpoint, client=client)

    def handled(self, message_id: str) -> bool:
        key = item_id(self.consumer, message_id)

        def query() -> list[Any]:
            return list(
                self._container.query_items(
                    "SELECT c.id FROM c WHERE c.pk = @pk AND c.id = @pk",
                    parameters=[{"name": "@pk", "value": key}],
                    partition_key=key,
                )
            )

        try:
            return bool(self._once_warm(query))
        except Exception as e:
            raise self._error("reading the inbox", e) from e

    def record(self, message_id: str, *, at: datetime) -> bool:
        key = item_id(self.consumer, message_id)
        body = {
            "id": key,
            "pk": key,
            "consumer": self.consumer,
            "message_id": message_id,
            "handled_at": utc(at).isoformat(),
        }
        try:
            self._once_warm(lambda: self._container.create_item(body))
        except Exception as e:
            if status_code(e) == _CONFLICT:
                return False
            raise self._error("recording a handled message in the inbox", e) from e
        return True
