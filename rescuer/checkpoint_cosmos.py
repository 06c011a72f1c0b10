"""Rescuer checkpoints in a Cosmos DB container: the same compare-and-set as the SQL store, on the
item's etag.

One item per (table URI, rescuer name)::

    {"id": sha256(table_uri, rescuer_name), "pk": table_uri, "table_uri": ..., "rescuer_name": ...,
     "version": 12, "generation": 4, "last_pass_at": "...", "updated_at": "...", "details": {...}}

* ``id`` is a hash because a Cosmos id may not contain ``/`` and a table URI always does; the
  readable names are fields beside it.
* ``pk`` (the container's partition key, ``/pk``) is the table URI: one table's rescuers share a
  logical partition, so ``list(table_uri)`` is a single-partition query.
* The CAS: ``write(expected_generation=None)`` is a *create* (HTTP 409 when a racing rescuer
  created it first); ``write(expected_generation=g)`` reads the item, checks ``generation == g``
  and *replaces* it with ``If-Match: <etag>`` (HTTP 412 when anyone wrote in between). Either
  refusal is ``CheckpointConflictError``, exactly as the SQL store's ``UPDATE ... WHERE
  generation = g``. The generation is kept (not just the etag) because the ``CheckpointStore``
  protocol and ``outbox status`` speak generations. The etag seen by the last read of each
  checkpoint is remembered, so the usual read-then-write pass costs one query and one replace; a
  remembered etag that is out of date can only cause a 412 (a conflict), never a lost advance.
* Items are found by query, never by a point read: the local test server answers a read of a
  missing item with HTTP 500 instead of 404, and a query is one request on the real service too.
"""

from __future__ import annotations

import hashlib
import json
import threading
from datetime import datetime
from typing import Any

from outbox.core.clock import utc
from outbox.core.cosmos import NOT_FOUND, PRECONDITION_FAILED
from outbox.core.cosmos_adapter import CosmosAdapter
from outbox.core.errors import (
    CheckpointError,
    CheckpointUnavailableError,
)
from outbox.core.settings import Settings
from rescuer.checkpoint import Checkpoint, _conflict, _validate


