"""``outbox migrate`` for Service Bus, through ``ServiceBusAdministrationClient``: the command
queue, created with the properties the worker relies on, and the destination queues and topics
the settings declare (``servicebus_destinations``).

Idempotent: an existing entity whose properties suit is left alone. An existing entity that
conflicts is reported with every difference and never changed: sessions and duplicate detection
can only be set when an entity is created, and changing the others under running workers or
consumers would be a surprise. Every entity is checked before anything is reported, so one run
names all the conflicts (``Provisioned.conflicts``).

What counts as a conflict differs on purpose. The command queue is the outbox's own: it must have
exactly the settings' properties. A destination is shared with its consumers, so only what the
transport relies on is checked: duplicate detection (re-sends reuse message ids) with a window
at least ``duplicate_detection_window`` long, and, on a queue, sessions (each message's session id
is its ordering key; only a session queue keeps that order). Topics get no subscriptions here: a
topic's consumers own them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from migrations.runner import Provisioned
from outbox.core.errors import ConfigurationError
from outbox.core.settings import TOPIC_PREFIX

if TYPE_CHECKING:
    from outbox.core.settings import Settings

EntityKind = Literal["queue", "topic"]

COMMAND_QUEUE_FIX = (
    "recreate the queue (sessions and duplicate detection are set at creation only), "
    "or change the settings to match it, or use another command_queue"
)
DESTINATION_FIX = (
    "recreate it with these properties (they are set at creation only), or give the "
    "destination another name"
)


@dataclass(frozen=True)
class Destination:
    """One entry of ``servicebus_destinations``."""

    name: str
    kind: EntityKind


def destinations(settings: Settings) -> list[Destination]:
    """The declared destinations, in the order given: ``topic:NAME`` is a topic, else a queue."""
    return [
        Destination(entry[len(TOPIC_PREFIX) :], "topic")
        if entry.startswith(TOPIC_PREFIX)
        else Destination(entry, "queue")
        for entry in settings.servicebus_destinations
    ]


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


def destination_properties(settings: Settings, kind: EntityKind) -> dict[str, Any]:
    """What a destination is created with (the rest stay the service's defaults)."""
    wanted: dict[str, Any] = {
        "requires_duplicate_detection": True,
        "duplicate_detection_history_time_window": timedelta(
            seconds=settings.duplicate_detection_window
        ),
    }
    if kind == "queue":
        wanted["requires_session"] = True
    return wanted


def provision_commands(settings: Settings) -> Provisioned:
    """``outbox migrate`` for the Service Bus command queue: ``settings.command_queue``, created
    when missing, compared when present (the command queue backend's provisioner)."""
    done = Provisioned()
    with _admin() as admin:
        _ensure(
            admin,
            done,
            settings.command_queue,
            "queue",
            wanted=wanted_properties(settings),
            suits=_exact,
            fix=COMMAND_QUEUE_FIX,
        )
    return done


def provision_destinations(settings: Settings) -> Provisioned:
    """``outbox migrate`` for every declared destination (``servicebus_destinations``): created
    when missing, compared when present. Nothing declared: nothing to do, no connection."""
    done = Provisioned()
    declared = destinations(settings)
    if not declared:
        return done
    with _admin() as admin:
        for dest in declared:
            _ensure(
                admin,
                done,
                dest.name,
                dest.kind,
                wanted=destination_properties(settings, dest.kind),
                suits=_suits_destination,
                fix=DESTINATION_FIX,
            )
    return done


@contextmanager
def _admin() -> Iterator[Any]:
    from dispatcher.servicebus.connection import connect

    client, admin = connect()
    try:
        yield admin
    finally:
        for c in (admin, client):
            c.close()


def provision_command_queue(admin: Any, settings: Settings) -> list[str]:
    """Create ``settings.command_queue`` if missing; returns what was done (nothing if present).
    ``ConfigurationError`` lists the conflicts of an existing queue."""
    done = Provisioned()
    _ensure(
        admin,
        done,
        settings.command_queue,
        "queue",
        wanted=wanted_properties(settings),
        suits=_exact,
        fix=COMMAND_QUEUE_FIX,
    )
    if done.conflicts:
        raise ConfigurationError(done.conflicts[0])
    return done.actions


# --- one entity ---------------------------------------------------------------------------------


def _exact(key: str, have: Any, want: Any) -> bool:
    return bool(have == want)


def _suits_destination(key: str, have: Any, want: Any) -> bool:
    """A longer duplicate-detection window than asked for is fine (it drops more repeats)."""
    if key == "duplicate_detection_history_time_window" and have is not None:
        return bool(have >= want)
    return bool(have == want)


def _ensure(
    admin: Any,
    done: Provisioned,
    name: str,
    kind: EntityKind,
    *,
    wanted: Mapping[str, Any],
    suits: Callable[[str, Any, Any], bool],
    fix: str,
) -> None:
    from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

    get = admin.get_queue if kind == "queue" else admin.get_topic
    create = admin.create_queue if kind == "queue" else admin.create_topic
    try:
        existing = get(name)
    except ResourceNotFoundError:
        try:
            create(name, **wanted)
        except ResourceExistsError:
            # Created meanwhile (another migrate), or the name is taken by the other kind of
            # entity: queues and topics share one namespace of names.
            try:
                existing = get(name)
            except ResourceNotFoundError:
                done.conflicts.append(
                    f"Service Bus {kind} {name!r} cannot be created: an entity of another kind "
                    f"has that name (fix: {fix})"
                )
                return
        else:
            done.actions.append(_created(name, kind, wanted))
            return
    differences = [
        f"{key} is {getattr(existing, key, None)!r}, the settings want {value!r}"
        for key, value in wanted.items()
        if not suits(key, getattr(existing, key, None), value)
    ]
    if differences:
        done.conflicts.append(
            f"Service Bus {kind} {name!r} exists with conflicting properties (left unchanged): "
            + "; ".join(differences)
            + f" (fix: {fix})"
        )


def _seconds(value: Any) -> str:
    return f"{value.total_seconds():g}s" if isinstance(value, timedelta) else str(value)


def _created(name: str, kind: EntityKind, wanted: Mapping[str, Any]) -> str:
    parts = []
    if wanted.get("requires_session"):
        parts.append("sessions")
    parts.append(
        f"duplicate detection {_seconds(wanted['duplicate_detection_history_time_window'])}"
    )
    if "max_delivery_count" in wanted:
        parts.append(f"max delivery count {wanted['max_delivery_count']}")
    if "lock_duration" in wanted:
        parts.append(f"lock {_seconds(wanted['lock_duration'])}")
    return f"created Service Bus {kind} {name!r} ({', '.join(parts)})"
