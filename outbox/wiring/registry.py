"""A registry of backends of one kind, keyed by the name a setting gives.

Why a registry: before it, six modules compared backend names and five turned settings into
objects, so every new backend touched all of them. Now each kind (transports, command queues,
checkpoint stores, rescuer engines, claim logs, inboxes) is one ``Registry``; the shipped backends
register in ``outbox.wiring.builtin`` and a third party adds one with a Python entry point in the
kind's group, for example in its ``pyproject.toml``::

    [project.entry-points."delta_outbox.transports"]
    kafka = "my_package.outbox_kafka:BACKEND"

where ``BACKEND`` is a ``Backend`` (name, builder, settings check, extra, provisioners, and its
``options`` type: the section of the settings file and the ``OUTBOX_<SECTION>_*`` variables it
reads, ``outbox.core.settings_sections``). The shipped contract suites
(``outbox.testing.contracts``) say what the backend must pass. Entry points are read once, the
first time a name is not among the registered ones, so a process that only uses shipped backends
never scans the installed distributions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from migrations.runner import Provisioned
from outbox.core.errors import ConfigurationError, MissingDependencyError
from outbox.core.settings import Settings, did_you_mean
from outbox.core.settings_sections import SECTIONS, BackendOptions

if TYPE_CHECKING:
    from dispatcher.queue.command_queue import CommandQueue
    from dispatcher.queue.sql_queue import SqlQueue
    from outbox.core.clock import Clock

log = logging.getLogger("outbox.wiring")

B = TypeVar("B")  # what a backend's builder is (its signature differs per kind)


class Context(Protocol):
    """What a builder gets (``outbox.wiring.Backends`` is one): the settings, the clock, the
    process's shared SQL queue and command queue, and the Spark session if there is one."""

    settings: Settings
    clock: Clock
    spark_session: Any

    @property
    def sql_queue(self) -> SqlQueue: ...

    def command_queue(self) -> CommandQueue: ...


def _no_check(settings: Settings) -> None:
    return None


@dataclass(frozen=True)
class Backend(Generic[B]):
    """One backend: its ``name`` (the setting's value), its ``build`` function, the ``check`` of
    the settings it needs (raises ``ConfigurationError``), and the optional ``extra`` that
    installs its dependencies (named in the error when an import fails)."""

    name: str
    build: B
    check: Callable[[Settings], None] = _no_check
    extra: str | None = None
    description: str = ""
    #: What ``outbox migrate`` creates for this backend (queues, containers...): each returns
    #: an object with ``actions`` and ``conflicts`` lists (``migrations.runner.Provisioned``).
    provision: tuple[Callable[[Settings], Provisioned], ...] = ()
    #: (transports) Can its client run on Spark executors, many at once? A Spark pipeline then
    #: sends from them (``outbox.app.spark.executors``); else from the driver.
    on_executors: Callable[[Settings], bool] = lambda _settings: False
    #: Its own settings: a ``BackendOptions`` type, read from its section (``[kafka]``) and its
    #: variables (``OUTBOX_KAFKA_*``); the builder reads ``settings.options(KafkaOptions)``.
    options: type[BackendOptions] | None = None


class Registry(Generic[B]):
    """The backends of one ``kind``, chosen by the setting ``setting``; third parties add theirs
    under the entry point group ``group``."""

    def __init__(self, kind: str, setting: str, group: str) -> None:
        self.kind = kind
        self.setting = setting
        self.group = group
        self._backends: dict[str, Backend[B]] = {}
        self._scanned = False
        self._lock = threading.Lock()

    def add(self, backend: Backend[B]) -> Backend[B]:
        """Register ``backend`` (a later registration of the same name replaces the earlier), and
        its options' section; ``ConfigurationError`` if that section clashes with another."""
        if backend.options is not None:
            SECTIONS.add(backend.options)
        with self._lock:
            self._backends[backend.name] = backend
        return backend

    def names(self) -> list[str]:
        """Every name known, entry points included."""
        self._scan()
        with self._lock:
            return sorted(self._backends)

    def get(self, name: str, *, named_by: str | None = None) -> Backend[B]:
        """The backend called ``name``; ``ConfigurationError`` naming the setting (or
        ``named_by``, the command-line option the name came from) and the known names when there
        is none."""
        with self._lock:
            found = self._backends.get(name)
        if found is None:
            self._scan()
            with self._lock:
                found = self._backends.get(name)
        if found is None:
            where = named_by or f"setting {self.setting!r} is invalid"
            raise ConfigurationError(
                f"{where}: {name!r} is not a {self.kind}{did_you_mean(name, self.names())}",
                hint=f"use one of {', '.join(self.names())}, or install the package that "
                f"provides it (entry point group {self.group})",
            )
        return found

    def checked(self, settings: Settings) -> Backend[B]:
        """The backend ``settings`` name for this kind, with its settings checked."""
        backend = self.get(str(getattr(settings, self.setting)))
        backend.check(settings)
        return backend

    def missing(self, backend: Backend[B], error: ImportError) -> MissingDependencyError:
        """The error for a backend whose optional dependency is not installed."""
        extra = f"pip install 'delta-outbox[{backend.extra}]'" if backend.extra else "install it"
        return MissingDependencyError(
            f"{self.kind} {backend.name!r} is not available: its dependency is not installed "
            f"({error})",
            hint=f"{extra}, or choose another {self.setting}",
        )

    def _scan(self) -> None:
        """Register the entry points of ``group`` (once per process)."""
        with self._lock:
            if self._scanned:
                return
            self._scanned = True
        for ep in entry_points(group=self.group):
            try:
                loaded = ep.load()
            except Exception as e:  # a broken plugin must not take the shipped backends down
                log.warning("%s %r (entry point %s) failed to load: %s", self.kind, ep.name, ep, e)
                continue
            if not isinstance(loaded, Backend):
                log.warning(
                    "%s %r (entry point %s) is not an outbox.wiring.Backend; ignored",
                    self.kind,
                    ep.name,
                    ep,
                )
                continue
            if loaded.options is not None:
                try:
                    SECTIONS.add(loaded.options)
                except ConfigurationError as e:
                    log.warning("%s %r (entry point %s): %s; ignored", self.kind, ep.name, ep, e)
                    continue
            with self._lock:
                self._backends.setdefault(loaded.name, loaded)
