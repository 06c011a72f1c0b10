"""How a third party uses the testing kit: a toy transport, written here from scratch, runs the
shipped transport contract by subclassing it; and the contract catches a toy that loses or
reorders messages.

Nothing here imports from ``tests``: this file stands where a plugin's own test suite would.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from dispatcher.transports.base import Transport, TransportMessage
from outbox.core.errors import UnknownDestinationError
from outbox.testing.contracts.transport import DEST, TransportContract


class ToyTransport:
    """An in-memory broker: settles a whole batch under a lock, refuses unknown destinations."""

    def __init__(self, destinations: Sequence[str]) -> None:
        self.queues: dict[str, list[TransportMessage]] = {d: [] for d in destinations}
        self.lock = threading.Lock()

    def send(self, batch: Sequence[TransportMessage]) -> None:
        with self.lock:
            for m in batch:  # check everything first: a batch is all-or-nothing
                if m.destination not in self.queues:
                    raise UnknownDestinationError(
                        f"message {m.message_id}: no destination {m.destination!r}",
                        message_id=m.message_id,
                    )
            for m in self.prepare(batch):
                self.queues[m.destination].append(m)

    def prepare(self, batch: Sequence[TransportMessage]) -> list[TransportMessage]:
        """What the broker stores for ``batch``; the broken toys below get this wrong."""
        return list(batch)

    def close(self) -> None:
        pass


class TestToyTransport(TransportContract):
    """The whole shipped contract, against the toy: this is all a third party writes."""

    def make_transport(self) -> Transport:
        return ToyTransport([DEST])

    def delivered(self, transport: Transport, destination: str = DEST) -> list[TransportMessage]:
        assert isinstance(transport, ToyTransport)
        return list(transport.queues[destination])


class LosesTheLastMessage(ToyTransport):
    def prepare(self, batch: Sequence[TransportMessage]) -> list[TransportMessage]:
        return list(batch)[:-1]


class ReversesTheBatch(ToyTransport):
    def prepare(self, batch: Sequence[TransportMessage]) -> list[TransportMessage]:
        return list(reversed(batch))


class BrokenToyContract(TestToyTransport):
    """Not collected (no ``Test`` prefix): the tests below run its methods by hand."""

    def __init__(self, broken: type[ToyTransport]) -> None:
        self.broken = broken

    def make_transport(self) -> Transport:
        return self.broken([DEST])


@pytest.mark.parametrize("broken", [LosesTheLastMessage, ReversesTheBatch])
def test_the_contract_catches_a_broken_batch(broken: type[ToyTransport]) -> None:
    with pytest.raises(AssertionError):
        BrokenToyContract(broken).test_batch_order_is_kept_per_session()


def test_the_contract_catches_a_lost_message() -> None:
    with pytest.raises(AssertionError):
        BrokenToyContract(LosesTheLastMessage).test_send_settles_and_keeps_every_field()
