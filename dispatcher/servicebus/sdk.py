"""The Service Bus transport's edge with the SDK: the environment it reads, the parts of
``azure.servicebus`` it uses (as protocols a real ``ServiceBusClient`` satisfies, so tests can
pass a fake), and the guarded import of the optional package.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from outbox.core.errors import MissingDependencyError

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusMessageBatch

#: Environment variables read by ``from_settings`` (not ``Settings`` fields: secrets stay in env).
ENV_CONNECTION_STRING = "OUTBOX_SERVICEBUS_CONNECTION_STRING"
ENV_NAMESPACE = "OUTBOX_SERVICEBUS_NAMESPACE"  # fully qualified, with azure-identity
ENV_TOPICS = "OUTBOX_SERVICEBUS_TOPICS"  # comma-separated destinations that are topics

INSTALL_HINT = "pip install 'delta-outbox[azure]'"


class SenderLike(Protocol):
    def create_message_batch(
        self, max_size_in_bytes: int | None = None
    ) -> ServiceBusMessageBatch: ...

    def send_messages(
        self, message: ServiceBusMessageBatch, *, timeout: float | None = None
    ) -> None: ...

    def close(self) -> None: ...


class ClientLike(Protocol):
    def get_queue_sender(self, queue_name: str) -> SenderLike: ...

    def get_topic_sender(self, topic_name: str) -> SenderLike: ...

    def close(self) -> None: ...


def load() -> tuple[ModuleType, ModuleType]:
    """``azure.servicebus`` and its ``exceptions`` module, or ``MissingDependencyError``."""
    try:
        import azure.servicebus as sb
        import azure.servicebus.exceptions as sb_errors
    except ImportError as e:
        raise MissingDependencyError(
            f"the Azure Service Bus transport needs the azure-servicebus package ({e})",
            hint=INSTALL_HINT,
        ) from e
    return sb, sb_errors


#: Builds (client, administration client) instead of the SDK; set by ``use_clients`` (the kit's
#: fake, or a test's own), read by every ``from_settings`` of the Service Bus command queue.
_factories: list[Callable[[], tuple[Any, Any]]] = []


@contextmanager
def use_clients(factory: Callable[[], tuple[Any, Any]]) -> Iterator[None]:
    """Within the block, adapters built from settings use ``factory()``'s clients (tests and
    in-process proofs run the CLI against ``outbox.testing.servicebus_fake`` this way)."""
    _factories.append(factory)
    try:
        yield
    finally:
        _factories.remove(factory)


def client_factory() -> Callable[[], tuple[Any, Any]] | None:
    return _factories[-1] if _factories else None
