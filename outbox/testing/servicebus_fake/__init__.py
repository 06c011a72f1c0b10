"""A faithful in-memory fake of the Azure Service Bus SDK surface the outbox uses, send and receive.

Why a fake: no local server speaks to the Python SDK (it insists on the ``$cbs`` claims-based
security node; docs/servicebus.md), and Microsoft's emulator needs Docker. So the kit ships this
broker model and the adapters are tested against it, plus live tests when a namespace is
configured. Each behaviour below is the documented one (docs/servicebus.md says where each was
checked):

* sessions: a session-enabled queue refuses a message without a session id; a session receiver
  locks a whole session (``NEXT_AVAILABLE_SESSION`` takes an unlocked session with an active
  message, else ``OperationTimeoutError``; a named session held elsewhere is
  ``SessionCannotBeLockedError``); the session lock lasts ``lock_duration`` and is renewed with
  ``receiver.session.renew_lock()``; a message's lock *is* its session's lock
  (``renew_message_lock`` is a ``TypeError``); after the lock expires, settling raises
  ``SessionLockLostError`` and the session's messages are delivered again;
* delivery counts: the broker counts deliveries from 1; the AMQP header (what the Python SDK's
  ``delivery_count`` returns) carries that count minus one. Abandon and lock expiry count a
  delivery; closing a session receiver without settling does not. When a counted delivery reaches
  ``max_delivery_count`` the message moves to the dead-letter subqueue with reason
  ``MaxDeliveryCountExceeded``;
* settling twice is ``MessageAlreadySettled``; settling on a closed receiver is ``ValueError``;
* scheduled messages (``scheduled_enqueue_time_utc`` or ``schedule_messages``) are invisible until
  their time; ``cancel_scheduled_messages`` removes them;
* defer: ``defer_message`` releases the lock and sets the message aside (its delivery count kept);
  ``receive_messages`` and ``NEXT_AVAILABLE_SESSION`` skip it; only
  ``receive_deferred_messages(sequence_numbers)`` returns it, locked and counted, and a session
  receiver only its own session's; a number that is not a deferred message is
  ``MessageNotFoundError``; abandoning it, or its lock expiring, leaves it deferred; deferring a
  message delivered ``max_delivery_count`` times dead-letters it (Azure/azure-service-bus#375); the
  runtime properties count deferred messages as active (they "remain in the main queue along with
  all other active messages", Microsoft Learn "Message deferral");
* duplicate detection drops a repeated ``message_id`` inside the window and reports success;
* the dead-letter subqueue of a session-enabled queue is received without sessions;
* ``application_properties`` come back with bytes keys and bytes string values;
* administration: queues and topics share one namespace of names; creating an existing name is
  ``ResourceExistsError`` (HTTP 409), reading a missing one ``ResourceNotFoundError``; a property
  left out of ``create_queue``/``create_topic`` takes the service's default (no sessions, no
  duplicate detection, a 1 minute lock, 10 deliveries, a 10 minute window);
* senders: ``create_message_batch`` returns the SDK's real ``ServiceBusMessageBatch``; a topic
  stores what it accepted in ``FakeServiceBus.topics[name].accepted`` (the fake models no
  subscriptions, so nothing is received from a topic).

Time comes from an injected clock (``ManualClock``); nothing waits: where the service would wait
``max_wait_time`` for a session or a message, the fake answers at once.

The parts, one module each, all sharing one broker state under one lock (a settlement checks
the session table a receive wrote): ``entities`` (what the broker stores and reports), ``broker``
(its state and rules), ``receiver`` (receivers, sessions, received messages, settlement),
``sender`` (senders), ``admin`` (the administration client) and ``namespace`` (``FakeServiceBus``,
the client that hands out senders and receivers, and ``clients`` for ``sdk.use_clients``). Import
everything from here: ``from outbox.testing.servicebus_fake import FakeServiceBus, clients``.
"""

from __future__ import annotations

from outbox.testing.servicebus_fake.admin import FakeAdministrationClient
from outbox.testing.servicebus_fake.broker import Broker
from outbox.testing.servicebus_fake.entities import (
    LINK_MAX_BYTES,
    MAX_DELIVERY_REASON,
    SERVICE_QUEUE_DEFAULTS,
    QueueSpec,
    RuntimeProperties,
    Stored,
    TopicSpec,
)
from outbox.testing.servicebus_fake.namespace import FakeServiceBus, FakeServiceBusClient, clients
from outbox.testing.servicebus_fake.receiver import FakeReceivedMessage, FakeReceiver, FakeSession
from outbox.testing.servicebus_fake.sender import FakeSender

__all__ = [
    "LINK_MAX_BYTES",
    "MAX_DELIVERY_REASON",
    "SERVICE_QUEUE_DEFAULTS",
    "Broker",
    "FakeAdministrationClient",
    "FakeReceivedMessage",
    "FakeReceiver",
    "FakeSender",
    "FakeServiceBus",
    "FakeServiceBusClient",
    "FakeSession",
    "QueueSpec",
    "RuntimeProperties",
    "Stored",
    "TopicSpec",
    "clients",
]
