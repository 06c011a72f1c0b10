"""``CommandQueue``: what the ``run-dispatcher`` worker, the runtime's retry path and the rescuer's
sink need from the queue that carries ``ProcessDocument`` commands.

Why one protocol over the three ports: the same worker code serves the SQL queue (``SqlQueue``) and
Service Bus (``dispatcher.servicebus.command_queue.ServiceBusCommandQueue``); it sends,
receives, settles and renews locks (``QueueSender`` + ``QueueReceiver``), asks the depth to know
when it is idle, and gets a chance at housekeeping and at sizing its connections.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from dispatcher.queue.messages import QueueStats
from dispatcher.queue.ports import QueueReceiver, QueueSender


@runtime_checkable
class CommandQueue(QueueSender, QueueReceiver, Protocol):
    def stats(self, queue: str | None = None) -> dict[str, QueueStats]:
        """Depth per queue (or of ``queue`` only); a queue that holds nothing is not listed."""
        ...

    def maybe_forget_expired_duplicates(self) -> int:
        """Housekeeping when it is due (a broker that does its own returns 0); never raises."""
        ...

    def ensure_pool_size(self, size: int) -> None:
        """Room for ``size`` concurrent calls (connections); a no-op where there is no pool."""
        ...
