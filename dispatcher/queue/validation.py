"""Input checks for the queue, done before any SQL runs so the error names the bad value."""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Any

from outbox.core.errors import MessageTooLargeError, ValidationError
from outbox.core.model import encode_headers

# Service Bus entity names: letters, digits, '.', '-', '_', '/'; start and end with a letter or
# digit; at most 260 characters.
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,258}[A-Za-z0-9])?$")
MAX_ID = 128


def queue_name(name: object) -> str:
    if not isinstance(name, str) or not _QUEUE_NAME.match(name):
        raise ValidationError(
            f"invalid queue name {name!r}",
            hint="use 1-260 letters, digits, '.', '-', '_' or '/', starting and ending with a "
            "letter or digit",
        )
    return name


def identifier(kind: str, value: object, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_ID:
        raise ValidationError(
            f"invalid {kind} {value!r}", hint=f"use a non-empty string of at most {MAX_ID} chars"
        )
    return value


def body(data: object, message_id: str, max_bytes: int) -> bytes:
    """The body as bytes; ``None`` and empty are an empty body (as ``ServiceBusMessage`` takes)."""
    if data is None:
        data = b""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ValidationError(
            f"message {message_id}: body must be bytes or str, not {type(data).__name__}",
            hint="serialize the payload (e.g. json.dumps(...).encode()) before sending",
        )
    raw = bytes(data)  # empty is fine: Service Bus takes it, and a signal may be all headers
    if len(raw) > max_bytes:
        raise MessageTooLargeError(
            f"message {message_id}: body is {len(raw)} bytes, over the {max_bytes}-byte limit",
            hint="store large payloads elsewhere and send a reference, or raise max_message_bytes",
        )
    return raw


def headers(value: object, message_id: str) -> str:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValidationError(
            f"message {message_id}: headers must be a dict with string keys",
            hint="pass headers={'name': 'value'}",
        )
    try:
        return encode_headers(value)
    except (TypeError, ValueError) as e:
        raise ValidationError(
            f"message {message_id}: headers are not JSON-serializable ({e})",
            hint="use str, int, float, bool or None header values",
        ) from e


def delay(seconds: object) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise ValidationError(
            f"invalid delay {seconds!r}", hint="use a number of seconds that is 0 or more"
        )
    return float(seconds)


def aware(kind: str, value: object) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise ValidationError(
            f"{kind} must be a timezone-aware datetime, got {value!r}",
            hint="use datetime.now(UTC) + timedelta(...)",
        )
    return value


def lock_token(token: object) -> str:
    try:
        if not isinstance(token, str):
            raise ValueError(token)
        return str(uuid.UUID(token))
    except ValueError as e:
        raise ValidationError(
            f"invalid lock token {token!r}",
            hint="settle with the lock_token of a message returned by receive (a UUID)",
        ) from e


def positive(kind: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValidationError(f"{kind} must be a positive integer, got {value!r}")
    return value
