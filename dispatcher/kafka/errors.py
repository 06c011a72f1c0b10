"""librdkafka's errors, translated at the edge into the outbox's tree with a fix hint.

What the broker refuses about the message itself (an unknown topic, too large, not allowed) is
permanent: resending the same bytes cannot help, so the dispatcher dead-letters its command and
the document's messages stay pending until an operator fixes the cause and requeues it. What is
about the connection (unreachable, timed out, failed authentication, throttled) is retryable: the
key pauses and the send is tried again, with the same message ids.
"""

from __future__ import annotations

from typing import Any

from outbox.core.errors import (
    PermanentTransportError,
    RetryableTransportError,
    TransportError,
    TransportUnavailableError,
)

# Error codes by name, resolved lazily so this module imports without confluent-kafka.
_PERMANENT = (
    "MSG_SIZE_TOO_LARGE",
    "RECORD_LIST_TOO_LARGE",
    "UNKNOWN_TOPIC_OR_PART",
    "_UNKNOWN_TOPIC",
    "TOPIC_AUTHORIZATION_FAILED",
    "TOPIC_EXCEPTION",
    "INVALID_RECORD",
    "_INVALID_ARG",
)
_AUTH = (
    "_AUTHENTICATION",
    "SASL_AUTHENTICATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "_SSL",
)
_UNREACHABLE = ("_ALL_BROKERS_DOWN", "_TRANSPORT", "_RESOLVE", "_MSG_TIMED_OUT", "_TIMED_OUT")


def _codes(kafka_error: Any, names: tuple[str, ...]) -> set[int]:
    return {getattr(kafka_error, n) for n in names if hasattr(kafka_error, n)}


def is_auth(err: Any) -> bool:
    from confluent_kafka import KafkaError

    return bool(err.code() in _codes(KafkaError, _AUTH))


def is_unreachable(err: Any) -> bool:
    from confluent_kafka import KafkaError

    return bool(err.code() in _codes(KafkaError, _UNREACHABLE))


def hint_for(err: Any, where: str) -> str | None:
    """The fix for a librdkafka error, or None when there is nothing better than its text."""
    from confluent_kafka import KafkaError

    code = err.code()
    if code in _codes(KafkaError, ("MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE")):
        return (
            "raise the topic's max.message.bytes (and message.max.bytes in kafka_options), or "
            "send less per message; the document's messages stay pending"
        )
    if code in _codes(KafkaError, ("UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC")):
        return (
            "create the topic (outbox migrate creates the declared destinations), then requeue "
            "the command with outbox dead-letters requeue; the messages stay pending"
        )
    if is_auth(err):
        return (
            "check kafka_sasl_username / kafka_sasl_password (or kafka_connection_string) and "
            "the security protocol; the messages stay pending until a send succeeds"
        )
    if is_unreachable(err):
        return (
            f"check that the brokers at {where} are up and reachable; the messages stay pending "
            "and are sent when they are"
        )
    return None


def translate(
    err: Any,
    *,
    message_id: str | None,
    where: str,
    what: str | None = None,
    cause: Any = None,
) -> TransportError:
    """A ``KafkaError`` as the outbox's transport error naming ``message_id``; ``cause`` is the
    client's last connection error, which says why better than a timeout does."""
    from confluent_kafka import KafkaError

    text = err.str() if hasattr(err, "str") else str(err)
    subject = what or (f"message {message_id}" if message_id else "Kafka")
    if is_auth(err):
        line = f"{subject}: Kafka at {where} did not accept the login: {text}"
    elif is_unreachable(err):
        why = cause.str() if cause is not None and is_unreachable(cause) else text
        line = f"{subject}: could not reach Kafka at {where}: {why}"
    else:
        line = f"{subject}: Kafka at {where} refused it: {text}"
    hint = hint_for(err, where)
    if err.code() in _codes(KafkaError, _PERMANENT):
        return PermanentTransportError(line, message_id=message_id, hint=hint)
    if is_unreachable(err):  # the brokers, not the message: the rest of a dispatch fails fast
        return TransportUnavailableError(line, message_id=message_id, hint=hint)
    return RetryableTransportError(line, message_id=message_id, hint=hint)
