"""Service Bus SDK errors as ours, classified as docs/servicebus.md says: permanent when re-sending
cannot help (missing entity, too large, over quota), retryable otherwise (nothing is lost by
retrying, while a wrong "permanent" would give up on a message). Each names the first unsent
message. The command queue's own classification (``unavailable``) is here too: its sending,
receiving and settling all translate the same way.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from dispatcher.servicebus.sdk import ENV_CONNECTION_STRING, ENV_TOPICS
from dispatcher.transports.base import TransportMessage
from outbox.core.errors import (
    ConfigurationError,
    PermanentTransportError,
    QueueUnavailableError,
    RetryableTransportError,
    TransportError,
    TransportUnavailableError,
    UnknownDestinationError,
    ValidationError,
)

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusMessageBatch


def too_large(
    m: TransportMessage, destination: str, sdk_batch: ServiceBusMessageBatch, e: Exception
) -> PermanentTransportError:
    """``m`` does not fit in an empty SDK batch for ``destination``."""
    limit = getattr(sdk_batch, "max_size_in_bytes", None)
    return PermanentTransportError(
        f"message {m.message_id} ({len(m.body)} byte body) is too large for Service Bus "
        f"entity {destination!r}"
        + (f" (limit {limit} bytes per batch)" if limit else "")
        + f": {e}",
        message_id=m.message_id,
        hint="keep messages under the tier's limit (256 KB Standard, up to 100 MB Premium) "
        "and settings.max_message_bytes below it",
    )


def translate(
    errors: ModuleType,
    e: Exception,
    *,
    destination: str,
    is_topic: bool,
    msgs: list[TransportMessage],
) -> TransportError:
    """An SDK error (``errors`` is ``azure.servicebus.exceptions``) as ours."""
    first = msgs[0].message_id
    what = f"message {first}" + (f" (and {len(msgs) - 1} more)" if len(msgs) > 1 else "")
    where = f"Service Bus {'topic' if is_topic else 'queue'} {destination!r}"
    detail = f"{type(e).__name__}: {e}"
    if isinstance(e, errors.MessagingEntityNotFoundError):
        return UnknownDestinationError(
            f"{what}: {where} does not exist ({detail})",
            message_id=first,
            hint="create it with duplicate detection enabled, or fix the destination "
            f"(a topic must be listed in {ENV_TOPICS})",
        )
    if isinstance(e, errors.MessageSizeExceededError):
        return PermanentTransportError(
            f"{what}: too large for {where} ({detail})", message_id=first
        )
    if isinstance(e, errors.ServiceBusQuotaExceededError):
        return PermanentTransportError(
            f"{what}: {where} is over its quota ({detail})",
            message_id=first,
            hint="drain it or raise its max size; the outbox keeps the message pending",
        )
    permanent = (
        errors.MessageLockLostError,
        errors.SessionLockLostError,
        errors.MessageNotFoundError,
    )
    if isinstance(e, permanent):  # receive-side errors; listed for completeness
        return PermanentTransportError(f"{what}: {where} refused it ({detail})", message_id=first)
    return _retryable(errors, e, what=what, where=where, detail=detail, first=first)


def _retryable(
    errors: ModuleType, e: Exception, *, what: str, where: str, detail: str, first: str
) -> TransportError:
    if isinstance(e, errors.ServiceBusAuthorizationError | errors.ServiceBusAuthenticationError):
        return RetryableTransportError(
            f"{what}: {where} refused our credentials ({detail})",
            message_id=first,
            hint=f"check {ENV_CONNECTION_STRING}: the policy needs the Send right; messages "
            "stay pending until it works",
        )
    # Retryable (docs/servicebus.md): connection, timeout, busy, communication, entity disabled,
    # session cannot be locked. Any other SDK (or azure-core) error is treated as retryable too;
    # no answer at all is the namespace, not the message (the rest of a dispatch fails fast).
    unanswered = (
        errors.ServiceBusConnectionError,
        errors.ServiceBusCommunicationError,
        errors.OperationTimeoutError,
    )
    if isinstance(e, unanswered):
        return TransportUnavailableError(
            f"{what}: {where} did not answer ({detail})", message_id=first
        )
    return RetryableTransportError(
        f"{what}: {where} did not accept it ({detail})", message_id=first
    )


def unavailable(errors: ModuleType, what: str, e: Exception) -> Exception:
    """A command queue's SDK failure as ours: a missing entity is a configuration error, a refused
    message a validation error, the rest retryable."""
    if isinstance(e, errors.MessagingEntityNotFoundError):
        return ConfigurationError(
            f"{what}: the entity does not exist ({e})",
            hint="run `outbox migrate` to create the command queue",
        )
    if isinstance(e, ValueError | TypeError):  # a refused message: not worth retrying
        return ValidationError(f"{what}: {e}")
    return QueueUnavailableError(f"{what}: {type(e).__name__}: {e}")
