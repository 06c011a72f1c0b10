"""A fleet of simulated MQTT devices, each on its own connection, all in one Python process.

Why it exists: ``DeviceSimulator`` plays every device over one shared connection, which cannot show
what a gateway meets in the field: one session, one Last Will and one retained status per device,
and a broker holding thousands of connections. ``DeviceFleet`` opens one MQTT 5 connection per
device on raw ``asyncio`` streams (a paho client per device would cost a thread and a socket pair
each; 10,000 of them would not fit), so a test can bring up 10,000 devices on one event loop.

Modules: ``packets`` (the MQTT 5 framing the devices speak: no client anyone else should use),
``state`` (options, the per-device record, the errors), ``loop`` (each device's connection on the
fleet's event loop) and ``control`` (``DeviceFleet``: what a test calls, from any thread).

The device contract it plays (the gateway relies on it). Topics are templates in which
``{session}`` is the device id; the defaults are ``devices/{session}/tasks`` (tasks),
``devices/{session}/tasks/ack`` (acks) and ``devices/{session}/status`` (status).

- A device connects with client id ``{prefix}{device}``, clean start, a keepalive (60 s by
  default) and a Last Will on its status topic: payload ``offline``, QoS 1, retained.
- Once the broker accepts it (CONNACK reason 0), it subscribes to its own task topic at QoS 1 and
  then publishes ``online``, retained, QoS 1, on its status topic.
- A task is a PUBLISH (QoS 1) on its task topic. Its message id is the MQTT 5 user property
  ``outbox-message-id`` (else the payload, as UTF-8). The device PUBACKs every task.
- To ack a task it publishes ``{"message_id": "<id>"}`` on its ack topic at QoS 1.
- Behaviours: ``"ack"`` acks each new task after ``ack_delay`` seconds (0: at once) and a task
  it already acked again at once (counted in ``repeats``, not as a new task); ``"silent"`` receives
  and PUBACKs tasks but never acks them; ``"offline"`` connects and publishes ``online`` like the
  others, then drops its TCP connection without a DISCONNECT, so the broker publishes its will
  (``offline``), and stays away until ``reconnect``.
- ``go_offline(device)`` drops any connected device the same abrupt way (its will fires; an ack it
  had scheduled is lost with it); ``reconnect(device)`` connects it again and publishes ``online``
  (a device that started ``"offline"`` comes back acking).
- Each device records its tasks and acks, and the most distinct tasks it held unacked at once
  (``max_in_flight``): 1 for an acking device unless the gateway broke its one-at-a-time promise.
- ``close()`` sends DISCONNECT on every connection (no will fires) and publishes nothing more.

Use::

    with DeviceFleet("mqtt://127.0.0.1:1883", {f"d{i}": "ack" for i in range(10_000)}) as fleet:
        ...  # the gateway sends one task to each device
        assert fleet.wait_for(lambda f: f.acked_count() == 10_000, timeout=120)

The devices run on an event loop in one daemon thread; the methods are called from any other
thread. Only the protocol a device needs is spoken: QoS 0/1 (no QoS 2), no topic aliases (the
CONNECT allows none), no reconnect on a lost connection (it is counted in ``lost_connections``).
Idle devices send PINGREQ from one timer for the whole fleet, not one each.

Descriptors: each device holds a socket, so ``start`` raises the soft ``RLIMIT_NOFILE`` to the hard
one when short (and fails, saying so, when the hard one is too low). The sockets take numbers from
1024 up when the limit allows: paho's network loop uses ``select()``, which cannot watch a socket
numbered 1024 or more, so a paho gateway in the same process connecting after the fleet would
otherwise retry forever without a word.
"""

from testkit.fleet.control import DeviceFleet
from testkit.fleet.state import (
    BEHAVIOURS,
    MESSAGE_ID,
    OFFLINE,
    ONLINE,
    DeviceRecord,
    FleetError,
    FleetKeywords,
    FleetOptions,
)

__all__ = [
    "BEHAVIOURS",
    "MESSAGE_ID",
    "OFFLINE",
    "ONLINE",
    "DeviceFleet",
    "DeviceRecord",
    "FleetError",
    "FleetKeywords",
    "FleetOptions",
]
