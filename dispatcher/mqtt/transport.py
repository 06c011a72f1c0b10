"""``MqttTransport``: MQTT as an ordinary outbox destination (QoS 1, settled on PUBACK).

A ``TransportMessage`` becomes one MQTT 5 publish: the topic comes from a template
(``{destination}``, and ``{session}`` for per-device topics), the body is the payload, and the
fields ride as MQTT 5 properties: ``content_type`` as Content Type, ``correlation_id`` as
Correlation Data, and ``message_id``, ``subject``, ``session_id`` and the headers as User
Properties (the first three under the reserved names in ``RESERVED``). ``from_mqtt`` reads them
back, for a consumer and for the tests.

What MQTT cannot do is refused up front, as ``PermanentTransportError`` naming the message, before
anything of the batch is published: a destination or session that would make an invalid or
ambiguous topic, a header with a reserved name, a ``scheduled_at`` in the future (MQTT has no
scheduled delivery). A batch is therefore all-or-nothing for such refusals, but not for a broker
that fails midway (an earlier publish may already be out: ``atomic_batches = False``); a re-send
with the same ids is the caller's remedy, and a consumer drops repeats by ``outbox-message-id``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dispatcher.mqtt.client import MqttBroker, MqttConnection, Publish
from dispatcher.transports.base import TransportMessage
from outbox.core.clock import Clock, SystemClock
from outbox.core.errors import ClosedError, ConfigurationError, PermanentTransportError

if TYPE_CHECKING:
    from paho.mqtt.client import MQTTMessage

#: User Property names the transport writes itself; a header may not use them.
MESSAGE_ID = "outbox-message-id"
SUBJECT = "outbox-subject"
SESSION_ID = "outbox-session-id"
RESERVED = (MESSAGE_ID, SUBJECT, SESSION_ID)

# Destinations are names from configuration (as queue names): a typo with a space or a wildcard
# is refused rather than published to a topic nobody reads.
_DESTINATION = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,254}[A-Za-z0-9])?$")
_BAD_IN_LEVEL = re.compile(r"[+#/\x00]")


def topic_for(template: str, *, destination: str = "", session: str | None = None) -> str:
    """The topic ``template`` names for a destination and session; ``ValueError`` if it cannot."""
    if "{session}" in template:
        if not session:
            raise ValueError(f"the topic {template!r} needs a session id and the message has none")
        if _BAD_IN_LEVEL.search(session):
            raise ValueError(
                f"session id {session!r} has '/', '+', '#' or NUL: not one topic level"
            )
    if "{destination}" in template and not _DESTINATION.match(destination):
        raise ValueError(
            f"destination {destination!r} is not a topic-safe name (letters, digits, '.', '-', "
            "'_', '/')"
        )
    return template.replace("{destination}", destination).replace("{session}", session or "")


def check_template(template: str, *, name: str = "topic") -> str:
    """A topic template is a topic with ``{destination}``/``{session}`` and no wildcard."""
    probe = template.replace("{destination}", "d").replace("{session}", "s")
    if not probe or "+" in probe or "#" in probe or "{" in probe or "}" in probe:
        raise ConfigurationError(
            f"{name} {template!r} is not a topic template",
            hint="use a topic without wildcards, with {session} and/or {destination} "
            "placeholders, e.g. devices/{session}/tasks",
        )
    return template


class MqttTransport:
    """A ``Transport`` publishing to an MQTT broker; thread safe (one connection, pipelined)."""

    #: Refusals are found before publishing, but a broker failing midway may leave a prefix out.
    atomic_batches = False

    def __init__(
        self,
        broker: MqttBroker | str,
        *,
        topic: str = "{destination}",
        timeout: float = 10.0,
        clock: Clock | None = None,
        client_id: str | None = None,
        connection: MqttConnection | None = None,
        connect_timeout: float = 10.0,
        wait_for_broker: bool = True,
    ) -> None:
        """``wait_for_broker=False`` returns at once and connects in the background: the
        outbox's own transport is built that way, so a broker that is down does not stop
        ``Outbox.open`` and the writes (sends fail retryably until it is back)."""
        self.broker = MqttBroker.parse(broker) if isinstance(broker, str) else broker
        self.topic = check_template(topic)
        self.timeout = timeout
        self.clock = clock or SystemClock()
        self._owned = connection is None
        self.connection = connection or MqttConnection(
            self.broker,
            client_id=client_id,
            connect_timeout=connect_timeout,
            wait=wait_for_broker,
        )
        self._closed = False

    def send(self, batch: Sequence[TransportMessage]) -> None:
        if self._closed:
            raise ClosedError("the MQTT transport is closed", hint="build a new transport")
        items = [self.publication(m) for m in batch]  # every refusal before anything goes out
        self.connection.publish(items, timeout=self.timeout)

    def publication(self, m: TransportMessage) -> Publish:
        """The publish ``m`` becomes; ``PermanentTransportError`` if it cannot be one."""

        def refuse(why: str, hint: str | None = None) -> PermanentTransportError:
            return PermanentTransportError(
                f"message {m.message_id}: {why}", message_id=m.message_id, hint=hint
            )

        try:
            topic = topic_for(self.topic, destination=m.destination, session=m.session_id)
        except ValueError as e:
            raise refuse(str(e)) from e
        if m.scheduled_at is not None and m.scheduled_at > self.clock.now():
            raise refuse(
                f"scheduled for {m.scheduled_at.isoformat()}, and MQTT has no scheduled delivery",
                hint="schedule on the SQL queue or Service Bus and forward from there",
            )
        taken = [k for k in m.headers if k in RESERVED]
        if taken:
            raise refuse(f"header {taken[0]!r} is reserved for the transport's own fields")
        props = [(MESSAGE_ID, m.message_id)]
        if m.subject:
            props.append((SUBJECT, m.subject))
        if m.session_id is not None:
            props.append((SESSION_ID, m.session_id))
        props += [(str(k), str(v)) for k, v in m.headers.items()]
        return Publish(
            topic=topic,
            payload=m.body,
            label=m.message_id,
            content_type=m.content_type or None,
            correlation_data=m.correlation_id.encode() if m.correlation_id else None,
            user_properties=props,
        )

    def close(self) -> None:
        self._closed = True
        if self._owned:
            self.connection.close()


def from_mqtt(message: MQTTMessage, destination: str = "") -> TransportMessage:
    """The ``TransportMessage`` an MQTT publish of ``MqttTransport`` carries (for consumers)."""
    props = getattr(message, "properties", None)
    user = dict(getattr(props, "UserProperty", None) or [])
    correlation = getattr(props, "CorrelationData", None)
    return TransportMessage(
        message_id=user.pop(MESSAGE_ID, ""),
        destination=destination,
        body=bytes(message.payload),
        subject=user.pop(SUBJECT, ""),
        content_type=getattr(props, "ContentType", None) or "",
        session_id=user.pop(SESSION_ID, None),
        correlation_id=bytes(correlation).decode() if correlation else None,
        headers=user,
    )
