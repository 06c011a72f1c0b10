"""What ``outbox run-gateway mqtt`` takes and reports: the gateway's options (checked once), its
run's counters and the dead-letter reasons it gives (docs/devices.md).

Why apart from the gateway: the CLI, the demo and the benchmark build options without the loop,
and the loop's module stays about serving.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dispatcher.mqtt.transport import check_template
from outbox.core.errors import ConfigurationError

DEVICE_DID_NOT_ACK = "DeviceDidNotAck"
EXPIRED = "Expired"
NO_DEVICE = "NoDevice"
INVALID_DEVICE_ID = "InvalidDeviceId"
PUBLISH_REFUSED = "PublishRefused"
#: The header that gives a message's expiry (ISO 8601, UTC when naive).
EXPIRES_AT = "expires_at"
#: The longest lock the queue grants (``QueueOptions``): a retry interval is one lock.
MAX_RETRY_INTERVAL = 300.0


@dataclass(frozen=True)
class GatewayOptions:
    """What ``outbox run-gateway mqtt`` takes (durations in seconds).

    ``status_topic`` None: no presence (every device counts as online). ``ack_group`` None: a
    plain subscription to the acks (every gateway process gets every ack). ``max_in_flight``
    bounds the tasks this process has published and not yet seen settled (when it binds, a place
    goes to the task that has waited longest since it became ready: ``places``); ``batch`` the
    tasks one step takes from the queue.
    """

    destination: str
    topic: str = "devices/{session}/tasks"
    ack_topic: str = "devices/{session}/tasks/ack"
    status_topic: str | None = "devices/{session}/status"
    ack_group: str | None = "outbox-gateway"
    retry_interval: float = 10.0
    max_tries: int = 5
    max_in_flight: int = 100_000
    batch: int = 500
    poll_interval: float = 0.5
    time_to_live: float | None = None
    publish_timeout: float = 10.0

    def checked(self) -> GatewayOptions:
        templates = [("--topic", self.topic), ("--ack-topic", self.ack_topic)]
        if self.status_topic is not None:
            templates.append(("--status-topic", self.status_topic))
        for name, template in templates:
            check_template(template, name=name)
            if template.count("{session}") != 1:
                raise ConfigurationError(
                    f"{name} {template!r} must contain {{session}} exactly once",
                    hint="e.g. devices/{session}/tasks: each device has its own topic",
                )
        if len({t for _, t in templates}) != len(templates):
            raise ConfigurationError(
                "--topic, --ack-topic and --status-topic must differ",
                hint="e.g. devices/{session}/tasks, devices/{session}/tasks/ack and "
                "devices/{session}/status",
            )
        if not 0 < self.retry_interval <= MAX_RETRY_INTERVAL:
            raise ConfigurationError(
                f"--retry-interval {self.retry_interval:g}s must be above 0 and at most "
                f"{MAX_RETRY_INTERVAL:g}s",
                hint="a retry interval is one queue lock, and a lock lasts at most 5 minutes",
            )
        if self.max_tries < 1 or self.max_in_flight < 1 or self.batch < 1:
            raise ConfigurationError(
                "max tries, max in flight and batch must be positive",
                hint="e.g. --max-tries 5 --max-in-flight 100000 --batch 500",
            )
        if self.ack_group is not None and not _topic_level(self.ack_group):
            raise ConfigurationError(
                f"--ack-group {self.ack_group!r} is not one topic level",
                hint="letters, digits, '-', '_' and '.', without '/', '+' or '#'",
            )
        return self

    @property
    def ack_subscription(self) -> str:
        filt = self.ack_topic.replace("{session}", "+")
        return filt if self.ack_group is None else f"$share/{self.ack_group}/{filt}"


def _topic_level(name: str) -> bool:
    return bool(name) and not any(c in name for c in "/+#\0")


@dataclass
class GatewayStats:
    """What a run did."""

    completed: int = 0
    publishes: int = 0
    republishes: int = 0
    returned: int = 0
    unknown_acks: int = 0
    repeated_acks: int = 0
    malformed: int = 0
    publish_failures: int = 0
    lock_lost: int = 0
    went_online: int = 0
    went_offline: int = 0
    dead_lettered: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
