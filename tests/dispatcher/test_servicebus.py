"""The Service Bus transport against a faithful fake of the SDK surface it uses, plus a live test.

The fake (``FakeNamespace`` + ``FakeServiceBusClient`` + ``FakeSender``) copies what the real SDK
and broker do, as read from azure-servicebus 7.15.0 and the service's documented behaviour:

* ``create_message_batch`` returns the SDK's *real* ``ServiceBusMessageBatch`` (real size
  accounting, the real ``MessageSizeExceededError`` when full) and opens the link, so a missing
  entity fails there with ``MessagingEntityNotFoundError``, as it does on a real namespace;
* messages are the SDK's real ``ServiceBusMessage`` (ids <= 128 chars, ``ValueError`` when
  partition_key != session_id), and the broker checks them again;
* a batch is stored all-or-nothing; duplicate detection drops a repeated message_id within the
  entity's window and reports success; a session-enabled entity refuses a message without a
  session id; a partitioned entity with duplicate detection refuses multi-message batches;
* a closed sender raises ``ValueError`` as ``_check_live`` does; concurrent use of one sender (the
  SDK is not thread-safe) is recorded as a violation;
* injected failures raise the real classes from ``azure.servicebus.exceptions``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

pytest.importorskip("azure.servicebus")

from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch
from azure.servicebus import exceptions as sb_errors

from dispatcher.servicebus.transport import (
    ENV_CONNECTION_STRING,
    ENV_NAMESPACE,
    ENV_TOPICS,
    ServiceBusTransport,
)
from dispatcher.transports.base import Transport, TransportMessage
from outbox.core.errors import (
    ConfigurationError,
    MissingDependencyError,
    PermanentTransportError,
    RetryableTransportError,
    UnknownDestinationError,
)
from outbox.testing.contracts.transport import DEST, TransportContract

LINK_MAX_BYTES = 256 * 1024  # what the Standard tier's link reports


# --- the fake ------------------------------------------------------------------------------------


@dataclass
class Stored:
    message: ServiceBusMessage
    enqueued_at: datetime


@dataclass
class Entity:
    name: str
    kind: str = "queue"
    requires_session: bool = False
    duplicate_detection: timedelta | None = timedelta(minutes=10)
    partitioned: bool = False
    enabled: bool = True
    stored: list[Stored] = field(default_factory=list)
    seen: dict[str, datetime] = field(default_factory=dict)
    fail_next: list[BaseException] = field(default_factory=list)
    duplicates_dropped: int = 0
    batches: list[int] = field(default_factory=list)  # messages per accepted send


class FakeNamespace:
    """The broker side: entities, a clock, and what each entity stored."""

    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=UTC)
        self.entities: dict[str, Entity] = {}
        self.lock = threading.Lock()
        self.violations: list[str] = []

    def create(self, name: str, **kw: Any) -> Entity:
        self.entities[name] = Entity(name, **kw)
        return self.entities[name]

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def accept(self, entity_name: str, messages: list[ServiceBusMessage]) -> None:
        with self.lock:
            entity = self.entities.get(entity_name)
            if entity is None:
                raise sb_errors.MessagingEntityNotFoundError(
                    message=f"The messaging entity 'sb://fake/{entity_name}' could not be found."
                )
            if entity.fail_next:
                raise entity.fail_next.pop(0)
            if not entity.enabled:
                raise sb_errors.MessagingEntityDisabledError(
                    message=f"Messaging entity 'sb://fake/{entity_name}' is currently disabled."
                )
            for m in messages:
                if m.partition_key is not None and m.session_id not in (None, m.partition_key):
                    raise ValueError(
                        "partition_key cannot be set to a different value than session_id"
                    )
                if m.message_id is not None and len(m.message_id) > 128:
                    raise ValueError("message_id cannot be longer than 128 characters.")
                if entity.requires_session and not m.session_id:
                    raise sb_errors.ServiceBusError(
                        message="The SessionId was not set on a message, and it cannot be sent to "
                        "the entity. Entities that have session support enabled can only receive "
                        "messages that have the SessionId set to a valid value.",
                        condition=b"amqp:not-allowed",
                    )
            if entity.partitioned and entity.duplicate_detection and len(messages) > 1:
                raise sb_errors.ServiceBusError(
                    message="Batching brokered messages with distinct SessionId, PartitionKey, or "
                    "MessageId  is not supported for an entity with partitioning and duplicate "
                    "detection enabled.",
                    condition=b"amqp:not-allowed",
                )
            entity.batches.append(len(messages))
            for m in messages:  # all checks passed: the batch is stored whole
                window = entity.duplicate_detection
                mid = m.message_id or str(uuid.uuid4())
                if (
                    window is not None
                    and mid in entity.seen
                    and self.now - entity.seen[mid] < window
                ):
                    entity.duplicates_dropped += 1
                    continue
                entity.seen[mid] = self.now
                entity.stored.append(Stored(m, self.now))

    def receive(self, name: str) -> list[TransportMessage]:
        """What a consumer would get now, as the receiver returns it (properties as bytes)."""
        out = []
        for s in self.entities[name].stored:
            m = s.message
            when = m.scheduled_enqueue_time_utc
            if when is not None and when > self.now:
                continue
            props = {
                k.encode() if isinstance(k, str) else k: v.encode() if isinstance(v, str) else v
                for k, v in (m.application_properties or {}).items()
            }
            out.append(
                TransportMessage(
                    message_id=m.message_id or "",
                    destination=name,
                    body=b"".join(m.body),
                    subject=m.subject or "",
                    content_type=m.content_type or "",
                    session_id=m.session_id,
                    correlation_id=m.correlation_id,
                    headers={k.decode(): v.decode() for k, v in props.items()},
                )
            )
        return out


class FakeSender:
    def __init__(self, ns: FakeNamespace, entity_name: str, kind: str) -> None:
        self.ns = ns
        self.entity_name = entity_name
        self.kind = kind
        self.closed = False
        self._in_use = threading.Lock()
        self.fail_create: list[BaseException] = []

    def _check_live(self) -> None:
        if self.closed:
            raise ValueError(
                "The handler has already been shutdown. Please use ServiceBusClient to create a "
                "new instance."
            )

    def _enter(self) -> None:
        if not self._in_use.acquire(blocking=False):
            self.ns.violations.append(f"sender for {self.entity_name} used by two threads at once")
            self._in_use.acquire()

    def create_message_batch(self, max_size_in_bytes: int | None = None) -> ServiceBusMessageBatch:
        self._check_live()
        self._enter()
        try:
            if self.fail_create:
                raise self.fail_create.pop(0)
            if self.entity_name not in self.ns.entities:  # opening the link fails
                raise sb_errors.MessagingEntityNotFoundError(
                    message=f"The messaging entity 'sb://fake/{self.entity_name}' could not be "
                    "found."
                )
            if max_size_in_bytes and max_size_in_bytes > LINK_MAX_BYTES:
                raise ValueError(
                    f"Max message size: {max_size_in_bytes} is too large, acceptable max batch "
                    f"size is: {LINK_MAX_BYTES} bytes."
                )
            return ServiceBusMessageBatch(max_size_in_bytes=max_size_in_bytes or LINK_MAX_BYTES)
        finally:
            self._in_use.release()

    def send_messages(self, message: Any, *, timeout: float | None = None) -> None:
        self._check_live()
        if timeout is not None and timeout <= 0:
            raise ValueError("The timeout must be greater than 0.")
        self._enter()
        try:
            time.sleep(0)  # widen the window in which unsafe concurrent use would show
            if isinstance(message, ServiceBusMessageBatch):
                messages = list(message._messages)  # the real batch keeps them here
            elif isinstance(message, list):
                batch = ServiceBusMessageBatch(max_size_in_bytes=LINK_MAX_BYTES)
                for m in message:
                    batch.add_message(m)
                messages = list(message)
            else:
                messages = [message]
            if not messages:
                return
            self.ns.accept(self.entity_name, messages)
        finally:
            self._in_use.release()

    def close(self) -> None:
        self.closed = True


class FakeServiceBusClient:
    def __init__(self, ns: FakeNamespace) -> None:
        self.ns = ns
        self.senders: list[FakeSender] = []
        self.closed = False

    def get_queue_sender(self, queue_name: str, **kwargs: Any) -> FakeSender:
        return self._sender(queue_name, "queue")

    def get_topic_sender(self, topic_name: str, **kwargs: Any) -> FakeSender:
        return self._sender(topic_name, "topic")

    def _sender(self, name: str, kind: str) -> FakeSender:
        if self.closed:
            raise ValueError("The client has been closed.")
        s = FakeSender(self.ns, name, kind)
        self.senders.append(s)
        return s

    def close(self) -> None:
        self.closed = True
        for s in self.senders:
            s.close()


def tm(i: int, dest: str = DEST, session: str | None = "s1", **kw: Any) -> TransportMessage:
    fields: dict[str, Any] = {
        "message_id": f"m-{session}-{i}",
        "destination": dest,
        "body": f'{{"i":{i}}}'.encode(),
        "subject": "Thing",
        "session_id": session,
    }
    fields.update(kw)
    return TransportMessage(**fields)


@pytest.fixture
def ns() -> FakeNamespace:
    n = FakeNamespace()
    n.create(DEST)
    return n


@pytest.fixture
def client(ns: FakeNamespace) -> FakeServiceBusClient:
    return FakeServiceBusClient(ns)


@pytest.fixture
def transport(client: FakeServiceBusClient) -> Iterator[ServiceBusTransport]:
    t = ServiceBusTransport(client)
    yield t
    t.close()


def stored(ns: FakeNamespace, name: str = DEST) -> list[ServiceBusMessage]:
    return [s.message for s in ns.entities[name].stored]


# --- the shared contract -------------------------------------------------------------------------


class TestServiceBusTransportContract(TransportContract):
    # Atomic per destination only: a Service Bus batch never spans entities.
    atomic = False

    def make_transport(self) -> Transport:
        self.ns = FakeNamespace()
        self.ns.create(DEST)
        return ServiceBusTransport(FakeServiceBusClient(self.ns))

    def delivered(self, transport: Transport, destination: str = DEST) -> list[TransportMessage]:
        assert self.ns.violations == []
        self.ns.advance(10**6)  # past any scheduled time (and any duplicate detection window)
        got = self.ns.receive(destination)
        self.ns.advance(-(10**6))
        return got


# --- field mapping -------------------------------------------------------------------------------


def test_every_field_lands_on_its_service_bus_attribute(
    transport: ServiceBusTransport, ns: FakeNamespace
) -> None:
    when = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    m = TransportMessage(
        message_id="order-1:7",
        destination=DEST,
        body=b'{"a":1}',
        subject="ShipmentStatusChanged",
        content_type="application/cloudevents+json",
        session_id="order-1",
        scheduled_at=when,
        correlation_id="corr-9",
        headers={"traceparent": "00-abc-def-01", "tenant": "t1"},
    )
    transport.send([m])
    (sb,) = stored(ns)
    assert sb.message_id == "order-1:7"
    assert b"".join(sb.body) == b'{"a":1}'
    assert sb.subject == "ShipmentStatusChanged"
    assert sb.content_type == "application/cloudevents+json"
    assert sb.session_id == "order-1"
    assert sb.partition_key is None  # unset: the service partitions by session_id
    assert sb.scheduled_enqueue_time_utc == when
    assert sb.correlation_id == "corr-9"
    assert sb.application_properties == {"traceparent": "00-abc-def-01", "tenant": "t1"}
    assert sb.time_to_live is None  # the entity's default TTL applies
    assert sb.to is None
    assert sb.reply_to is None


def test_optional_fields_stay_unset(transport: ServiceBusTransport, ns: FakeNamespace) -> None:
    transport.send([TransportMessage(message_id="x", destination=DEST, body=b"1", subject="")])
    (sb,) = stored(ns)
    assert sb.session_id is None
    assert sb.partition_key is None
    assert sb.scheduled_enqueue_time_utc is None
    assert sb.correlation_id is None
    assert sb.subject is None
    assert sb.application_properties is None
    assert sb.content_type == "application/json"


def test_a_scheduled_message_keeps_our_id_and_waits(
    transport: ServiceBusTransport, ns: FakeNamespace
) -> None:
    later = ns.now + timedelta(minutes=5)
    transport.send([tm(1, scheduled_at=later)])
    (sb,) = stored(ns)
    assert sb.message_id == "m-s1-1"  # not a random id: duplicate detection still works
    assert ns.receive(DEST) == []
    ns.advance(301)
    assert [r.message_id for r in ns.receive(DEST)] == ["m-s1-1"]


def test_scheduled_times_are_sent_in_utc(transport: ServiceBusTransport, ns: FakeNamespace) -> None:
    cet = timezone(timedelta(hours=1))
    transport.send(
        [
            tm(1, scheduled_at=datetime(2030, 1, 1, 13, 0, tzinfo=cet)),
            tm(2, scheduled_at=datetime(2030, 1, 1, 12, 0)),  # naive: read as UTC, not local
        ]
    )
    expected = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    assert [m.scheduled_enqueue_time_utc for m in stored(ns)] == [expected, expected]


def test_received_application_properties_decode_back_to_headers(
    transport: ServiceBusTransport, ns: FakeNamespace
) -> None:
    transport.send([tm(1, headers={"k": "v", "traceparent": "00-1-2-01"})])
    (got,) = ns.receive(DEST)
    assert got.headers == {"k": "v", "traceparent": "00-1-2-01"}


@pytest.mark.parametrize("field_name", ["message_id", "session_id"])
def test_ids_up_to_128_characters_pass_and_longer_ones_fail_before_any_send(
    transport: ServiceBusTransport, ns: FakeNamespace, field_name: str
) -> None:
    ok = tm(1, **{field_name: "a" * 128})
    transport.send([ok])
    assert len(stored(ns)) == 1
    long = tm(2, **{field_name: "b" * 129})
    with pytest.raises(PermanentTransportError, match="at most 128") as err:
        transport.send([tm(3), long])
    assert err.value.message_id == long.message_id
    assert len(stored(ns)) == 1  # validated before anything was sent


def test_an_empty_message_id_is_refused(transport: ServiceBusTransport) -> None:
    with pytest.raises(PermanentTransportError, match="empty message_id"):
        transport.send([tm(1, message_id="")])


def test_the_sdk_refuses_a_partition_key_that_differs_from_the_session() -> None:
    # Why the transport never sets partition_key: the real SDK raises on a mismatch.
    with pytest.raises(ValueError, match="different value than session_id"):
        ServiceBusMessage(b"x", session_id="a", partition_key="b")
    assert ServiceBusMessage(b"x", session_id="a", partition_key="a").partition_key == "a"


# --- grouping, order, batching -------------------------------------------------------------------


def test_a_batch_is_grouped_by_destination_in_order_one_send_each(
    transport: ServiceBusTransport, ns: FakeNamespace, client: FakeServiceBusClient
) -> None:
    ns.create("billing")
    ns.create("audit", kind="topic")
    transport.topics = frozenset({"audit"})
    batch = [
        tm(1),
        tm(1, dest="billing", session="b"),
        tm(2),
        tm(1, dest="audit", session=None),
        tm(2, dest="billing", session="b"),
        tm(3),
    ]
    transport.send(batch)
    assert [m.message_id for m in stored(ns)] == ["m-s1-1", "m-s1-2", "m-s1-3"]
    assert [m.message_id for m in stored(ns, "billing")] == ["m-b-1", "m-b-2"]
    assert [m.message_id for m in stored(ns, "audit")] == ["m-None-1"]
    assert [ns.entities[n].batches for n in (DEST, "billing", "audit")] == [[3], [2], [1]]
    assert sorted((s.entity_name, s.kind) for s in client.senders) == [
        ("audit", "topic"),
        ("billing", "queue"),
        (DEST, "queue"),
    ]


def test_one_cached_sender_per_destination(
    transport: ServiceBusTransport, client: FakeServiceBusClient
) -> None:
    for i in range(5):
        transport.send([tm(i)])
    assert len(client.senders) == 1


def test_a_full_batch_is_split_and_order_is_kept(
    client: FakeServiceBusClient, ns: FakeNamespace
) -> None:
    t = ServiceBusTransport(client, max_batch_bytes=2_000)
    batch = [tm(i, body=b"x" * 400) for i in range(12)]
    t.send(batch)
    assert [m.message_id for m in stored(ns)] == [m.message_id for m in batch]
    sizes = ns.entities[DEST].batches
    assert len(sizes) > 1
    assert sum(sizes) == 12


def test_a_message_too_large_on_its_own_is_named_and_nothing_in_front_of_it_is_sent(
    client: FakeServiceBusClient, ns: FakeNamespace
) -> None:
    t = ServiceBusTransport(client, max_batch_bytes=2_000)
    big = tm(2, body=b"x" * 5_000)
    with pytest.raises(PermanentTransportError, match="too large") as err:
        t.send([tm(1), big, tm(3)])
    assert err.value.message_id == big.message_id
    assert big.message_id in str(err.value)
    assert not isinstance(err.value, RetryableTransportError)
    assert stored(ns) == []


def test_the_broker_refusing_a_batch_as_too_large_is_permanent(
    transport: ServiceBusTransport, ns: FakeNamespace
) -> None:
    ns.entities[DEST].fail_next.append(sb_errors.MessageSizeExceededError(message="too big"))
    with pytest.raises(PermanentTransportError, match="too large") as err:
        transport.send([tm(1), tm(2)])
    assert err.value.message_id == "m-s1-1"


def test_partitioned_entity_with_duplicate_detection_falls_back_to_single_sends(
    transport: ServiceBusTransport, ns: FakeNamespace
) -> None:
    ns.create("parted", partitioned=True)
    transport.send([tm(i, dest="parted") for i in range(1, 4)])
    assert [m.message_id for m in stored(ns, "parted")] == ["m-s1-1", "m-s1-2", "m-s1-3"]
    assert ns.entities["parted"].batches == [1, 1, 1]
    transport.send([tm(i, dest="parted") for i in range(4, 6)])  # remembered: no failed batch
    assert ns.entities["parted"].batches == [1, 1, 1, 1, 1]


def test_unbatched_destinations_can_be_declared(
    client: FakeServiceBusClient, ns: FakeNamespace
) -> None:
    t = ServiceBusTransport(client, unbatched=[DEST])
    t.send([tm(1), tm(2)])
    assert ns.entities[DEST].batches == [1, 1]


# --- duplicate detection and partial failures ----------------------------------------------------


def test_a_resend_is_dropped_by_duplicate_detection_within_the_window(
    transport: ServiceBusTransport, ns: FakeNamespace
) -> None:
    transport.send([tm(1), tm(2)])
    ns.advance(599)
    transport.send([tm(1), tm(2)])  # reported as a success
    assert [m.message_id for m in stored(ns)] == ["m-s1-1", "m-s1-2"]
    assert ns.entities[DEST].duplicates_dropped == 2
    ns.advance(601)  # past the 10 min window: the same ids are new again
    transport.send([tm(1)])
    assert [m.message_id for m in stored(ns)] == ["m-s1-1", "m-s1-2", "m-s1-1"]


def test_a_failure_on_a_later_destination_leaves_earlier_ones_sent_and_a_resend_is_deduplicated(
    transport: ServiceBusTransport, ns: FakeNamespace
) -> None:
    batch = [tm(1), tm(1, dest="not-created-yet", session="x"), tm(2)]
    with pytest.raises(UnknownDestinationError) as err:
        transport.send(batch)
    assert err.value.message_id == "m-x-1"
    assert "not-created-yet" in str(err.value)
    assert [m.message_id for m in stored(ns)] == ["m-s1-1", "m-s1-2"]  # accepted before
    ns.create("not-created-yet")
    transport.send(batch)  # the dispatcher re-sends the whole batch with the same ids
    assert [m.message_id for m in stored(ns)] == ["m-s1-1", "m-s1-2"]
    assert [m.message_id for m in stored(ns, "not-created-yet")] == ["m-x-1"]


def test_an_invalid_destination_name_fails_before_anything_is_sent(
    transport: ServiceBusTransport, ns: FakeNamespace
) -> None:
    for name in ("", "has space", "-leading", "x" * 261):
        with pytest.raises(UnknownDestinationError, match="cannot be a Service Bus"):
            transport.send([tm(1), tm(2, dest=name)])
    assert stored(ns) == []


# --- error classification ------------------------------------------------------------------------

RETRYABLE = [
    sb_errors.ServiceBusConnectionError,
    sb_errors.ServiceBusAuthenticationError,
    sb_errors.ServiceBusAuthorizationError,
    sb_errors.OperationTimeoutError,
    sb_errors.ServiceBusServerBusyError,
    sb_errors.ServiceBusCommunicationError,
    sb_errors.MessagingEntityDisabledError,
    sb_errors.SessionCannotBeLockedError,
    sb_errors.ServiceBusError,  # anything unlisted: retrying loses nothing
]
PERMANENT = [
    sb_errors.MessageSizeExceededError,
    sb_errors.ServiceBusQuotaExceededError,
    sb_errors.MessageLockLostError,
    sb_errors.SessionLockLostError,
    sb_errors.MessageNotFoundError,
]


@pytest.mark.parametrize("error", RETRYABLE, ids=lambda c: c.__name__)
def test_retryable_sdk_errors(
    transport: ServiceBusTransport, ns: FakeNamespace, error: type[Exception]
) -> None:
    ns.entities[DEST].fail_next.append(error(message="injected"))
    with pytest.raises(RetryableTransportError) as err:
        transport.send([tm(1), tm(2)])
    assert err.value.message_id == "m-s1-1"
    assert "m-s1-1" in str(err.value)
    assert error.__name__ in str(err.value)
    assert isinstance(err.value.__cause__, error)
    assert stored(ns) == []
    transport.send([tm(1), tm(2)])  # the same send succeeds later
    assert len(stored(ns)) == 2


@pytest.mark.parametrize("error", PERMANENT, ids=lambda c: c.__name__)
def test_permanent_sdk_errors(
    transport: ServiceBusTransport, ns: FakeNamespace, error: type[Exception]
) -> None:
    ns.entities[DEST].fail_next.append(error(message="injected"))
    with pytest.raises(PermanentTransportError) as err:
        transport.send([tm(1)])
    assert not isinstance(err.value, RetryableTransportError)
    assert err.value.message_id == "m-s1-1"
    assert isinstance(err.value.__cause__, error)


def test_an_unknown_entity_is_an_unknown_destination(transport: ServiceBusTransport) -> None:
    with pytest.raises(UnknownDestinationError, match="does not exist") as err:
        transport.send([tm(1, dest="missing")])
    assert err.value.message_id == "m-s1-1"
    assert isinstance(err.value.__cause__, sb_errors.MessagingEntityNotFoundError)


def test_a_disabled_entity_is_retryable(transport: ServiceBusTransport, ns: FakeNamespace) -> None:
    ns.entities[DEST].enabled = False
    with pytest.raises(RetryableTransportError, match="MessagingEntityDisabledError"):
        transport.send([tm(1)])
    ns.entities[DEST].enabled = True
    transport.send([tm(1)])


def test_a_session_entity_refuses_a_message_without_session(
    transport: ServiceBusTransport, ns: FakeNamespace
) -> None:
    ns.create("ordered", requires_session=True)
    with pytest.raises(RetryableTransportError, match="SessionId was not set") as err:
        transport.send([tm(1, dest="ordered", session="a"), tm(1, dest="ordered", session=None)])
    assert err.value.message_id == "m-a-1"
    assert stored(ns, "ordered") == []  # the batch is atomic within one entity
    transport.send([tm(1, dest="ordered", session="a")])
    assert [m.session_id for m in stored(ns, "ordered")] == ["a"]


def test_after_a_failure_the_sender_is_replaced(
    transport: ServiceBusTransport, ns: FakeNamespace, client: FakeServiceBusClient
) -> None:
    ns.entities[DEST].fail_next.append(sb_errors.ServiceBusConnectionError(message="reset"))
    with pytest.raises(RetryableTransportError):
        transport.send([tm(1)])
    transport.send([tm(1)])
    assert [s.closed for s in client.senders] == [True, False]


def test_a_link_failure_while_creating_the_batch_is_translated(
    transport: ServiceBusTransport, client: FakeServiceBusClient
) -> None:
    transport.send([tm(1)])
    client.senders[0].fail_create.append(sb_errors.OperationTimeoutError(message="slow"))
    with pytest.raises(RetryableTransportError, match="OperationTimeoutError") as err:
        transport.send([tm(2)])
    assert err.value.message_id == "m-s1-2"


# --- concurrency and lifecycle -------------------------------------------------------------------


def test_concurrent_sends_never_share_a_sender_at_once(
    transport: ServiceBusTransport, ns: FakeNamespace
) -> None:
    ns.create("other")

    def sender(k: int) -> None:
        for i in range(20):
            transport.send([tm(i, session=f"s{k}"), tm(i, dest="other", session=f"s{k}")])

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert ns.violations == []
    assert len(stored(ns)) == len(stored(ns, "other")) == 160


def test_close_closes_senders_but_not_a_borrowed_client(
    client: FakeServiceBusClient, ns: FakeNamespace
) -> None:
    ns.create("other")
    t = ServiceBusTransport(client)
    t.send([tm(1), tm(1, dest="other")])
    t.close()
    t.close()  # idempotent
    assert [s.closed for s in client.senders] == [True, True]
    assert not client.closed
    with pytest.raises(PermanentTransportError, match="closed") as err:
        t.send([tm(2)])
    assert err.value.message_id == "m-s1-2"


def test_a_factory_is_called_lazily_and_its_client_is_owned(ns: FakeNamespace) -> None:
    made: list[FakeServiceBusClient] = []

    def factory() -> FakeServiceBusClient:
        made.append(FakeServiceBusClient(ns))
        return made[-1]

    t = ServiceBusTransport(factory)
    assert made == []
    t.send([tm(1)])
    t.send([tm(2)])
    assert len(made) == 1
    t.close()
    assert made[0].closed


def test_an_owned_client_is_closed(client: FakeServiceBusClient) -> None:
    t = ServiceBusTransport(client, owns_client=True)
    t.close()
    assert client.closed


def test_the_transport_satisfies_the_protocol_and_is_not_declared_atomic(
    transport: ServiceBusTransport,
) -> None:
    from dispatcher.dispatch import atomic_batches

    assert isinstance(transport, Transport)
    assert atomic_batches(transport) is False


def test_a_non_client_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="ServiceBusClient"):
        ServiceBusTransport(42)  # type: ignore[arg-type]


# --- settings and dependencies -------------------------------------------------------------------

FAKE_CONN = (
    "Endpoint=sb://example.servicebus.windows.net/;SharedAccessKeyName=send;"
    "SharedAccessKey=c2VjcmV0c2VjcmV0c2VjcmV0"
)


def test_from_settings_without_a_connection_names_the_variable() -> None:
    with pytest.raises(ConfigurationError, match=ENV_CONNECTION_STRING):
        ServiceBusTransport.from_settings(None, env={})


def test_from_settings_builds_a_real_client_without_connecting() -> None:
    t = ServiceBusTransport.from_settings(
        None, env={ENV_CONNECTION_STRING: FAKE_CONN, ENV_TOPICS: "audit, events"}
    )
    try:
        assert t.topics == {"audit", "events"}
        assert t._owns_client
    finally:
        t.close()


def test_a_malformed_connection_string_is_named_but_not_echoed() -> None:
    with pytest.raises(ConfigurationError, match=ENV_CONNECTION_STRING) as err:
        ServiceBusTransport.from_settings(None, env={ENV_CONNECTION_STRING: "SharedAccessKey=hush"})
    assert "hush" not in str(err.value)


def test_a_namespace_needs_azure_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "azure.identity", None)
    with pytest.raises(MissingDependencyError, match="azure-identity"):
        ServiceBusTransport.from_settings(None, env={ENV_NAMESPACE: "x.servicebus.windows.net"})


@pytest.mark.parametrize("build", ["init", "from_settings"])
def test_missing_sdk_is_a_missing_dependency_with_the_install_hint(
    monkeypatch: pytest.MonkeyPatch, ns: FakeNamespace, build: str
) -> None:
    monkeypatch.setitem(sys.modules, "azure.servicebus", None)
    monkeypatch.setitem(sys.modules, "azure.servicebus.exceptions", None)
    make: Callable[[], object] = (
        (lambda: ServiceBusTransport(FakeServiceBusClient(ns)))
        if build == "init"
        else (
            lambda: ServiceBusTransport.from_settings(None, env={ENV_CONNECTION_STRING: FAKE_CONN})
        )
    )
    with pytest.raises(MissingDependencyError, match=r"pip install 'delta-outbox\[azure\]'"):
        make()


def test_the_runtime_builds_it_from_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from outbox.core.settings import Settings
    from outbox.wiring import Backends

    monkeypatch.setenv(ENV_CONNECTION_STRING, FAKE_CONN)
    with Backends(Settings(workspace=tmp_path, transport="servicebus")) as backends:
        assert isinstance(backends.transport(), ServiceBusTransport)
    monkeypatch.delenv(ENV_CONNECTION_STRING)
    with (
        pytest.raises(ConfigurationError, match=ENV_CONNECTION_STRING),
        Backends(Settings(workspace=tmp_path, transport="servicebus")) as backends,
    ):
        backends.transport()


# --- live ----------------------------------------------------------------------------------------

LIVE_SKIP = (
    "set OUTBOX_SERVICEBUS_CONNECTION_STRING and OUTBOX_SERVICEBUS_QUEUE to run the live Service "
    "Bus test"
)


@pytest.mark.live
@pytest.mark.skipif(
    not (os.environ.get(ENV_CONNECTION_STRING) and os.environ.get("OUTBOX_SERVICEBUS_QUEUE")),
    reason=LIVE_SKIP,
)
def test_live_send_and_receive_back() -> None:
    """Sends three messages (one repeated) and receives them back from a real queue.

    Set OUTBOX_SERVICEBUS_SESSIONS=1 when the queue requires sessions. With duplicate detection on
    the queue, the repeat is dropped; without it, it arrives twice (and the test says so).
    """
    from azure.servicebus import ServiceBusClient

    queue = os.environ["OUTBOX_SERVICEBUS_QUEUE"]
    run = uuid.uuid4().hex[:12]
    session = run if os.environ.get("OUTBOX_SERVICEBUS_SESSIONS") == "1" else None
    batch = [
        TransportMessage(
            message_id=f"{run}-{i}",
            destination=queue,
            body=f'{{"i":{i}}}'.encode(),
            subject="LiveTest",
            session_id=session,
            correlation_id=run,
            headers={"run": run},
        )
        for i in range(3)
    ]
    t = ServiceBusTransport.from_settings(None)
    try:
        t.send(batch)
        t.send(batch[:1])  # a re-send: duplicate detection should drop it
    finally:
        t.close()
    got: list[Any] = []
    with ServiceBusClient.from_connection_string(os.environ[ENV_CONNECTION_STRING]) as client:
        receiver = client.get_queue_receiver(queue, session_id=session, max_wait_time=10)
        with receiver:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(got) < 4:
                msgs = receiver.receive_messages(max_message_count=10, max_wait_time=5)
                if not msgs:
                    break
                for r in msgs:
                    receiver.complete_message(r)
                    if r.correlation_id == run:
                        got.append(r)
    ids = [r.message_id for r in got]
    assert ids[:3] == [m.message_id for m in batch], ids
    first = got[0]
    assert b"".join(first.body) == batch[0].body
    assert first.subject == "LiveTest"
    assert (first.application_properties or {}).get(b"run") == run.encode()
    assert first.session_id == session
    if len(ids) > 3:
        pytest.fail(f"the repeat of {ids[3]} was delivered: enable duplicate detection on {queue}")
