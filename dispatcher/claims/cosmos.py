"""The claim log in a Cosmos DB container (``azure-cosmos``): a claim is a *conditional create*
(HTTP 409 when the item exists), every later move a *replace with the etag* read (HTTP 412 when
anyone wrote in between). With the account's strong consistency, both regions see one log.

Items, in a container partitioned on ``/pk``::

    claim:   {"id": h(key), "pk": h(key), "kind": "claim", "key", "session", "position",
              "status", "owner", "lease_until", "attempts", "updated_at"}
    counter: {"id": "s-" + h(session), "pk": <the same>, "kind": "session", "session",
              "next_position"}

``h`` is a sha256 (ids may not contain ``/``). Items are found by query, never by point read: the
local test server answers a read of a missing item with HTTP 500 instead of 404
(``outbox.core.cosmos``). ``register`` reserves positions on the counter (etag CAS) *before* it
creates the entries, so a crash in between leaves a gap, never two keys at one position; gaps
block nothing (``blocker`` looks for unfinished entries, not for missing numbers). ``blocker`` is
a cross-partition query (entries are spread by key, so a hot session is no hot partition).

``bounded(timeout)`` is the same log for the sender's write path (docs/geo.md,
``claim_log_timeout``): every request carries the SDK's ``timeout`` (an absolute limit over the
request and the SDK's own retries) *and* ``read_timeout`` at ``timeout``. Both are needed: the
absolute ``timeout`` only shortens connecting, so a request on an open connection to a server that
stopped answering waits the SDK's read timeout (65 s by default) whatever ``timeout`` says.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from dispatcher.claims.ports import ClaimEntry, ClaimStatus, OwnedMoves, Taken
from outbox.core.clock import utc
from outbox.core.cosmos_adapter import CosmosAdapter
from outbox.core.errors import ClaimLogError, ClaimLogUnavailableError, ClaimLostError
from outbox.core.settings import Settings

#: Attempts at reserving positions on a session counter that other registrants keep moving.
_CAS_ATTEMPTS = 20
#: Claims one ``prune`` query selects at most.
_PRUNE_CHUNK = 500


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _when(text: str | None) -> datetime | None:
    return None if text is None else utc(datetime.fromisoformat(text))


def _entry(item: dict[str, Any]) -> ClaimEntry:
    position = item.get("position")
    return ClaimEntry(
        key=str(item["key"]),
        status=ClaimStatus(item["status"]),
        owner=item.get("owner"),
        lease_until=_when(item.get("lease_until")),
        attempts=int(item["attempts"]),
        updated_at=utc(datetime.fromisoformat(item["updated_at"])),
        session=item.get("session"),
        position=None if position is None else int(position),
    )


class CosmosClaimLog(CosmosAdapter, OwnedMoves):
    """A ``ClaimLog`` in ``container`` (an azure-cosmos ``ContainerProxy``, partition key
    ``/pk``). ``prune`` (``outbox maintain``, ``claim_retention``) deletes finished claims;
    counters and live claims stay."""

    unavailable = ClaimLogUnavailableError
    failed = ClaimLogError
    subject = "the claim log"
    #: seconds each call may take (``bounded``); None: the client's own timeouts
    timeout: float | None = None

    @classmethod
    def from_settings(cls, settings: Settings, container: str | None = None) -> CosmosClaimLog:
        """The claim log in ``container`` (default: the ``cosmos_claims_container`` setting,
        which ``outbox migrate`` creates)."""
        return cls._open(settings, container or settings.cosmos_claims_container)

    def bounded(self, timeout: float) -> CosmosClaimLog:
        """This log (the same container and client) with every request giving up after about
        ``timeout`` seconds; the sender's write path. Closing it leaves the client open."""
        if timeout <= 0:
            raise ClaimLogError(f"claim log timeout {timeout!r} must be positive")
        view = copy.copy(self)  # shares the container and the first-request guard
        view._client = None  # the client stays this log's to close
        view.timeout = timeout
        view._request = {"timeout": timeout, "read_timeout": timeout}
        return view

    # --- the port -------------------------------------------------------------------------

    def read(self, key: str) -> ClaimEntry | None:
        item = self._find(_h(key))
        return None if item is None else _entry(item)

    def register(self, session: str, keys: Sequence[str], *, at: datetime) -> None:
        new = [k for k in dict.fromkeys(keys) if self._find(_h(k)) is None]
        if not new:
            return
        first = self._reserve(session, len(new))
        for i, key in enumerate(new):
            self._create(
                {
                    "id": _h(key),
                    "pk": _h(key),
                    "kind": "claim",
                    "key": key,
                    "session": session,
                    "position": first + i,
                    "status": ClaimStatus.PENDING.value,
                    "owner": None,
                    "lease_until": None,
                    "attempts": 0,
                    "updated_at": utc(at).isoformat(),
                }
            )  # None (409): registered meanwhile by someone else, who gave it its position

    def _reserve(self, session: str, count: int) -> int:
        """Positions ``first .. first + count - 1`` of ``session``, taken on its counter."""
        cid = "s-" + _h(session)
        for _ in range(_CAS_ATTEMPTS):
            counter = self._find(cid)
            if counter is None:
                body = {"id": cid, "pk": cid, "kind": "session", "session": session}
                if self._create({**body, "next_position": count}) is not None:
                    return 0
                continue
            first = int(counter["next_position"])
            if self._amend(counter, next_position=first + count) is not None:
                return first
        raise ClaimLogUnavailableError(
            f"registering claims of session {session!r}: the position counter kept changing "
            f"under {_CAS_ATTEMPTS} attempts",
            hint="retry the send; many senders of one session at once cause this",
        )

    def claim(
        self, key: str, owner: str, *, lease: timedelta, at: datetime, session: str | None = None
    ) -> Taken:
        until = utc(at + lease).isoformat()
        body = {
            "id": _h(key),
            "pk": _h(key),
            "kind": "claim",
            "key": key,
            "session": session,
            "position": None,
            "status": ClaimStatus.WORKING.value,
            "owner": owner,
            "lease_until": until,
            "attempts": 1,
            "updated_at": utc(at).isoformat(),
        }
        if self._create(body) is not None:
            return Taken(True, _entry(body))
        item = self._find(_h(key))  # 409: someone created it first
        if item is None:  # created and gone (an operator deleted it): try again once
            return Taken(self._create(body) is not None, _entry(body))
        current = _entry(item)
        mine = current.status is ClaimStatus.WORKING and current.owner == owner
        free = current.status is ClaimStatus.PENDING or (
            current.status is ClaimStatus.WORKING and not current.live(at)
        )
        if not (mine or free):
            return Taken(False, current)
        done = self._amend(
            item,
            status=ClaimStatus.WORKING.value,
            owner=owner,
            lease_until=until,
            attempts=current.attempts + (0 if mine else 1),
            updated_at=utc(at).isoformat(),
        )
        if done is None:  # 412: another claimer was faster
            latest = self.read(key)
            return Taken(False, latest if latest is not None else current)
        return Taken(True, _entry(done))

    def _move(
        self, action: str, key: str, owner: str, at: datetime, changes: dict[str, Any]
    ) -> ClaimEntry:
        for _ in range(_CAS_ATTEMPTS):
            item = self._find(_h(key))
            current = None if item is None else _entry(item)
            if (
                item is None
                or current is None
                or not (current.status is ClaimStatus.WORKING and current.owner == owner)
            ):
                state = "unknown" if current is None else f"{current.status} by {current.owner}"
                raise ClaimLostError(
                    f"cannot {action} claim {key!r}: {owner} does not hold it (it is {state})",
                    hint="the lease expired and another consumer took over; settle nothing",
                )
            done = self._amend(item, updated_at=utc(at).isoformat(), **changes)
            if done is not None:
                return _entry(done)
        raise ClaimLogUnavailableError(f"cannot {action} claim {key!r}: it kept changing")

    def renew(self, key: str, owner: str, *, lease: timedelta, at: datetime) -> ClaimEntry:
        return self._move("renew", key, owner, at, {"lease_until": utc(at + lease).isoformat()})

    def prune(self, before: datetime, *, limit: int | None = None) -> int:
        """Delete the claims completed or failed before ``before`` (``claim_retention``, from
        ``outbox maintain``), at most ``limit`` (None: all): cross-partition queries of
        ``_PRUNE_CHUNK`` items, then a delete per item with ``If-Match: <etag>`` (an item moved
        since the query is left). As ``SqlClaimLog.prune``: a finished claim blocks nothing,
        only a late copy of its message would run again; counters and live claims stay."""
        where = (
            "c.kind = 'claim' AND (c.status = 'completed' OR c.status = 'failed') "
            "AND c.updated_at < @before"  # ISO 8601 UTC texts of one format order as times do
        )
        done = 0
        while limit is None or done < limit:
            chunk = _PRUNE_CHUNK if limit is None else min(_PRUNE_CHUNK, limit - done)
            found = self._query(
                f"SELECT TOP {chunk} c.id, c._etag FROM c WHERE {where}",
                {"@before": utc(before).isoformat()},
            )
            gone = sum(self._delete_if_unchanged(item, "pruning the claim log") for item in found)
            done += gone
            if len(found) < chunk or gone == 0:
                return done
        return done

    def blocker(self, session: str, position: int) -> ClaimEntry | None:
        found = self._query(
            "SELECT * FROM c WHERE c.kind = 'claim' AND c.session = @s "
            "AND c.position < @p AND (c.status = 'pending' OR c.status = 'working')",
            {"@s": session, "@p": position},
        )
        if not found:
            return None
        return _entry(min(found, key=lambda item: int(item["position"])))
