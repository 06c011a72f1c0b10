"""One error tree for the whole framework.

Callers catch our names, never a driver's: adapters translate deltalake, SQLAlchemy, Spark and
Azure errors at their edge with ``raise OurError(...) from driver_error``. Every message names the
problem *and* the fix, because the CLI prints it as a single line with no traceback.
"""

from __future__ import annotations


class OutboxError(Exception):
    """Root of every error the framework raises on purpose."""

    #: True when retrying the same operation later can succeed (a broker down, a lock held).
    retryable: bool = False

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.hint = hint
        super().__init__(message if hint is None else f"{message} (fix: {hint})")


# --- configuration and user input -------------------------------------------------------------


class ConfigurationError(OutboxError):
    """A setting is missing or invalid; the message names the setting."""


class ValidationError(OutboxError):
    """Input to a library call is malformed (ids, destinations, bodies, durations)."""


class MessageTooLargeError(ValidationError):
    """A message body is over the configured size limit."""


class SerializationError(ValidationError):
    """A message body or document state cannot be turned into JSON."""


class MissingDependencyError(OutboxError):
    """An optional extra is not installed; the message says which one to install."""


class ShadowedPackageError(ConfigurationError):
    """A module of the user's (``dispatcher.py``, a ``migrations/`` package) hides one of the
    top-level packages the wheel installs, so the outbox would import the user's code instead."""


class DeltaNotConfiguredError(ConfigurationError):
    """A SparkSession without Delta Lake was given where a Delta-enabled one is needed."""


# --- the document store -----------------------------------------------------------------------


class StoreError(OutboxError):
    """The document store (a Delta table) refused or failed an operation."""


class TableNotFoundError(StoreError):
    """The Delta table does not exist at the configured location."""


class ChangeDataFeedDisabledError(StoreError):
    """The table does not have ``delta.enableChangeDataFeed = true``."""


class SchemaMismatchError(StoreError):
    """The table's schema is not the document schema this version understands."""


class ConcurrencyError(StoreError):
    """A document changed since it was read (optimistic concurrency); nothing was written."""


class DocumentNotFoundError(StoreError):
    """A unit of work named a document that does not exist (never created, or deleted)."""


class TombstoneNotSentError(ConcurrencyError):
    """A create named the id of a deleted document whose last messages are not sent yet."""


class CommitConflictError(StoreError):
    """A Delta commit kept conflicting with concurrent writers after every allowed retry."""

    retryable = True


class DuplicateRowsError(StoreError):
    """A document's version is held by more than one row (two compactions ran at once); saves
    of it are refused until ``outbox maintain --repair``."""


class VacuumRefusedError(StoreError):
    """A vacuum would delete change-feed history that the rescuer has not read yet."""


class HistoryGoneError(StoreError):
    """A read as of a table version or time that the table's retained history no longer holds
    (the log trim keeps ``log_retention`` of it); the message names the oldest readable version."""


class ClosedError(OutboxError):
    """A unit of work, store, queue or outbox was used after it was closed."""


class WorkspaceError(OutboxError):
    """The workspace folder is missing, unwritable or not an outbox workspace."""


# --- queues and transports --------------------------------------------------------------------


class QueueError(OutboxError):
    """The durable SQL queue failed an operation."""


class QueueUnavailableError(QueueError):
    """The queue's database cannot be reached right now; retry later, nothing was lost."""

    retryable = True


class LockLostError(QueueError):
    """A settlement used a lock that expired or belongs to another receiver; nothing changed."""


class MessageNotFoundError(QueueError):
    """No message (or dead letter) has that id."""


class UnprocessableMessageError(OutboxError):
    """Raised by a message handler when retrying cannot help: the message is dead-lettered at once.

    The consumer-side twin of ``PermanentTransportError`` (which a *broker* raises on a send):
    this one is the application's verdict on a message it received.
    """


class TransportError(OutboxError):
    """A transport could not settle a send. ``message_id`` names the failing message."""

    def __init__(
        self, message: str, *, message_id: str | None = None, hint: str | None = None
    ) -> None:
        self.message_id = message_id
        super().__init__(message, hint=hint)


class RetryableTransportError(TransportError):
    """The broker is busy or unreachable; the same send can succeed later."""

    retryable = True


class TransportUnavailableError(RetryableTransportError):
    """The broker (or the destination) did not answer at all: a timeout, a refused connection.
    A dispatcher stops sending there for the rest of the dispatch instead of waiting out one
    timeout per document; a failure of one message is a plain ``RetryableTransportError``."""


class PermanentTransportError(TransportError):
    """The broker refused the message itself (unknown destination, too large); don't retry it."""


class UnknownDestinationError(PermanentTransportError):
    """No queue or topic is known by that name."""


# --- the claim log (two regions) --------------------------------------------------------------


class ClaimLogError(OutboxError):
    """The claim log (who handles which message across regions) failed an operation."""


class ClaimLogUnavailableError(ClaimLogError):
    """The claim log cannot be reached right now: nothing is handled without a claim; retry."""

    retryable = True


class ClaimLostError(ClaimLogError):
    """A renew or settle named a claim this owner no longer holds (taken over after its lease
    expired, or already settled); nothing changed."""


# --- the rescuer ------------------------------------------------------------------------------


class RescuerError(OutboxError):
    """A rescue pass could not run."""


class CheckpointError(RescuerError):
    """The rescuer checkpoint is missing, corrupt or was moved by someone else."""


class CheckpointConflictError(CheckpointError):
    """Another rescuer moved the checkpoint between our read and our write; nothing was written."""

    retryable = True


class CheckpointUnavailableError(CheckpointError):
    """The checkpoint store (Cosmos DB) is unreachable right now; retry later, nothing changed."""

    retryable = True


class FeedUnavailableError(RescuerError):
    """The change data feed cannot be read for the requested window (vacuumed, expired)."""


class EngineError(RescuerError):
    """A rescuer engine (local or Spark) failed to start or run."""
