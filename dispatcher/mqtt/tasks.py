"""A queue message as the gateway's task: its expiry, and its form for the MQTT transport.

Why apart from the gateway: both are rules about one message, with no state of the loop's.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from dispatcher.mqtt.gateway_options import EXPIRES_AT
from dispatcher.queue.messages import ReceivedMessage
from dispatcher.transports.base import TransportMessage
from outbox.core.clock import utc

log = logging.getLogger("outbox.gateway")


def expired(msg: ReceivedMessage, now: datetime, time_to_live: float | None) -> bool:
    """Past its ``expires_at`` header (ISO 8601, UTC when naive) or older than
    ``time_to_live`` seconds; an unreadable header is logged and ignored."""
    if time_to_live is not None and now >= msg.enqueued_at + timedelta(seconds=time_to_live):
        return True
    raw = msg.headers.get(EXPIRES_AT)
    if raw is None:
        return False
    try:
        return now >= utc(datetime.fromisoformat(str(raw)))
    except ValueError:
        log.warning("message %s: unreadable %s %r; ignored", msg.message_id, EXPIRES_AT, raw)
        return False


def transport_message(msg: ReceivedMessage, destination: str) -> TransportMessage:
    """What the transport publishes for ``msg`` (its headers as strings: MQTT user properties)."""
    return TransportMessage(
        message_id=msg.message_id,
        destination=destination,
        body=msg.body,
        subject=msg.subject,
        content_type=msg.content_type,
        session_id=msg.session_id,
        correlation_id=msg.correlation_id,
        headers={str(k): str(v) for k, v in msg.headers.items()},
    )
