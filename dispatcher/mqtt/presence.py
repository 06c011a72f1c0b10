"""Device presence over MQTT: the contract a device follows so the gateway knows whether it is
online, and the reading of what it publishes (docs/devices.md says the contract for device
authors).

The contract, the field's usual one (Last Will plus a retained status):

* a device connects with a **Last Will** on its status topic (``devices/{session}/status`` by
  default): payload ``offline``, QoS 1, **retained**; the broker publishes it when the device
  drops off without saying goodbye (power, network, a crash, a missed keepalive);
* once connected it publishes ``online`` on the same topic, QoS 1, **retained**;
* on a clean shutdown it publishes ``offline`` (retained) before it disconnects.

Retained, so a gateway that starts (or restarts) learns every device's last state from the
broker at once. A payload may also be JSON ``{"status": "online"}``. A device that never
publishes a status counts as online: it gets its tasks, and if it never acks them they are
retried and dead-lettered by policy like any silent device.
"""

from __future__ import annotations

import json

ONLINE = "online"
OFFLINE = "offline"
_STATES = (ONLINE, OFFLINE)
#: Longer payloads are not a status: read no further (a device's mistake, not ours to parse).
_MAX_STATUS = 256


def status_of(payload: bytes) -> str | None:
    """``online``, ``offline``, or None when ``payload`` is neither (plain or JSON ``status``)."""
    if not payload or len(payload) > _MAX_STATUS:
        return None
    text = payload.decode("utf-8", "replace").strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            return None
        value = data.get("status") if isinstance(data, dict) else None
        text = value.strip() if isinstance(value, str) else ""
    word = text.lower()
    return word if word in _STATES else None
