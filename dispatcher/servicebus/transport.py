"""The Azure Service Bus transport: a thin mapping of ``TransportMessage`` to ``ServiceBusMessage``.

The field mapping lives in ``mapping``, the SDK's edge (environment, the client and
sender protocols, the guarded import) in ``sdk``, and the error classification in
``errors``; this module is the sending itself.

``send(batch)`` validates and converts every message first (a bad id or destination name fails the
call before anything is sent), then groups the batch by destination, keeping batch order inside
each group, and sends each group with ``create_message_batch()``, starting a new SDK batch whenever
``add_message`` says the current one is full. ``send_messages`` is synchronous: it returns once the
broker accepted the batch, so ``send`` returns only when every message is settled.

**Not atomic across destinations (or across SDK batches).** A Service Bus batch is atomic per
destination only, so ``atomic_batches`` is not declared. When a later destination fails, earlier
ones were already accepted; the dispatcher then re-sends the whole batch with the same message ids
and the entity's duplicate detection drops the repeats (a dropped duplicate is reported as a
success). Duplicate detection must therefore be enabled on every destination entity.

**Partitioned entities.** The service refuses a multi-message batch on an entity that has both
partitioning and duplicate detection ("Batching brokered messages with distinct SessionId,
PartitionKey, or MessageId is not supported ..."). Nothing of that batch was stored, so the
transport re-sends its messages one at a time and remembers to do so for that destination.

The SDK's client and senders are not thread-safe: one sender is cached per destination and used
under its own lock (sends to one destination are serialised; different destinations run in
parallel). ``close()`` closes the senders, and the client when the transport created it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, cast

from dispatcher.servicebus import sdk
from dispatcher.servicebus.errors import too_large, translate
from dispatcher.servicebus.mapping import (
    MAX_ENTITY_NAME_LENGTH,
    MAX_ID_LENGTH,
    check_destination,
    to_servicebus,
)
from dispatcher.servicebus.sdk import (
    ENV_CONNECTION_STRING,
    ENV_NAMESPACE,
    ENV_TOPICS,
    INSTALL_HINT,
    ClientLike,
    SenderLike,
)
from dispatcher.transports.base import TransportMessage
from outbox.core.errors import (
    ConfigurationError,
    MissingDependencyError,
    PermanentTransportError,
    TransportError,
)

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch

    from outbox.core.settings import Settings

__all__ = [
    "ENV_CONNECTION_STRING",
    "ENV_NAMESPACE",
    "ENV_TOPICS",
    "INSTALL_HINT",
    "MAX_ENTITY_NAME_LENGTH",
    "MAX_ID_LENGTH",
    "ClientLike",
    "SenderLike",
    "ServiceBusTransport",
]

#: The service's refusal of multi-message batches on partitioned + duplicate-detection entities.
_NO_BATCHING_MARKER = "Batching brokered messages"


def _topics(settings: Settings | None, env: Mapping[str, str]) -> set[str]:
    """The destinations that are topics; a name declared a queue in the settings and listed in
    ``OUTBOX_SERVICEBUS_TOPICS`` is a ``ConfigurationError`` (one of the two is wrong)."""
    from dispatcher.servicebus.admin import destinations

    topics = {t.strip() for t in env.get(ENV_TOPICS, "").split(",") if t.strip()}
    declared = destinations(settings) if settings is not None else []
    clash = sorted(d.name for d in declared if d.kind == "queue" and d.name in topics)
    if clash:
        raise ConfigurationError(
            f"{', '.join(map(repr, clash))} is a queue in servicebus_destinations but a topic "
            f"in {ENV_TOPICS}",
            hint="write topic:NAME in servicebus_destinations, or drop it from the variable",
        )
    return topics | {d.name for d in declared if d.kind == "topic"}


class _Destination:
    """One cached sender and the lock that serialises its use (the SDK is not thread-safe)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.sender: SenderLike | None = None
        self.unbatched = False  # partitioned + duplicate detection: one message per send


