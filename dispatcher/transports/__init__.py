"""Where outbox messages go. The port is ``Transport`` (a ``typing.Protocol``) with its message
``TransportMessage``; the adapters (``memory``, ``sql``, ``servicebus``) are imported by name
when wanted, so importing the port loads no SDK and no database driver.
"""

from dispatcher.transports.base import Transport, TransportMessage

__all__ = ["Transport", "TransportMessage"]
