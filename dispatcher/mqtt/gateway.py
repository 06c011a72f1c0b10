"""The MQTT device gateway: one task in flight per device, completed only by the device's ack.

Devices that handle one task at a time are usually served from a hand-made message table (status
Scheduled/Published/Failed, a try count, a publish loop that skips a topic with a message in
flight). The SQL queue already has that table's parts, so the gateway is only glue:

* **one in flight per device** is the queue's session rule: the session id is the device, a
  receive hands out only a session's head and none of a session whose head is locked, so while
  this (or any other) gateway process holds a device's task, no one gets the next one;
* **order** is the session's FIFO; **tries** are publishes of the same message id while holding
  its lock, every ``retry_interval`` without an ack, up to ``max_tries`` (then the message is
  dead-lettered ``DeviceDidNotAck``); a holder that dies loses its lock, and the next holder
  publishes the same id again (a device is idempotent: a repeat costs time, not correctness);
* **the lock is renewed** (``LockRenewer``) while the gateway waits for an ack;
* **expiry**: a message past its ``expires_at`` header (ISO 8601) or older than
  ``time_to_live`` is dead-lettered ``Expired`` and never published (checked before each publish);
* a message without a session has no device: dead-lettered ``NoDevice``; one the broker refuses
  for good: ``PublishRefused``.

Acks arrive on ``ack_topic`` (``{session}`` becomes ``+``) from any device to every gateway
process; each completes only what it holds, so two gateways need no coordination beyond the
queue. An ack names the message id: ``{"message_id": "..."}``, ``{"id": "..."}`` or the bare id.

Each of the ``concurrency`` slots runs the shared ``RunLoop`` (receive one task, see it through,
repeat), in a thread of its own when there are several (``run_loops``). SIGTERM/SIGINT stops
receiving; a slot waiting for an ack finishes that wait (until its next re-publish would be due)
and then completes on the ack or abandons the task, releasing its lock at once for another
gateway.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from dispatcher.mqtt import gateway_metrics as metrics
from dispatcher.mqtt.acks import ack_id, session_matcher
from dispatcher.mqtt.client import MqttBroker, MqttConnection
from dispatcher.mqtt.transport import MqttTransport, check_template
from dispatcher.queue.lock_renewer import LockRenewer
from dispatcher.queue.messages import ReceivedMessage
from dispatcher.queue.ports import QueueReceiver
from dispatcher.transports.base import TransportMessage
from outbox.core.clock import Clock, SystemClock, utc
from outbox.core.errors import (
    ConfigurationError,
    LockLostError,
    PermanentTransportError,
    RetryableTransportError,
)
from outbox.core.runloop import TICK, RunLoop, run_loops

if TYPE_CHECKING:
    from paho.mqtt.client import MQTTMessage

log = logging.getLogger("outbox.gateway")

DEVICE_DID_NOT_ACK = "DeviceDidNotAck"
EXPIRED = "Expired"
NO_DEVICE = "NoDevice"
PUBLISH_REFUSED = "PublishRefused"
#: The header that gives a message's expiry (ISO 8601, UTC when naive).
EXPIRES_AT = "expires_at"


@dataclass(frozen=True)
class GatewayOptions:
    """What ``outbox run-gateway mqtt`` takes (durations in seconds)."""

    destination: str
    topic: str = "devices/{session}/tasks"
    ack_topic: str = "devices/{session}/tasks/ack"
    retry_interval: float = 10.0
    max_tries: int = 5
    concurrency: int = 16
    poll_interval: float = 0.5
    time_to_live: float | None = None
    publish_timeout: float = 10.0
    renew_check_interval: float = 1.0

    def checked(self) -> GatewayOptions:
        check_template(self.topic, name="--topic")
        check_template(self.ack_topic, name="--ack-topic")
        for name, template in (("--topic", self.topic), ("--ack-topic", self.ack_topic)):
            if template.count("{session}") != 1:
                raise ConfigurationError(
                    f"{name} {template!r} must contain {{session}} exactly once",
                    hint="e.g. devices/{session}/tasks: each device has its own topic",
                )
        if self.retry_interval <= 0 or self.max_tries < 1 or self.concurrency < 1:
            raise ConfigurationError(
                "retry interval, max tries and concurrency must be positive",
                hint="e.g. --retry-interval 10s --max-tries 5 --concurrency 16",
            )
        return self


@dataclass
class GatewayStats:
    """What a run did."""

    completed: int = 0
    publishes: int = 0
    republishes: int = 0
    abandoned: int = 0
    unknown_acks: int = 0
    publish_failures: int = 0
    lock_lost: int = 0
    dead_lettered: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _TaskInFlight:
    """A task in flight: the message, its ack signal, and its tries by this holder."""

    msg: ReceivedMessage
    acked: threading.Event = field(default_factory=threading.Event)
    tries: int = 0
    last_publish: datetime | None = None


class MqttGateway:
    """Serves the devices of one queue destination over MQTT (see the module docstring)."""

    def __init__(
        self,
        queue: QueueReceiver,
        options: GatewayOptions,
        *,
        broker: MqttBroker,
        clock: Clock | None = None,
        observe_ack: Callable[[float], None] | None = None,
    ) -> None:
        """``observe_ack`` (benchmarks, metrics) gets each ack's round trip in seconds, from the
        last publish of the task to the ack's arrival; it runs on the network thread."""
        self.queue = queue
        self.observe_ack = observe_ack
        self.options = options.checked()
        self.clock = clock or SystemClock()
        self.stats = GatewayStats()
        self._held: dict[str, _TaskInFlight] = {}
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._match_ack = session_matcher(options.ack_topic)
        ack_filter = options.ack_topic.replace("{session}", "+")
        self.connection = MqttConnection(
            broker, subscriptions=[ack_filter], on_message=self._on_ack
        )
        self.transport = MqttTransport(
            broker,
            topic=options.topic,
            timeout=options.publish_timeout,
            clock=self.clock,
            connection=self.connection,
        )

    # --- running ------------------------------------------------------------------------------

    def run(self, *, once: bool = False, handle_signals: bool = True) -> GatewayStats:
        """Serve until stopped (``stop()``, SIGTERM/SIGINT); ``once``: until nothing is ready."""
        with LockRenewer(
            self.queue,
            self._held_messages,
            self.clock,
            # renewals start at half the lock: look often enough to catch that half
            check_interval=min(
                self.options.renew_check_interval,
                self.queue.lock_duration.total_seconds() / 4,
            ),
        ):
            run_loops(
                self.options.concurrency,
                self._make_slot,
                self.stop,
                handle_signals=handle_signals,
                name="outbox-gateway",
                once=once,
            )
        return self.stats

    def _make_slot(self) -> RunLoop:
        """One slot's loop: receive one task, see it through, repeat."""
        return RunLoop(
            self.serve_one,
            clock=self.clock,
            idle_wait=self.options.poll_interval,
            on_error=self._unavailable,
            stop_event=self._stop,
        )

    def stop(self) -> None:
        """Stop receiving; waits in progress finish, then their tasks complete or are abandoned."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        self.connection.close()

    @staticmethod
    def _unavailable(error: Exception, delay: float) -> None:
        log.warning("gateway: retrying in %.1fs: %s", delay, error)

    def devices_in_flight(self) -> int:
        """Devices with a task out and no ack yet (the ``devices_in_flight`` gauge)."""
        with self._guard:
            return len({h.msg.session_id for h in self._held.values()})

    def _held_messages(self) -> list[ReceivedMessage]:
        with self._guard:
            return [h.msg for h in self._held.values()]

    # --- one task -----------------------------------------------------------------------------

    def serve_one(self) -> int:
        """Receive one device's next task and see it through; 0 when none is ready."""
        if self.stopping:
            return 0
        got = self.queue.receive(self.options.destination, 1)
        if not got:
            return 0
        self._deliver(got[0])
        return 1

    def _deliver(self, msg: ReceivedMessage) -> None:
        if msg.session_id is None:
            self._dead_letter(msg, NO_DEVICE, "the message has no session id, so no device")
            return
        held = _TaskInFlight(msg)
        token = msg.lock_token or msg.message_id
        with self._guard:  # by lock: after a lost lock two slots may hold the same message id
            self._held[token] = held
        try:
            self._see_through(held)
        finally:
            with self._guard:
                self._held.pop(token, None)

    def _see_through(self, held: _TaskInFlight) -> None:
        msg, opts = held.msg, self.options
        while True:
            if held.acked.is_set():  # an ack that came just as the wait ran out still counts
                self._complete(held)
                return
            if self._expired(msg):
                self._dead_letter(msg, EXPIRED, "past its expiry before the device acked it")
                return
            if held.tries >= opts.max_tries:
                self._dead_letter(
                    msg,
                    DEVICE_DID_NOT_ACK,
                    f"device {msg.session_id} did not ack after {held.tries} publishes, "
                    f"{opts.retry_interval:g}s apart",
                )
                return
            if self.stopping:
                self._abandon(held)
                return
            held.last_publish = self.clock.now()  # before: an instant ack may beat the PUBACK
            try:
                self.transport.send([self._transport_message(msg)])
            except PermanentTransportError as e:
                self._dead_letter(msg, PUBLISH_REFUSED, str(e))
                return
            except RetryableTransportError as e:  # the broker, not the device: not a try
                self.stats.publish_failures += 1
                metrics.count("publish_failures")
                log.warning("gateway: %s; trying again in %gs", e, opts.retry_interval)
            else:
                held.tries += 1
                self.stats.publishes += 1
                metrics.count("tasks_published")
                if held.tries > 1:
                    self.stats.republishes += 1
                    metrics.count("tasks_republished")
            self._wait(held.acked, opts.retry_interval)

    def _transport_message(self, msg: ReceivedMessage) -> TransportMessage:
        return TransportMessage(
            message_id=msg.message_id,
            destination=self.options.destination,
            body=msg.body,
            subject=msg.subject,
            content_type=msg.content_type,
            session_id=msg.session_id,
            correlation_id=msg.correlation_id,
            headers={str(k): str(v) for k, v in msg.headers.items()},
        )

    def _expired(self, msg: ReceivedMessage) -> bool:
        now = self.clock.now()
        if self.options.time_to_live is not None and now >= msg.enqueued_at + timedelta(
            seconds=self.options.time_to_live
        ):
            return True
        raw = msg.headers.get(EXPIRES_AT)
        if raw is None:
            return False
        try:
            return now >= utc(datetime.fromisoformat(str(raw)))
        except ValueError:
            log.warning("message %s: unreadable %s %r; ignored", msg.message_id, EXPIRES_AT, raw)
            return False

    def _wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait for ``event`` up to ``seconds`` by the clock (a test clock skips ahead)."""
        deadline = self.clock.now() + timedelta(seconds=seconds)
        while not event.is_set():
            left = (deadline - self.clock.now()).total_seconds()
            if left <= 0:
                return False
            if isinstance(self.clock, SystemClock):
                event.wait(left)
            else:
                self.clock.sleep(min(left, TICK))
        return True

    # --- acks (paho's network thread: quick, no database work) ----------------------------------

    def _on_ack(self, message: MQTTMessage) -> None:
        device = self._match_ack(message.topic)
        mid = ack_id(bytes(message.payload))
        with self._guard:
            holders = [
                h
                for h in self._held.values()
                if h.msg.message_id == mid and h.msg.session_id == device
            ]
            if not holders:
                self.stats.unknown_acks += 1
                metrics.count("unknown_acks")
                log.debug("ack for %s from %s: not a task this gateway holds", mid, device)
        for held in holders:
            if held.last_publish is not None:
                seconds = (self.clock.now() - held.last_publish).total_seconds()
                metrics.observe_ack(seconds)
                if self.observe_ack is not None:
                    self.observe_ack(seconds)
            held.acked.set()

    # --- settling -----------------------------------------------------------------------------

    def _complete(self, held: _TaskInFlight) -> None:
        try:
            self.queue.complete(held.msg)
            self.stats.completed += 1
            metrics.count("tasks_acked")
        except LockLostError as e:  # the next holder publishes it again; the device re-acks
            self.stats.lock_lost += 1
            metrics.count("lock_lost")
            log.warning("gateway: %s", e)

    def _abandon(self, held: _TaskInFlight) -> None:
        try:
            self.queue.abandon(held.msg)
            self.stats.abandoned += 1
            metrics.count("tasks_abandoned")
        except LockLostError as e:
            self.stats.lock_lost += 1
            metrics.count("lock_lost")
            log.warning("gateway: %s", e)

    def _dead_letter(self, msg: ReceivedMessage, reason: str, description: str) -> None:
        log.warning("gateway: dead-lettering %s (%s): %s", msg.message_id, reason, description)
        try:
            self.queue.dead_letter(msg, reason, description)
        except LockLostError as e:
            self.stats.lock_lost += 1
            metrics.count("lock_lost")
            log.warning("gateway: %s", e)
            return
        metrics.count("tasks_dead_lettered", reason=reason)
        counts = Counter(self.stats.dead_lettered)
        counts[reason] += 1
        self.stats.dead_lettered = dict(counts)
