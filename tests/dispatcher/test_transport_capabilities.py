"""What a transport declares (issue 43): ``atomic_batches``, ``coalesce_sends`` and
``adopt_settings`` are read in one place (``dispatcher.transports.base.Capabilities.of`` and
``adopt_settings``), and a transport that declares none of them gets the defaults: one document
per send, no settings to adopt. The dispatcher is driven directly (no Delta table) except where
the runtime hands over the settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dispatcher.dispatch import Dispatcher
from dispatcher.transports.base import (
    Capabilities,
    Transport,
    TransportMessage,
    adopt_settings,
)
from outbox.app.facade import Outbox
from outbox.core.settings import Settings
from outbox.testing.faulty import FaultyTransport
from tests.dispatcher.test_key_order import Marks, row


class Bare:
    """A third-party transport written against the protocol alone: send and close."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def send(self, batch: Sequence[TransportMessage]) -> None:
        self.batches.append([m.message_id for m in batch])

    def close(self) -> None:
        pass


class Atomic(Bare):
    atomic_batches = True


class Pipelining(Bare):
    coalesce_sends = True


class Adopting(Bare):
    def __init__(self) -> None:
        super().__init__()
        self.adopted: list[Settings] = []

    def adopt_settings(self, settings: Settings) -> None:
        self.adopted.append(settings)


def sends(transport: Bare) -> list[list[str]]:
    Dispatcher(Marks(), transport, max_in_flight=1).dispatch([row("A", "k"), row("B", "j")])
    return transport.batches


def test_a_transport_that_declares_nothing_gets_the_defaults() -> None:
    bare = Bare()
    assert isinstance(bare, Transport)
    assert Capabilities.of(bare) == Capabilities() == Capabilities(False, False)
    assert not Capabilities().coalesces
    assert sends(bare) == [["A-1"], ["B-1"]]  # one document per send
    adopt_settings(bare, Settings())  # nothing to adopt, and no error


def test_a_declared_capability_is_honoured() -> None:
    assert Capabilities.of(Atomic()) == Capabilities(atomic_batches=True)
    assert sends(Atomic()) == [["A-1", "B-1"]]
    assert Capabilities.of(Pipelining()) == Capabilities(coalesce_sends=True)
    assert sends(Pipelining()) == [["A-1", "B-1"]]


def test_a_wrapper_passes_on_what_its_transport_declares() -> None:
    assert Capabilities.of(FaultyTransport(Atomic())) == Capabilities(atomic_batches=True)
    assert Capabilities.of(FaultyTransport(Pipelining())) == Capabilities(coalesce_sends=True)
    assert Capabilities.of(FaultyTransport(Bare())) == Capabilities()


def test_the_runtime_hands_its_settings_to_a_transport_that_adopts_them(workspace: Path) -> None:
    adopting = Adopting()
    with Outbox.open(workspace, transport=adopting, default_destination="d") as ob:
        assert ob.runtime.transport is adopting
        assert adopting.adopted == [ob.settings]
    with Outbox.open(workspace, transport=Bare(), default_destination="d") as ob:
        with ob.unit_of_work() as uow:
            uow.create("a", type="T").send("E", {})
        report = ob.runtime.last_report
        assert report is not None
        assert report.ok
