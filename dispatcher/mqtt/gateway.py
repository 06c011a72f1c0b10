"""The MQTT device gateway: one task in flight per device, completed only by the device's ack, with
every task's state in the queue's database and none in a thread (docs/devices.md).

Devices that handle one task at a time are usually served from a hand-made message table (status,
a try count, a publish loop that skips a device with a task in flight). The SQL queue has that
table's parts, so the gateway is glue around one loop:

* **one in flight per device** is the queue's session rule: the session id is the device; a
  receive hands out only a session's head and nothing of a session whose head is locked;
* **the state is stored**: a publish holds the task's queue lock for ``retry_interval``, so the
  lock's end *is* the next try, ``delivery_count`` is the tries and ``locked_at`` the last try.
  Waiting for an ack holds no thread and no slot, only that row: one loop serves any number of
  devices, and every gateway process and ``outbox devices`` read the same state;
* **a retry** is the lock running out: the task is in the line again and the next receive (by any
  gateway process) publishes the same id again; after ``max_tries`` publishes without an ack it
  is dead-lettered ``DeviceDidNotAck``. A silent device costs one row lock, not a slot, so it
  holds up no other device; and where ``max_in_flight`` places are fewer than the ready tasks,
  a place goes to the task that became ready first (a retry: when its last try ran out), not to
  the oldest in the line (dispatcher/mqtt/places.py);
* **an ack** names the message id; it completes the device's delivered task in the database
  (``SqlSessions.complete_delivered``), whichever gateway process published it, before or after
  a restart. Acks are read through a shared subscription (``$share/<group>/...``), so each goes
  to one gateway process. An ack that names no task delivered to that device changes nothing and
  gets one log line;
* **presence**: devices keep a retained status (Last Will ``offline``, ``online`` once
  connected; dispatcher/mqtt/presence.py). An offline device's session is paused, so its tasks
  wait without being published or using up tries, and the task it had out goes back to the line
  with that try taken back; ``online`` resumes it;
* **expiry**: a message past its ``expires_at`` header (ISO 8601) or older than
  ``time_to_live`` is dead-lettered ``Expired`` and never published (checked before each publish);
* a message without a session has no device: ``NoDevice``; a session id that cannot be one topic
  level (``/``, ``+``, ``#``): ``InvalidDeviceId``; one the broker refuses for good:
  ``PublishRefused``.

SIGTERM/SIGINT stops the loop after its step; tasks out stay locked until their next try, and
their acks still complete them (here after a restart, or in another gateway process).

Why one module: the loop's step (statuses, acks, PUBACKs, receive, publish) and the network
thread's intake share one set of in-memory tables (the publishes waiting for a PUBACK, the news
from devices); apart, each part would reach into the others' state. What holds none of it lives
apart: the options and counters (``gateway_options``), the places and who gets them
(``places``), and a task's own rules (``tasks``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from dispatcher.mqtt import gateway_metrics as metrics
from dispatcher.mqtt.acks import ack_id, ack_problem, session_matcher
from dispatcher.mqtt.client import MqttBroker, MqttConnection, Publish
from dispatcher.mqtt.gateway_options import (
    DEVICE_DID_NOT_ACK,
    EXPIRED,
    INVALID_DEVICE_ID,
    NO_DEVICE,
    PUBLISH_REFUSED,
    GatewayOptions,
    GatewayStats,
)
from dispatcher.mqtt.places import Places
from dispatcher.mqtt.presence import OFFLINE, status_of
from dispatcher.mqtt.tasks import expired, transport_message
from dispatcher.mqtt.transport import MqttTransport, topic_for
from dispatcher.queue.messages import ReceivedMessage
from dispatcher.queue.sessions import StateChange
from outbox.core.clock import Clock, SystemClock
from outbox.core.errors import (
    LockLostError,
    PermanentTransportError,
    RetryableTransportError,
    TransportError,
)
from outbox.core.runloop import RunLoop, stop_on_signals

if TYPE_CHECKING:
    from paho.mqtt.client import MQTTMessage, MQTTMessageInfo

    from dispatcher.queue.sql_queue import SqlQueue

log = logging.getLogger("outbox.gateway")

#: The options and counters are the gateway's API, wherever they are defined.
__all__ = ["GatewayOptions", "GatewayStats", "MqttGateway"]

#: Acks completed lately, so a device's repeated ack is told apart from one for an unknown task.
_RECENT = 10_000
#: How much of a device's bad payload a log line shows.
_SHOWN = 64


class MqttGateway:
    """Serves the devices of one queue destination over MQTT (see the module docstring)."""

    def __init__(
        self,
        queue: SqlQueue,
        options: GatewayOptions,
        *,
        broker: MqttBroker,
        clock: Clock | None = None,
        observe_ack: Callable[[float], None] | None = None,
    ) -> None:
        """``observe_ack`` (benchmarks, metrics) gets each ack's round trip in seconds, from this
        process's last publish of the task to the ack's arrival.

        The queue's lock duration becomes ``retry_interval`` and its ``max_delivery_count`` at
        least ``max_tries + 1`` (the gateway dead-letters first, with its own reason): give the
        gateway a ``SqlQueue`` of its own."""
        self.queue = queue
        self.observe_ack = observe_ack
        self.options = options.checked()
        self.clock = clock or SystemClock()
        self.stats = GatewayStats()
        queue.lock_duration = timedelta(seconds=self.options.retry_interval)
        queue.max_delivery_count = max(queue.max_delivery_count, self.options.max_tries + 1)
        self.places = Places()
        self._recent: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._events: deque[tuple[str, str, str, datetime]] = deque()
        # publishes waiting for their PUBACK, in publish order
        self._pending: deque[tuple[ReceivedMessage, Publish, MQTTMessageInfo, float]] = deque()
        self._guard = threading.Lock()  # the counters the network thread bumps
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._match_ack = session_matcher(self.options.ack_topic)
        status = self.options.status_topic
        self._match_status = session_matcher(status) if status else None
        subscriptions = [self.options.ack_subscription]
        client_id = f"outbox-gateway-{uuid.uuid4().hex[:12]}"
        self._sync_topic = f"outbox-gateway/{client_id}/sync"
        self._synced = threading.Event()
        if status:  # the sync topic last: its echo comes after the retained statuses
            subscriptions += [status.replace("{session}", "+"), self._sync_topic]
        self.connection = MqttConnection(
            broker, client_id=client_id, subscriptions=subscriptions, on_message=self._on_message
        )
        self.transport = MqttTransport(
            broker,
            topic=self.options.topic,
            timeout=self.options.publish_timeout,
            clock=self.clock,
            connection=self.connection,
        )

    # --- running ------------------------------------------------------------------------------

    def run(self, *, once: bool = False, handle_signals: bool = True) -> GatewayStats:
        """Serve until stopped (``stop()``, SIGTERM/SIGINT); ``once``: until nothing is ready
        and every task this process published is settled (acked, dead-lettered or given back)."""
        guard = stop_on_signals(self.stop) if handle_signals else contextlib.nullcontext()
        with guard:
            self.learn_presence()
            self._serve(once)
        return self.stats

    def _serve(self, once: bool) -> None:
        loop = RunLoop(
            self.step,
            clock=self.clock,
            idle_wait=self.options.poll_interval,
            on_error=self._unavailable,
            stop_event=self._stop,
            wake=self._wake,
        )

        def settled() -> bool:
            return not self.places.held(self.clock.now()) and not self._pending

        loop.run(until_idle=settled if once else None, handle_signals=False)

    def learn_presence(self, timeout: float = 10.0) -> None:
        """Before the first receive, take in every device's retained status, so a device known to
        be offline gets nothing. The broker sends the retained statuses as it takes the status
        subscription; a message published afterwards to the gateway's own sync topic comes back
        after them. Bounded: a broker that is slow to answer only costs the race this avoids
        (a task published to an offline device is given back when its status comes)."""
        if self._match_status is None or not self.connection.connected:
            return
        try:
            self.connection.publish([Publish(self._sync_topic, b"sync", label="presence sync")])
        except TransportError as e:  # down, or an ACL that refuses the sync topic
            log.warning("gateway: could not sync presence before starting: %s", e)
            return
        deadline = time.monotonic() + timeout
        while not self._synced.wait(0.1):
            if self.stopping:
                return
            if time.monotonic() > deadline:
                log.warning("gateway: the retained statuses did not come within %gs", timeout)
                break
        self._apply_events()

    def stop(self) -> None:
        """Stop after the step in progress; tasks out keep their locks (see the docstring)."""
        self._stop.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        self.connection.close()

    @staticmethod
    def _unavailable(error: Exception, delay: float) -> None:
        log.warning("gateway: retrying in %.1fs: %s", delay, error)

    def wait_for_news(self, timeout: float) -> bool:
        """Wait until a device's message came in (or ``stop``), at most ``timeout`` seconds."""
        news = self._wake.wait(timeout)
        self._wake.clear()
        return news

    def devices_in_flight(self) -> int:
        """Devices with a task this process published and no ack yet (``devices_in_flight``)."""
        return len(self.places)

    # --- one step -----------------------------------------------------------------------------

    def step(self) -> int:
        """Apply the devices' news (statuses, acks), then publish what is ready; 0 when idle."""
        self._settle_publishes()
        work = self._apply_events()
        if not self.stopping:
            work += self._publish_ready()
        return work

    def _apply_events(self) -> int:
        taken: list[tuple[str, str, str, datetime]] = []
        while self._events:
            taken.append(self._events.popleft())
        statuses: dict[str, str] = {}
        acks: dict[tuple[str, str], datetime] = {}
        for kind, device, value, at in taken:
            if kind == "status":
                statuses[device] = value
            else:
                acks.setdefault((device, value), at)
        try:
            if statuses:
                self._apply_statuses(statuses)
            if acks:
                self._apply_acks(acks)
        except Exception:  # the database failed: keep the news for the next step's retry
            self._events.extendleft(reversed(taken))
            raise
        return len(statuses) + len(acks)

    def _apply_statuses(self, statuses: dict[str, str]) -> None:
        dest = self.options.destination
        changed = self.queue.sessions.set_states(
            dest,
            [StateChange(d, paused=s == OFFLINE, state=s) for d, s in statuses.items()],
            at=self.clock.now(),
        )
        offline = [d for d in changed if statuses[d] == OFFLINE]
        online = len(changed) - len(offline)
        if offline:
            back = self.queue.sessions.return_to_line(dest, offline)
            self.stats.returned += back
            metrics.count("tasks_returned", back)
            self.places.release_devices(set(offline))
        self.stats.went_offline += len(offline)
        self.stats.went_online += online
        if changed:
            log.info("presence: %d device(s) now online, %d offline", online, len(offline))
            for d in changed:
                log.debug("device %s is %s", d, statuses[d])

    def _apply_acks(self, acks: dict[tuple[str, str], datetime]) -> None:
        unknown = set(self.queue.sessions.complete_delivered(self.options.destination, list(acks)))
        done = 0
        for key, at in acks.items():
            if key in unknown:
                if key in self._recent:
                    self.stats.repeated_acks += 1
                    log.debug("repeated ack from device %s for %s", *key)
                else:
                    self.stats.unknown_acks += 1
                    metrics.count("unknown_acks")
                    log.warning(
                        "ack from device %s for %s: no such task was delivered to it; ignored",
                        *key,
                    )
                continue
            done += 1
            out = self.places.release(key)
            if out is not None:
                seconds = max(0.0, (at - out.at).total_seconds())
                metrics.observe_ack(seconds)
                if self.observe_ack is not None:
                    self.observe_ack(seconds)
            self._recent[key] = None
        while len(self._recent) > _RECENT:
            self._recent.popitem(last=False)
        self.stats.completed += done
        metrics.count("tasks_acked", done)

    def _publish_ready(self) -> int:
        """Receive what is ready and publish it, as many tasks as there are free places; when
        there are fewer places than ready tasks, the tasks that became ready first win them
        (dispatcher/mqtt/places.py) and the others go back to the line, their try not counted."""
        now = self.clock.now()
        room = self.options.max_in_flight - self.places.held(now)
        if room <= 0:
            return 0
        dest, batch = self.options.destination, self.options.batch
        ask, seen = min(batch, room), 0
        ready: list[tuple[ReceivedMessage, Publish]] = []
        while ask > 0:
            got = self.queue.receive(dest, ask)
            seen += len(got)
            for msg in got:
                item = self._checked(msg)
                if item is not None:
                    ready.append((msg, item))
            if len(got) < ask or self.places.enough(ready, room, now, got[-1].enqueued_at):
                break
            ask = min(batch - seen, seen)  # look twice as far, within one batch a step
        chosen, passed = self.places.choose(ready, room, now)
        if passed:
            log.debug("gateway: %d task(s) wait for a place, ready later", len(passed))
            self.queue.sessions.return_to_line(dest, [m.session_id for m in passed if m.session_id])
        if chosen:
            self._publish(chosen)
        return seen

    def _checked(self, msg: ReceivedMessage) -> Publish | None:
        """The publish of ``msg``, or None when it was dead-lettered instead."""
        opts = self.options
        if msg.session_id is None:
            self._dead_letter(msg, NO_DEVICE, "the message has no session id, so no device")
            return None
        try:
            topic_for(opts.topic, session=msg.session_id)
        except ValueError as e:
            self._dead_letter(msg, INVALID_DEVICE_ID, str(e))
            return None
        if expired(msg, self.clock.now(), opts.time_to_live):
            self._dead_letter(msg, EXPIRED, "past its expiry before the device acked it")
            return None
        tries = msg.delivery_count - 1  # this receive is the next try
        if tries >= opts.max_tries:
            self._dead_letter(
                msg,
                DEVICE_DID_NOT_ACK,
                f"device {msg.session_id} did not ack after {tries} publishes, "
                f"{opts.retry_interval:g}s apart",
            )
            return None
        try:
            return self.transport.publication(transport_message(msg, opts.destination))
        except PermanentTransportError as e:
            self._dead_letter(msg, PUBLISH_REFUSED, str(e))
            return None

    def _publish(self, ready: list[tuple[ReceivedMessage, Publish]]) -> None:
        """Publish without waiting for the PUBACKs: ``_settle_publishes`` takes them as they
        come, so the loop goes on taking in acks meanwhile (waiting stalled it for a third of a
        run of 10,000 devices)."""
        at = self.clock.now()  # before: an instant ack may beat the PUBACK
        sent = time.monotonic()  # a network timeout is wall-clock time, as paho's own are
        try:
            infos = self.connection.start_publish([item for _, item in ready])
        except RetryableTransportError:  # the broker, not the devices: not a try
            self._give_back([m for m, _ in ready])
            raise
        for (msg, item), info in zip(ready, infos, strict=True):
            assert msg.session_id is not None
            assert msg.locked_until is not None
            self.places.take((msg.session_id, msg.message_id), at, msg.locked_until)
            self._pending.append((msg, item, info, sent))
        again = sum(1 for m, _ in ready if m.delivery_count > 1)
        self.stats.publishes += len(ready)
        self.stats.republishes += again
        metrics.count("tasks_published", len(ready))
        if again:
            metrics.count("tasks_republished", again)

    def _settle_publishes(self) -> None:
        """Take in the PUBACKs that came, in publish order: a refusal for good dead-letters the
        task (``PublishRefused``); one for now, or no PUBACK within ``publish_timeout``, gives it
        back to the line with the try not counted (the broker's failing, not the device's)."""
        failed: list[ReceivedMessage] = []
        deadline = time.monotonic() - self.options.publish_timeout
        while self._pending:
            msg, item, info, sent = self._pending[0]
            settled, error = self.connection.outcome(item, info)
            if not settled:
                if sent > deadline:
                    break
                error = RetryableTransportError(
                    f"message {msg.message_id}: no PUBACK from {self.connection.broker.url} "
                    f"within {self.options.publish_timeout:g}s",
                    message_id=msg.message_id,
                )
            self._pending.popleft()
            if error is None:
                continue
            assert msg.session_id is not None
            self.places.release((msg.session_id, msg.message_id))
            if isinstance(error, PermanentTransportError):
                self._dead_letter(msg, PUBLISH_REFUSED, str(error))
            else:
                failed.append(msg)
                log.warning("gateway: %s; it goes out again", error)
        if failed:
            self._give_back(failed)

    def _give_back(self, msgs: list[ReceivedMessage]) -> None:
        self.stats.publish_failures += len(msgs)
        metrics.count("publish_failures", len(msgs))
        sessions = [m.session_id for m in msgs if m.session_id is not None]
        back = self.queue.sessions.return_to_line(self.options.destination, sessions)
        self.stats.returned += back
        metrics.count("tasks_returned", back)

    # --- what devices send (paho's network thread: quick, no database work) --------------------

    def _on_message(self, message: MQTTMessage) -> None:
        self.handle(message.topic, bytes(message.payload))

    def handle(self, topic: str, payload: bytes) -> None:
        """Take in one message from a device (an ack or a status) for the next ``step``."""
        if topic == self._sync_topic:
            self._synced.set()
            return
        device = self._match_ack(topic)
        if device is not None:
            mid = ack_id(payload)
            if mid is None:
                why = ack_problem(payload)
                self._bad(f"malformed ack on {topic} ({why}): {payload[:_SHOWN]!r}; ignored")
                return
            self._events.append(("ack", device, mid, self.clock.now()))
            self._wake.set()
            return
        device = self._match_status(topic) if self._match_status is not None else None
        if device is not None:
            state = status_of(payload)
            if state is None:
                if payload:  # an empty payload clears a retained status: nothing to say
                    self._bad(f"unreadable status on {topic}: {payload[:_SHOWN]!r}; ignored")
                return
            self._events.append(("status", device, state, self.clock.now()))
            self._wake.set()
            return
        self._bad(f"message on {topic}: no device's ack or status topic; ignored")

    def _bad(self, line: str) -> None:
        with self._guard:
            self.stats.malformed += 1
        metrics.count("bad_messages")
        log.warning("gateway: %s", line)

    # --- settling -----------------------------------------------------------------------------

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
