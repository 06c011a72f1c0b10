"""The claim log port: one entry per unit of work (a message, or a session), shared by the
consumers of both regions, moved pending -> working -> completed | failed with optimistic
concurrency.

Why a port: the log must be strongly consistent and reachable from both regions (Cosmos DB with
strong consistency, or one SQL database); the consumer's protocol is the same over either, and the
contract suite (``outbox.testing.contracts.claim_log``) says what both must do.

Order within a session: ``register`` gives each message key a *position* in its session, in
registration order (the sender registers before sending, so positions follow the outbox's order).
``blocker`` names the earliest unfinished entry before a position: a message may start only when
there is none, so region B cannot start message 2 while region A is still on message 1, even when
B's copy of message 1 is gone (dead-lettered) or never arrived. Positions only ever finish (an
unfinished entry never reappears below a finished one), so "check, then claim" is race free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable


def message_key(queue: str, message_id: str) -> str:
    """The claim key of one message of ``queue`` (per-message claims)."""
    return f"{queue}|{message_id}"


def session_key(queue: str, session_id: str) -> str:
    """The claim log's name for a session of ``queue`` (per-session claims, and positions)."""
    return f"{queue}|{session_id}"


class ClaimStatus(StrEnum):
    PENDING = "pending"  # registered or released: anyone may take it
    WORKING = "working"  # an owner holds it until lease_until
    COMPLETED = "completed"  # handled: it never runs again
    FAILED = "failed"  # dead-lettered: it never runs again either

    @property
    def finished(self) -> bool:
        return self in (ClaimStatus.COMPLETED, ClaimStatus.FAILED)


@dataclass(frozen=True, slots=True)
class ClaimEntry:
    key: str
    status: ClaimStatus
    owner: str | None
    lease_until: datetime | None
    attempts: int  # how many times it was taken (moved to working)
    updated_at: datetime
    session: str | None = None
    position: int | None = None  # order within ``session`` (registered keys only)

    def live(self, at: datetime) -> bool:
        """Working under a lease that has not expired at ``at``."""
        return (
            self.status is ClaimStatus.WORKING
            and self.lease_until is not None
            and self.lease_until > at
        )


@dataclass(frozen=True, slots=True)
class Taken:
    """The outcome of ``claim``: ``won`` means the caller now owns ``entry`` (working)."""

    won: bool
    entry: ClaimEntry


@runtime_checkable
class ClaimLog(Protocol):
    """Claims shared by the consumers of every region. Every method is one atomic step."""

    def register(self, session: str, keys: Sequence[str], *, at: datetime) -> None:
        """Create a pending entry for each key not yet known, positioned after every key of
        ``session`` registered before, in the given order. Idempotent (a known key keeps its
        position)."""
        ...

    def claim(
        self, key: str, owner: str, *, lease: timedelta, at: datetime, session: str | None = None
    ) -> Taken:
        """Take ``key`` for ``owner`` until ``at + lease``.

        Won: the key was unknown (created working), pending, working under an expired lease, or
        already ``owner``'s. Lost (``won=False``, the current entry returned): working under
        another owner's live lease, completed or failed, or another claimer was faster.
        """
        ...

    def renew(self, key: str, owner: str, *, lease: timedelta, at: datetime) -> ClaimEntry:
        """Extend ``owner``'s working claim to ``at + lease``; ``ClaimLostError`` if not held."""
        ...

    def complete(self, key: str, owner: str, *, at: datetime) -> ClaimEntry:
        """``owner``'s working claim -> completed; ``ClaimLostError`` if not held."""
        ...

    def fail(self, key: str, owner: str, *, at: datetime) -> ClaimEntry:
        """``owner``'s working claim -> failed (dead-lettered); ``ClaimLostError`` if not held."""
        ...

    def release(self, key: str, owner: str, *, at: datetime) -> ClaimEntry:
        """``owner``'s working claim -> pending, so any region may take it now (a retryable
        handler failure, a consumer stopping); ``ClaimLostError`` if not held."""
        ...

    def read(self, key: str) -> ClaimEntry | None:
        """The entry, or None when the key is unknown."""
        ...

    def blocker(self, session: str, position: int) -> ClaimEntry | None:
        """The earliest entry of ``session`` before ``position`` that is not finished."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class BoundedClaimLog(Protocol):
    """A claim log that can give up quickly: what the sender's write path needs.

    ``bounded(timeout)`` is the same log (the same entries) whose every call gives up after about
    ``timeout`` seconds with ``ClaimLogUnavailableError`` instead of waiting for a lock, a busy
    database or a silent server. ``GeoReplicatedTransport`` registers through it, so a claim log
    that cannot be reached fails a send quickly (retryably) instead of holding up the caller of a
    commit. Closing the view closes only what it opened itself. Optional: a claim log without it
    is used as it is, with whatever waits it has.
    """

    def bounded(self, timeout: float) -> ClaimLog: ...


class OwnedMoves:
    """``complete``, ``fail`` and ``release`` for a backend: each is a move of a claim its owner
    holds, differing only in the fields it sets; the backend supplies ``_move`` (its CAS)."""

    def _move(
        self, action: str, key: str, owner: str, at: datetime, changes: dict[str, Any]
    ) -> ClaimEntry:
        raise NotImplementedError

    def complete(self, key: str, owner: str, *, at: datetime) -> ClaimEntry:
        return self._move(
            "complete", key, owner, at, {"status": ClaimStatus.COMPLETED.value, "lease_until": None}
        )

    def fail(self, key: str, owner: str, *, at: datetime) -> ClaimEntry:
        return self._move(
            "fail", key, owner, at, {"status": ClaimStatus.FAILED.value, "lease_until": None}
        )

    def release(self, key: str, owner: str, *, at: datetime) -> ClaimEntry:
        return self._move(
            "release",
            key,
            owner,
            at,
            {"status": ClaimStatus.PENDING.value, "owner": None, "lease_until": None},
        )
