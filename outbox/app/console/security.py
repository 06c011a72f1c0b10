"""What keeps the console safe on a shared machine: a token for every change, CSRF-proof forms,
a read-only mode, no page from another origin, and no secret on any page.

Why a token and a session rather than accounts: the console is an operator's tool on
127.0.0.1, like Jupyter's; whoever started it holds the token (printed once at start, or given
in ``OUTBOX_CONSOLE_TOKEN``) and unlocks the actions of one browser with it. Reading needs no
token: the pages show what ``outbox status`` and ``outbox dead-letters`` show to anyone who can
run them on this machine.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from typing import Any

#: The session keys.
UNLOCKED = "unlocked"
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


def trusted_hosts(host: str) -> list[str] | None:
    """The Host headers to accept: on a loopback address only the loopback names, so a web page
    elsewhere cannot reach the console through a DNS name rebound to 127.0.0.1. None (any) when
    bound to another address: the operator chose the network."""
    if is_loopback(host):
        return ["127.0.0.1", "localhost", "::1", "[::1]"]
    return None


@dataclass(frozen=True)
class Refusal:
    status: int
    title: str
    detail: str


#: Why a change is refused: the three answers of ``check_action``.
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


def from_this_console(session: Any, form: Any) -> bool:
    """Whether ``form`` carries this session's CSRF token."""
    expected = session.get(CSRF)
    return bool(expected) and same(form.get(CSRF), expected)


def check_action(session: Any, form: Any, *, read_only: bool) -> Refusal | None:
    """Why a change must not run (None: it may): read-only mode, a form without this session's
    CSRF token, a browser that has not unlocked the console with the token."""
    if read_only:
        return READ_ONLY
    if not from_this_console(session, form):
        return FOREIGN_FORM
    if not session.get(UNLOCKED):
        return LOCKED
    return None
