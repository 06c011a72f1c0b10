"""What keeps the console safe on a shared machine: a token for every change, CSRF-proof forms,
a read-only mode, no page from another origin, and no secret on any page.

Why a token and a session rather than accounts: the console is an operator's tool on
127.0.0.1, like Jupyter's; whoever started it holds the token (printed once at start, or given
in ``OUTBOX_CONSOLE_TOKEN``) and unlocks the actions of one browser with it. Reading needs no
token: the pages show what ``outbox status`` and ``outbox dead-letters`` show to anyone who can
run them on this machine.

Why the unlocked state lives on the server (``Sessions``) and not in the cookie: a signed
cookie saying "unlocked" is a bearer copy, so every copy of it taken before Lock would stay
unlocked until the console stopped. The cookie holds only the id of a server-side session;
Lock removes that session, and a restart forgets them all.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from outbox.core.clock import Clock, utc

#: The keys of the signed session cookie: the id of the server-side session it unlocked (if
#: any), and the CSRF token of its forms.
SESSION_ID = "sid"
CSRF = "csrf"

#: Every page's Content-Security-Policy: nothing but this origin's own style sheet and inline
#: SVG; no script at all, no frame, forms post only here.
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def new_token() -> str:
    return secrets.token_urlsafe(24)


def same(given: str | None, expected: str) -> bool:
    """Constant-time comparison (a token must not leak through timing)."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(host: str) -> str:
    """The name in a Host header without its port: ``[::1]:8765`` is ``[::1]`` (an IPv6 literal
    keeps its brackets; cutting at the first colon would leave ``[``). Empty when anything but a
    port follows the brackets."""
    if host.startswith("["):
        name, bracket, rest = host.partition("]")
        if not bracket or (rest and not (rest[0] == ":" and rest[1:].isdigit())):
            return ""
        return (name + bracket).lower()
    return host.partition(":")[0].lower()


#: The loopback names every request names (the rest go through ``is_loopback``).
_USUAL_LOOPBACK = frozenset({"127.0.0.1", "localhost", "[::1]"})


def host_allowed(host: str, *, loopback_only: bool) -> bool:
    """Whether to answer a request for ``host`` (the Host header, as Werkzeug validated it).
    ``loopback_only`` (the console listens on a loopback address): only ``localhost`` and
    loopback IP literals, so a web page elsewhere cannot reach the console through a DNS name
    rebound to 127.0.0.1 (an IP literal cannot be an attacker's name). Otherwise any host: the
    operator chose the network.

    Why not Flask's ``TRUSTED_HOSTS``: Werkzeug cuts each trusted name at its first colon, so no
    IPv6 literal can be trusted there (``[::1]`` becomes ``[``), and ``--host ::1`` answered 400
    at the address it printed."""
    if not loopback_only:
        return True
    name = host_name(host)
    return name in _USUAL_LOOPBACK or is_loopback(name)


def cookie_name(port: int) -> str:
    """The session cookie's name, one per console: browsers keep cookies per host, not per port,
    so two consoles on one host sharing a name overwrite each other's (and log each other out)."""
    return f"outbox_console_{port}"


@dataclass(frozen=True)
class UnlockedSession:
    """A browser unlocked with a token, as the console remembers it: its id (all the cookie
    holds), who unlocked it (``actor``: a named operator, or ``console`` for the console's own
    token), with which role, and whether the name is an operator's in the database (whose
    revocation ends the session)."""

    id: str
    unlocked_at: datetime
    actor: str = "console"
    role: str = "operator"
    named: bool = False


class Sessions:
    """The unlocked sessions of this console, in its memory: Lock removes one, a restart forgets
    them all (which it must: a cookie from an earlier run unlocks nothing). A dict lookup per
    action, no database read. Thread safe (Werkzeug's server is threaded)."""

    #: At most this many at once; unlocking one more forgets the oldest (only the token's
    #: holder can unlock, so this bounds memory, not an attack).
    LIMIT = 1000

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._open: dict[str, UnlockedSession] = {}

    def open(
        self, actor: str = "console", role: str = "operator", *, named: bool = False
    ) -> UnlockedSession:
        unlocked = UnlockedSession(
            secrets.token_urlsafe(32), utc(self._clock.now()), actor, role, named
        )
        with self._lock:
            while len(self._open) >= self.LIMIT:
                del self._open[next(iter(self._open))]
            self._open[unlocked.id] = unlocked
        return unlocked

    def find(self, session_id: object) -> UnlockedSession | None:
        if not isinstance(session_id, str):
            return None
        with self._lock:
            return self._open.get(session_id)

    def close(self, session_id: object) -> None:
        if isinstance(session_id, str):
            with self._lock:
                self._open.pop(session_id, None)


@dataclass(frozen=True)
class Refusal:
    status: int
    title: str
    detail: str


#: Why a change is refused: the answers of ``check_action``.
READ_ONLY = Refusal(
    403,
    "The console is read-only",
    "It was started with --read-only: nothing can be changed from it. Use "
    "`outbox dead-letters requeue|purge`, or start `outbox console` without --read-only.",
)
FOREIGN_FORM = Refusal(
    400,
    "This form did not come from this console",
    "Its CSRF token is missing or stale (the console restarted, or another site sent it). "
    "Reload the page and try again.",
)
LOCKED = Refusal(
    403,
    "This action needs the console token",
    "Unlock the console with the token `outbox console` printed when it started (or the one "
    "given in --token / OUTBOX_CONSOLE_TOKEN), then try again.",
)


READ_ONLY_TOKEN = Refusal(
    403,
    "This token may not change anything",
    "The browser was unlocked with a read-only operator's token. Unlock it with an operator's "
    "token (`outbox operators create NAME --role operator`) to act.",
)


def from_this_console(session: Any, form: Any) -> bool:
    """Whether ``form`` carries this session's CSRF token."""
    expected = session.get(CSRF)
    return bool(expected) and same(form.get(CSRF), expected)


def check_action(session: Any, form: Any, *, read_only: bool, sessions: Sessions) -> Refusal | None:
    """Why a change must not run (None: it may): read-only mode, a form without this session's
    CSRF token, a browser whose cookie names no session this console holds unlocked (never
    unlocked, locked since, or from before a restart)."""
    if read_only:
        return READ_ONLY
    if not from_this_console(session, form):
        return FOREIGN_FORM
    unlocked = sessions.find(session.get(SESSION_ID))
    if unlocked is None:
        return LOCKED
    if unlocked.role != "operator":
        return READ_ONLY_TOKEN
    return None
