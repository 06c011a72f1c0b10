"""``outbox migrate`` for Service Bus: the command queue, created with the properties the worker
relies on, through ``ServiceBusAdministrationClient``.

Idempotent: an existing queue whose properties match is left alone. An existing queue that
conflicts (no sessions, no duplicate detection, another window, delivery count or lock duration)
is reported with every difference and never changed: sessions and duplicate detection can only be
set when an entity is created, and changing the others under running workers would be a surprise.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from outbox.core.errors import ConfigurationError

if TYPE_CHECKING:
    from outbox.core.settings import Settings


def wanted_properties(settings: Settings) -> dict[str, Any]:
    return {
        "requires_session": True,
        "requires_duplicate_detection": True,
        "duplicate_detection_history_time_window": timedelta(
            seconds=settings.duplicate_detection_window
        ),
        "max_delivery_count": settings.max_delivery_count,
        "lock_duration": timedelta(seconds=settings.lock_duration),
    }


def provision_command_queue(admin: Any, settings: Settings) -> list[str]:
    """Create ``settings.command_queue`` if missing; returns what was done (nothing if present).
    ``ConfigurationError`` lists the conflicts of an existing queue."""
    from azure.core.exceptions import ResourceNotFoundError

    name = settings.command_queue
    wanted = wanted_properties(settings)
    try:
        existing = admin.get_queue(name)
    except ResourceNotFoundError:
        admin.create_queue(name, **wanted)
        return [
            f"created Service Bus queue {name!r} (sessions, duplicate detection "
            f"{settings.duplicate_detection_window:g}s, max delivery count "
            f"{settings.max_delivery_count}, lock {settings.lock_duration:g}s)"
        ]
    conflicts = [
        f"{key} is {getattr(existing, key, None)!r}, the settings want {value!r}"
        for key, value in wanted.items()
        if getattr(existing, key, None) != value
    ]
    if conflicts:
        raise ConfigurationError(
            f"Service Bus queue {name!r} exists with conflicting properties (left unchanged): "
            + "; ".join(conflicts),
            hint="recreate the queue (sessions and duplicate detection are set at creation only), "
            "or change the settings to match it, or use another command_queue",
        )
    return []
