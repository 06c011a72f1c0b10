"""What a ``ServiceBusCommandQueue`` takes besides its clients: ``ServiceBusQueueOptions``.

One frozen value, which every role of the queue (``sending``, ``receiving``, ``command_queue``)
reads its settings from; ``ServiceBusCommandQueue(client, admin, max_wait_time=15)`` still takes
each field as a keyword (``ServiceBusQueueKeywords``), applied over ``options``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from outbox.core.clock import Clock


@dataclass(frozen=True)
class ServiceBusQueueOptions:
    """``command_queue``: the queue's name (``settings.command_queue``); ``clock`` defaults to the
    system clock; ``max_wait_time``: how long one SDK receive waits for a message, in seconds."""

    command_queue: str = "outbox-commands"
    clock: Clock | None = None
    lock_duration: float = 30.0
    max_delivery_count: int = 10
    max_body_bytes: int = 256 * 1024
    max_wait_time: float = 1.0


class ServiceBusQueueKeywords(TypedDict, total=False):
    """``ServiceBusQueueOptions``' fields as ``ServiceBusCommandQueue``'s keyword arguments."""

    command_queue: str
    clock: Clock | None
    lock_duration: float
    max_delivery_count: int
    max_body_bytes: int
    max_wait_time: float