class ServiceBusTransport:
    """A ``Transport`` over Azure Service Bus queues and topics (one per destination name)."""

    # Deliberately no ``atomic_batches = True``: a Service Bus batch is atomic per destination only.

    def __init__(
        self,
        client_or_factory: ClientLike | Callable[[], ClientLike],
        *,
        topics: Iterable[str] = (),
        owns_client: bool | None = None,
        max_batch_bytes: int | None = None,
        send_timeout: float | None = None,
        unbatched: Iterable[str] = (),
    ) -> None:
        """``client_or_factory`` is a ``ServiceBusClient`` (or anything with the same
        ``get_queue_sender``/``get_topic_sender``/``close``), or a callable building one on first
        use. ``topics`` names the destinations that are topics (the rest are queues).
        ``owns_client`` defaults to True for a factory and False for a client: an owned client is
        closed by ``close()``. ``max_batch_bytes`` caps each SDK batch (default: the link's limit,
        from the tier). ``send_timeout`` bounds each ``send_messages`` including the SDK's own
        retries. ``unbatched`` names destinations that must get one message per send (partitioned
        entities with duplicate detection; detected automatically otherwise).
        """
        self._sb, self._errors = sdk.load()
        if hasattr(client_or_factory, "get_queue_sender"):
            self._client: ClientLike | None = cast(ClientLike, client_or_factory)
            self._factory: Callable[[], ClientLike] | None = None
            self._owns_client = bool(owns_client)
        elif callable(client_or_factory):
            self._client = None
            self._factory = client_or_factory
            self._owns_client = True if owns_client is None else owns_client
        else:
            raise ConfigurationError(
                f"ServiceBusTransport needs a ServiceBusClient or a factory, got "
                f"{type(client_or_factory).__name__}",
                hint="pass ServiceBusClient.from_connection_string(...) or use from_settings()",
            )
        self.topics = frozenset(topics)
        self.max_batch_bytes = max_batch_bytes
        self.send_timeout = send_timeout
        self._unbatched = frozenset(unbatched)
        self._lock = threading.Lock()  # guards the client, the cache and ``_closed``
        self._destinations: dict[str, _Destination] = {}
        self._closed = False

    # --- construction from settings -----------------------------------------------------------

    @classmethod
    def from_settings(
        cls, settings: Settings | None = None, *, env: Mapping[str, str] | None = None
    ) -> ServiceBusTransport:
        """Connect with ``OUTBOX_SERVICEBUS_CONNECTION_STRING``, else with
        ``OUTBOX_SERVICEBUS_NAMESPACE`` (``<ns>.servicebus.windows.net``) and azure-identity's
        ``DefaultAzureCredential``. The destinations that are topics are the ``topic:NAME``
        entries of ``servicebus_destinations`` and the names in ``OUTBOX_SERVICEBUS_TOPICS``.

        The connection string is parsed here (a malformed one fails now), but nothing connects
        until the first send. Inside ``sdk.use_clients`` the client comes from its
        factory (the kit's fake).
        """
        sb, _ = sdk.load()
        env = os.environ if env is None else env
        topics = _topics(settings, env)
        factory = sdk.client_factory()
        if factory is not None:
            client, admin = factory()
            admin.close()
            return cls(cast(ClientLike, client), topics=topics, owns_client=True)
        conn = env.get(ENV_CONNECTION_STRING, "").strip()
        if conn:
            try:
                client = sb.ServiceBusClient.from_connection_string(conn)
            except (ValueError, TypeError) as e:  # never echo the string: it holds a key
                raise ConfigurationError(
                    f"{ENV_CONNECTION_STRING} is not a valid Service Bus connection string "
                    f"({type(e).__name__})",
                    hint="copy it from the namespace's Shared access policies "
                    "(Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...)",
                ) from e
            return cls(cast(ClientLike, client), topics=topics, owns_client=True)
        namespace = env.get(ENV_NAMESPACE, "").strip()
        if namespace:
            try:
                from azure.identity import DefaultAzureCredential
            except ImportError as e:
                raise MissingDependencyError(
                    f"{ENV_NAMESPACE} is set, which needs azure-identity for the credential",
                    hint=f"pip install azure-identity, or set {ENV_CONNECTION_STRING} instead",
                ) from e
            client = sb.ServiceBusClient(namespace, DefaultAzureCredential())
            return cls(cast(ClientLike, client), topics=topics, owns_client=True)
        raise ConfigurationError(
            f"transport 'servicebus' needs {ENV_CONNECTION_STRING} (or {ENV_NAMESPACE} with "
            "azure-identity installed)",
            hint=f"export {ENV_CONNECTION_STRING}='Endpoint=sb://<ns>.servicebus.windows.net/;"
            "SharedAccessKeyName=...;SharedAccessKey=...'",
        )

    # --- sending ------------------------------------------------------------------------------

    def send(self, batch: Sequence[TransportMessage]) -> None:
        if not batch:
            return
        if self._closed:
            first = batch[0].message_id
            raise PermanentTransportError(
                f"cannot send message {first}: the Service Bus transport is closed",
                message_id=first,
                hint="build a new transport",
            )
        # Convert everything first: a malformed message or destination fails before any send.
        groups: dict[str, list[tuple[TransportMessage, ServiceBusMessage]]] = {}
        for m in batch:
            groups.setdefault(check_destination(m), []).append((m, self.to_servicebus(m)))
        for name, items in groups.items():
            self._send_destination(self._destination(name), items)

    def to_servicebus(self, m: TransportMessage) -> ServiceBusMessage:
        """The ``ServiceBusMessage`` for ``m`` (``PermanentTransportError`` when it is invalid)."""
        return to_servicebus(self._sb, m)

    def _destination(self, name: str) -> _Destination:
        with self._lock:
            dest = self._destinations.get(name)
            if dest is None:
                dest = self._destinations[name] = _Destination(name)
                dest.unbatched = name in self._unbatched
            return dest

    def _get_client(self) -> ClientLike:
        with self._lock:
            if self._client is None:
                assert self._factory is not None
                self._client = self._factory()
            return self._client

    def _sender(self, dest: _Destination) -> SenderLike:
        if dest.sender is None:
            client = self._get_client()
            with self._lock:  # the client is not thread-safe either
                if dest.name in self.topics:
                    dest.sender = client.get_topic_sender(topic_name=dest.name)
                else:
                    dest.sender = client.get_queue_sender(queue_name=dest.name)
        return dest.sender

    def _discard_sender(self, dest: _Destination) -> None:
        """After a failure, start over with a fresh sender (and link) next time."""
        sender, dest.sender = dest.sender, None
        if sender is not None:
            with contextlib.suppress(Exception):  # closing a broken link may fail too
                sender.close()

    def _send_destination(
        self, dest: _Destination, items: list[tuple[TransportMessage, ServiceBusMessage]]
    ) -> None:
        with dest.lock:
            if self._closed:
                raise PermanentTransportError(
                    f"cannot send message {items[0][0].message_id}: the transport is closed",
                    message_id=items[0][0].message_id,
                )
            try:
                if dest.unbatched:
                    for item in items:
                        self._send_chunk(dest, [item])
                else:
                    self._send_batched(dest, items)
            except TransportError:
                self._discard_sender(dest)
                raise

    def _send_batched(
        self, dest: _Destination, items: list[tuple[TransportMessage, ServiceBusMessage]]
    ) -> None:
        """Fill SDK batches in order; send each when full (and the last one at the end)."""
        size_error = self._errors.MessageSizeExceededError
        chunk: list[tuple[TransportMessage, ServiceBusMessage]] = []
        sdk_batch = self._new_batch(dest, items[0][0])
        for item in items:
            try:
                sdk_batch.add_message(item[1])
            except size_error:
                # Full. Try the message in a fresh batch *before* sending the full one, so a message
                # too large on its own fails without sending the messages queued in front of it.
                fresh = self._new_batch(dest, item[0])
                try:
                    fresh.add_message(item[1])
                except size_error as e:
                    raise self._too_large(item[0], dest, fresh, e) from e
                if chunk:
                    self._send_chunk(dest, chunk, sdk_batch)
                chunk, sdk_batch = [], fresh
            chunk.append(item)
        self._send_chunk(dest, chunk, sdk_batch)

    def _new_batch(self, dest: _Destination, first: TransportMessage) -> ServiceBusMessageBatch:
        try:
            return self._sender(dest).create_message_batch(self.max_batch_bytes)
        except Exception as e:  # creating the batch opens the link: the entity may be missing
            raise self._translate(e, dest, [first]) from e

    def _send_chunk(
        self,
        dest: _Destination,
        chunk: list[tuple[TransportMessage, ServiceBusMessage]],
        sdk_batch: ServiceBusMessageBatch | None = None,
    ) -> None:
        if sdk_batch is None:
            sdk_batch = self._new_batch(dest, chunk[0][0])
            try:
                sdk_batch.add_message(chunk[0][1])
            except self._errors.MessageSizeExceededError as e:
                raise self._too_large(chunk[0][0], dest, sdk_batch, e) from e
        try:
            self._sender(dest).send_messages(sdk_batch, timeout=self.send_timeout)
        except Exception as e:
            if (
                len(chunk) > 1
                and isinstance(e, self._errors.ServiceBusError)
                and _NO_BATCHING_MARKER in str(e)
            ):
                # Partitioned entity with duplicate detection: nothing of this batch was stored.
                dest.unbatched = True
                for item in chunk:
                    self._send_chunk(dest, [item])
                return
            raise self._translate(e, dest, [m for m, _ in chunk]) from e

    # --- errors -------------------------------------------------------------------------------

    def _too_large(
        self,
        m: TransportMessage,
        dest: _Destination,
        sdk_batch: ServiceBusMessageBatch,
        e: Exception,
    ) -> PermanentTransportError:
        return too_large(m, dest.name, sdk_batch, e)

    def _translate(
        self, e: Exception, dest: _Destination, msgs: list[TransportMessage]
    ) -> TransportError:
        return translate(
            self._errors, e, destination=dest.name, is_topic=dest.name in self.topics, msgs=msgs
        )

    # --- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close every cached sender, and the client when this transport owns it. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            destinations = list(self._destinations.values())
        for dest in destinations:
            with dest.lock:  # waits for an in-flight send on that destination
                self._discard_sender(dest)
        with self._lock:
            client, self._client = self._client, None
        if client is not None and self._owns_client:
            client.close()
