"""What a third party's backend imports: its registration, its settings and the shipped examples.

A backend registered through an entry point (groups ``delta_outbox.transports``,
``.command_queues``, ``.checkpoint_stores``, ``.rescuer_engines``, ``.claim_logs``,
``.inboxes``) is a ``Backend``; its settings are a frozen dataclass subclassing
``BackendOptions`` with ``setting(default, "sentence")`` fields, read from its own section of
``outbox.toml`` and its own ``OUTBOX_<SECTION>_*`` variables (docs/configuration.md). The shipped
backends' options types are here too, both as examples and for programs that read them
(``ob.settings.options(KafkaOptions)``). Contract suites to prove a backend are in
``outbox.testing.contracts``. Names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.core.lazy import lazy_exports

if TYPE_CHECKING:
    from outbox.core.settings_backends import (
        CosmosOptions,
        KafkaOptions,
        MqttOptions,
        ServiceBusOptions,
    )
    from outbox.core.settings_sections import BackendOptions
    from outbox.core.settings_values import setting
    from outbox.wiring.registry import Backend, Registry

_EXPORTS = {
    "Backend": "outbox.wiring.registry",
    "Registry": "outbox.wiring.registry",
    "BackendOptions": "outbox.core.settings_sections",
    "setting": "outbox.core.settings_values",
    "CosmosOptions": "outbox.core.settings_backends",
    "KafkaOptions": "outbox.core.settings_backends",
    "MqttOptions": "outbox.core.settings_backends",
    "ServiceBusOptions": "outbox.core.settings_backends",
}

__all__ = [
    "Backend",
    "BackendOptions",
    "CosmosOptions",
    "KafkaOptions",
    "MqttOptions",
    "Registry",
    "ServiceBusOptions",
    "setting",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
