"""Named console operators and the audit trail (issue 46, item 5), in the queue's database.

Why named tokens beside the console's own: one token shared by a team says nothing about who
requeued 100,000 messages, and cannot be taken back from one person without stopping the
console. Each operator gets a token of their own with a role (``operator`` may act,
``read-only`` may only unlock to be named), made and revoked with ``outbox operators``; the
database keeps only the token's SHA-256 (a stolen copy of the table unlocks nothing; the token
is shown once, when it is made). A revoked token's console sessions end at their next request
(the console checks the name on each request of a session it unlocked).

The audit trail records every action on the queue's contents taken through the console or
the CLI: who (a token's name, ``console`` for the console's own token, ``cli:<user>`` for the
command line), when, what, which ids (cut to a readable length: the count stays) and the
outcome. ``outbox audit`` and the console's Audit page show it, newest first.
"""

from __future__ import annotations

import getpass
import hashlib
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, insert, select, update

from migrations.sql.tables import audit as A
from migrations.sql.tables import console_tokens as T
from outbox.core.clock import Clock, utc
from outbox.core.errors import ValidationError

ROLES = ("operator", "read-only")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
#: The console's own token (printed at its start, or --token) acts under this name.
CONSOLE = "console"
#: A target longer than this is cut (the ids it names are counted, not all listed).
TARGET_CHARS = 2000
OUTCOME_CHARS = 512


@dataclass(frozen=True)
class Operator:
    name: str
    role: str
    created_at: datetime
    revoked_at: datetime | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: datetime
    actor: str
    action: str
    target: str
    outcome: str


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def cli_actor() -> str:
    """Who the command line acts as: ``cli:<the OS user>``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (a container)
        user = "unknown"
    return f"cli:{user}"[:128]


def ids_target(kind: str, ids: Sequence[Any]) -> str:
    """``kind`` and the ids, cut to ``TARGET_CHARS`` with how many were left out."""
    shown = ", ".join(str(i) for i in ids)
    text = f"{len(ids)} {kind}: {shown}"
    if len(text) <= TARGET_CHARS:
        return text
    return text[: TARGET_CHARS - 30].rsplit(", ", 1)[0] + f", … ({len(ids):,} in all)"


class Operators:
    """The named tokens (``database``: a ``dispatcher.queue.database.Database``)."""

    def __init__(self, database: Any, clock: Clock) -> None:
        self._db = database
        self._clock = clock

    def create(self, name: str, role: str = "operator") -> str:
        """A new token for ``name`` (returned once; only its digest is kept)."""
        if not isinstance(name, str) or not _NAME.match(name) or name == CONSOLE:
            raise ValidationError(
                f"invalid operator name {name!r}",
                hint="use 1-64 letters, digits, '.', '_', '@' or '-', starting with a letter or "
                f"digit (not {CONSOLE!r}, the console's own token)",
            )
        if role not in ROLES:
            raise ValidationError(f"invalid role {role!r}", hint=f"one of {', '.join(ROLES)}")
        token = secrets.token_urlsafe(24)
        row = {
            "name": name,
            "role": role,
            "token_sha256": _digest(token),
            "created_at": utc(self._clock.now()),
            "revoked_at": None,
        }
        with self._db.write("create an operator token") as conn:
            if conn.execute(select(T.c.name).where(T.c.name == name)).first() is not None:
                raise ValidationError(
                    f"operator {name!r} already exists (revoked ones keep their name)",
                    hint="choose another name (`outbox operators list` shows them)",
                )
            conn.execute(insert(T), row)
        return token

    def revoke(self, name: str) -> bool:
        """Revoke ``name``'s token (its console sessions end at their next request); False when
        there is no such active operator."""
        with self._db.write("revoke an operator token") as conn:
            done = conn.execute(
                update(T)
                .where(T.c.name == name, T.c.revoked_at.is_(None))
                .values(revoked_at=utc(self._clock.now()))
            ).rowcount
        return bool(done)

    def list(self) -> list[Operator]:
        with self._db.read("list operators") as conn:
            rows = conn.execute(select(T).order_by(T.c.name)).mappings().all()
        return [_operator(r) for r in rows]

    def find(self, token: str | None) -> Operator | None:
        """The active operator whose token this is; None for any other token."""
        if not token:
            return None
        with self._db.read("check an operator token") as conn:
            row = (
                conn.execute(
                    select(T).where(T.c.token_sha256 == _digest(token), T.c.revoked_at.is_(None))
                )
                .mappings()
                .first()
            )
        return None if row is None else _operator(row)

    def is_active(self, name: str) -> bool:
        with self._db.read("check an operator") as conn:
            found = conn.execute(
                select(T.c.name).where(T.c.name == name, T.c.revoked_at.is_(None))
            ).first()
        return found is not None


class Audit:
    """The audit trail (``database``: a ``dispatcher.queue.database.Database``)."""

    def __init__(self, database: Any, clock: Clock) -> None:
        self._db = database
        self._clock = clock

    def record(self, actor: str, action: str, target: str, outcome: str) -> None:
        row = {
            "at": utc(self._clock.now()),
            "actor": actor[:128],
            "action": action[:64],
            "target": target[:TARGET_CHARS],
            "outcome": outcome[:OUTCOME_CHARS],
        }
        with self._db.write("record an audit entry") as conn:
            conn.execute(insert(A), row)

    def prune(self, before: datetime) -> int:
        """Delete the rows recorded before ``before`` (``audit_retention``); how many went."""
        with self._db.write("prune the audit trail") as conn:
            return int(conn.execute(delete(A).where(A.c.at < before)).rowcount)

    def page(self, *, before: int | None = None, limit: int = 50) -> list[AuditEntry]:
        """Newest first, below id ``before`` when given."""
        stmt = select(A).order_by(A.c.id.desc()).limit(limit)
        if before is not None:
            stmt = stmt.where(A.c.id < before)
        with self._db.read("read the audit trail") as conn:
            rows = conn.execute(stmt).mappings().all()
        return [
            AuditEntry(
                int(r["id"]),
                utc(r["at"]),
                r["actor"],
                r["action"],
                r["target"],
                r["outcome"],
            )
            for r in rows
        ]


def _operator(r: Any) -> Operator:
    revoked = r["revoked_at"]
    return Operator(
        r["name"], r["role"], utc(r["created_at"]), None if revoked is None else utc(revoked)
    )


def record_cli(queue: Any, action: str, target: str, outcome: str) -> None:
    """Record a command-line action in the audit trail of ``queue``'s database; a queue with no
    SQL database of its own (another backend's dead letters) has no trail to write to."""
    database = getattr(queue, "database", None)
    if database is None:
        return
    from outbox.core.clock import SystemClock

    Audit(database, SystemClock()).record(cli_actor(), action, target, outcome)
