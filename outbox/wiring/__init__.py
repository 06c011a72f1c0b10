"""Settings to backends, in one place: the floor between the dispatcher and rescuer (which define
the ports and the shipped adapters) and the roof (which opens what the settings name).

- ``Backends(settings)`` builds, shares and closes one process's backends: transport, command
  queue, command sink, checkpoint store, rescuer engine, claim log, inbox, and ``migrate`` with
  their provisioning;
- ``registry`` holds the ``Registry`` and ``Backend`` types: a third party registers a backend
  with an entry point (groups ``delta_outbox.transports``, ``.command_queues``,
  ``.checkpoint_stores``, ``.rescuer_engines``, ``.claim_logs``, ``.inboxes``) and proves it
  with the contract suites in ``outbox.testing.contracts``;
- ``builtin`` registers the shipped backends, and ``check(settings)`` validates every name a
  settings object gives.

No module outside this package compares a backend's name (docs/design.md, "Layers").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.core.lazy import lazy_exports

if TYPE_CHECKING:
    from outbox.wiring.backends import Backends
    from outbox.wiring.builtin import check
    from outbox.wiring.registry import Backend, Registry

__all__ = ["Backend", "Backends", "Registry", "check"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Backends": "outbox.wiring.backends",
        "check": "outbox.wiring.builtin",
        "Backend": "outbox.wiring.registry",
        "Registry": "outbox.wiring.registry",
    },
)
