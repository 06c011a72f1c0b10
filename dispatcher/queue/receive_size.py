"""How many messages ``Consumer.run_forever`` asks for at its next receive when no one named a
number (``max_messages=None``).

Why it adapts: a receive is a write transaction (on SQLite an fsync), so with a fixed 16 a
receive is most of what a quick handler's message costs (``benchmarks/consumer.py`` before
this, ``benchmarks/results/consumer_before_receive_size.json``: one handler drained SQLite at
16,373 msg/s with receives of 16, 34,258 with receives of 100). A
large fixed batch has its own price: the messages it holds wait for this consumer's handlers
(their locks renewed) while another consumer could be running them. So the size grows only
while that price is small, like TCP's slow start: it doubles after a receive that came back
full (the queue is deep) whose batch was handled within ``QUICK`` seconds, up to ``GROWN``;
it falls back to the base after a receive that came back short (the queue is nearly drained:
what is left goes to whoever asks) or a batch that took longer (what is held would wait). A
message received at the largest size waits about two ``QUICK`` at most for its turn, while the
handlers stay as quick as the batch before (one that turns slow holds the rest of its batch, as
at any size, and the next receive asks for the base).
"""

from __future__ import annotations

#: A batch handled within this many seconds lets the next receive ask for twice as many.
QUICK = 0.1
#: The most a grown receive asks for (a named ``max_messages`` or ``concurrency`` above it wins).
GROWN = 100


class ReceiveSize:
    """The next receive's size: ``size``, between ``base`` and ``top`` (``base`` when it may
    not grow)."""

    def __init__(self, base: int, *, grows: bool) -> None:
        self.base = base
        self.top = max(base, GROWN) if grows else base
        self.size = base
        self._full = False

    def received(self, asked: int, got: int) -> None:
        """A receive asked for ``asked`` and got ``got``: a short one means the queue is nearly
        drained, so the next asks for the base again."""
        self._full = got >= asked
        if not self._full:
            self.size = self.base

    def handled(self, seconds: float) -> None:
        """A batch's handlers took ``seconds``: quick after a full receive, the next asks for
        twice as many (up to ``top``); slow, for the base."""
        if seconds > QUICK:
            self.size = self.base
        elif self._full:
            self.size = min(self.top, self.size * 2)