def item_id(table_uri: str, rescuer_name: str) -> str:
    """The Cosmos id of one checkpoint: stable, and free of the characters ids may not hold."""
    raw = json.dumps([table_uri, rescuer_name], separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()


class CosmosCheckpointStore(CosmosAdapter):
    """Checkpoints in the container ``cosmos_checkpoint_container`` (created by ``outbox migrate``).

    ``container`` is an azure-cosmos ``ContainerProxy``; ``from_settings`` opens one. The SDK's
    client is thread-safe, so one store may serve rescuers racing in one process.
    """

    unavailable = CheckpointUnavailableError
    failed = CheckpointError
    subject = "the rescuer checkpoint"

    def __init__(self, container: Any, *, endpoint: str = "", client: Any = None) -> None:
        super().__init__(container, endpoint=endpoint, client=client)
        #: Where the checkpoints are, for ``outbox status`` (never a key).
        self.where = f"cosmos {endpoint} {getattr(container, 'container_link', '')}".strip()
        self._etags: dict[tuple[str, str], tuple[int, str]] = {}  # key -> (generation, etag)
        self._etags_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> CosmosCheckpointStore:
        store = cls._open(settings, settings.cosmos_checkpoint_container)
        store.where = (
            f"cosmos {settings.cosmos_endpoint} "
            f"{settings.cosmos_database}/{settings.cosmos_checkpoint_container}"
        )
        return store

    def _item(self, table_uri: str, rescuer_name: str) -> dict[str, Any] | None:
        rows = self._query(
            "SELECT * FROM c WHERE c.pk = @pk AND c.id = @id",
            {"@pk": table_uri, "@id": item_id(table_uri, rescuer_name)},
            pk=table_uri,
        )
        item = dict(rows[0]) if rows else None
        self._remember(table_uri, rescuer_name, item)
        return item

    def _remember(self, table_uri: str, rescuer_name: str, item: dict[str, Any] | None) -> None:
        key = (table_uri, rescuer_name)
        try:
            seen = (int(item["generation"]), str(item["_etag"])) if item is not None else None
        except (KeyError, TypeError, ValueError):
            seen = None
        with self._etags_lock:
            if seen is None:
                self._etags.pop(key, None)
            else:
                self._etags[key] = seen

    def _checkpoint(self, item: dict[str, Any]) -> Checkpoint:
        t_uri, name = str(item.get("table_uri")), str(item.get("rescuer_name"))
        try:
            details = item.get("details") or {}
            if not isinstance(details, dict):
                raise ValueError("details is not a JSON object")
            version = item.get("version")
            last = item.get("last_pass_at")
            cp = Checkpoint(
                t_uri,
                name,
                None if version is None else int(version),
                int(item["generation"]),
                utc(datetime.fromisoformat(last)) if last else None,
                utc(datetime.fromisoformat(item["updated_at"])),
                details,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(
                f"the rescuer checkpoint {name!r} for {t_uri} has unreadable fields ({e})",
                hint="run `outbox rescue --full` to sweep the table and store a fresh checkpoint",
            ) from e
        return _validate(cp)

    # --- the CheckpointStore protocol ---------------------------------------------------------

    def read(self, table_uri: str, rescuer_name: str) -> Checkpoint | None:
        item = self._item(table_uri, rescuer_name)
        return self._checkpoint(item) if item is not None else None

    def write(
        self,
        table_uri: str,
        rescuer_name: str,
        *,
        expected_generation: int | None,
        version: int | None,
        at: datetime,
        details: dict[str, Any],
    ) -> Checkpoint:
        generation = (expected_generation or 0) + 1
        at = utc(at)
        body = {
            "id": item_id(table_uri, rescuer_name),
            "pk": table_uri,
            "table_uri": table_uri,
            "rescuer_name": rescuer_name,
            "version": version,
            "generation": generation,
            "last_pass_at": at.isoformat(),
            "updated_at": at.isoformat(),
            # through JSON as the SQL store does, so both return the same details
            "details": json.loads(json.dumps(details, sort_keys=True, default=str)),
        }
        if expected_generation is None:
            done = self._create(body)  # None (409): a racing rescuer created it first
        else:
            etag = self._etag(table_uri, rescuer_name, expected_generation)
            # None (412, 404): moved or forgotten since that read
            done = self._replace(body, etag, stale=(PRECONDITION_FAILED, NOT_FOUND))
        if done is None:
            found = self.generation(table_uri, rescuer_name)
            raise _conflict(table_uri, rescuer_name, expected_generation, found)
        self._remember(table_uri, rescuer_name, dict(done))
        return Checkpoint(table_uri, rescuer_name, version, generation, at, at, dict(details))

    def _etag(self, table_uri: str, rescuer_name: str, expected: int) -> str:
        """The etag of the checkpoint at generation ``expected``: the one remembered from the last
        read, else read now (``CheckpointConflictError`` at another generation)."""
        with self._etags_lock:
            seen = self._etags.get((table_uri, rescuer_name))
        if seen is not None and seen[0] == expected:
            return seen[1]
        current = self._item(table_uri, rescuer_name)  # not read here at that generation
        found = _generation(current)
        if current is None or found != expected:
            raise _conflict(table_uri, rescuer_name, expected, found)
        return str(current["_etag"])

    def generation(self, table_uri: str, rescuer_name: str) -> int | None:
        return _generation(self._item(table_uri, rescuer_name))

    def list(self, table_uri: str | None = None) -> list[Checkpoint]:
        what = "listing rescuer checkpoints"
        if table_uri is None:
            rows = self._query("SELECT * FROM c", what=what)
        else:
            rows = self._query(
                "SELECT * FROM c WHERE c.pk = @pk", {"@pk": table_uri}, pk=table_uri, what=what
            )
        checkpoints = [self._checkpoint(dict(r)) for r in rows]
        return sorted(checkpoints, key=lambda c: (c.table_uri, c.rescuer_name))

    def forget(self, table_uri: str, rescuer_name: str) -> bool:
        if self._item(table_uri, rescuer_name) is None:
            return False
        try:
            self._call(
                "deleting the rescuer checkpoint",
                lambda: self._container.delete_item(
                    item_id(table_uri, rescuer_name), partition_key=table_uri
                ),
            )
        except CheckpointError as e:
            if self._refused(e, (NOT_FOUND,)):  # forgotten by someone else meanwhile
                return False
            raise
        finally:
            self._remember(table_uri, rescuer_name, None)
        return True


def _generation(item: dict[str, Any] | None) -> int | None:
    """The CAS generation alone, readable even when the rest of the item is damaged."""
    if item is None:
        return None
    try:
        return int(item["generation"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(
            f"the rescuer checkpoint {item.get('rescuer_name')!r} for {item.get('table_uri')} "
            "has no readable generation",
            hint="run `outbox rescue --forget` for that rescuer, then `outbox rescue --full`",
        ) from e
