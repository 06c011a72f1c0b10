"""Backends' own settings: each backend declares an options type (a frozen dataclass of
``setting(...)`` fields, a subclass of ``BackendOptions``) read from its section of the settings
file (``[kafka]``) and from its variables (``OUTBOX_KAFKA_BOOTSTRAP_SERVERS``).

The naming scheme, and why it stays unambiguous: the key ``k`` of section ``s`` is the setting
``s_k`` in messages and the variable ``OUTBOX_S_K``. A section's name is lowercase letters and
digits with no ``_``, so a variable splits one way (at its first ``_`` after the prefix), and
``SECTIONS.add`` refuses a section one of whose variables is already a core setting's or one read
elsewhere (``OUTBOX_DELTA_JARS``, ``OUTBOX_SERVICEBUS_CONNECTION_STRING``...). For the shipped
backends this is the spelling their variables always had (``OUTBOX_KAFKA_BOOTSTRAP_SERVERS`` was
the flat setting ``kafka_bootstrap_servers``'s variable): only the file's flat keys change, and
they keep working with a one-line deprecation notice.

A third party's backend brings its section the same way: its ``Backend`` (``outbox.wiring``),
registered by an entry point, names its options type, and the entry points are read the first time
a section or a variable names a section no one has declared.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from collections.abc import Collection, Iterator, Mapping
from typing import Any, ClassVar, TypeVar, cast

from outbox.core.errors import ConfigurationError
from outbox.core.settings_values import coerce, did_you_mean, kind_of

log = logging.getLogger("outbox.settings")

ENV_PREFIX = "OUTBOX_"
#: Where third parties register backends (``outbox.wiring.builtin`` builds one registry each).
ENTRY_POINT_GROUPS = (
    "delta_outbox.transports",
    "delta_outbox.command_queues",
    "delta_outbox.checkpoint_stores",
    "delta_outbox.rescuer_engines",
    "delta_outbox.claim_logs",
    "delta_outbox.inboxes",
)
_SECTION_NAME = re.compile(r"^[a-z][a-z0-9]*$")

OptionsT = TypeVar("OptionsT", bound="BackendOptions")


class BackendOptions:
    """A backend's options: subclass it as a frozen dataclass of ``setting(...)`` fields and name
    the section in ``SECTION``; ``validate`` checks what one field alone cannot. Read it with
    ``settings.options(MyOptions)``."""

    SECTION: ClassVar[str] = ""
    #: True for the shipped sections whose keys were flat settings before (``kafka_*``): the flat
    #: names still work in a settings file, with a deprecation notice.
    FLAT: ClassVar[bool] = False

    def validate(self, settings: Any) -> None:
        """Raise ``self.invalid(key, why)`` for a bad value; ``settings`` is the whole
        ``Settings`` (for checks across sections)."""

    def invalid(self, key: str, why: str) -> ConfigurationError:
        return ConfigurationError(f"setting {self.setting_name(key)!r} is invalid: {why}")

    @classmethod
    def setting_name(cls, key: str) -> str:
        """``kafka_bootstrap_servers``: how messages name the key (its variable, lowercase)."""
        return f"{cls.SECTION}_{key}"

    @classmethod
    def variable(cls, key: str) -> str:
        return f"{ENV_PREFIX}{cls.SECTION.upper()}_{key.upper()}"

    @classmethod
    def option_fields(cls) -> dict[str, dataclasses.Field[Any]]:
        return {f.name: f for f in dataclasses.fields(cast(Any, cls))}

    @classmethod
    def build(
        cls: type[OptionsT], values: Mapping[str, Any], base: OptionsT | None = None
    ) -> OptionsT:
        """``base`` (default: the defaults) with ``values`` read by each key's kind; an unknown
        key is one error with a did-you-mean, as an unknown top-level setting is."""
        known = cls.option_fields()
        changes: dict[str, Any] = {}
        for key, value in values.items():
            f = known.get(key)
            if f is None:
                raise ConfigurationError(
                    f"unknown setting {key!r} in [{cls.SECTION}]{did_you_mean(key, known)}",
                    hint=f"known [{cls.SECTION}] settings: {', '.join(sorted(known))}",
                )
            changes[key] = coerce(cls.setting_name(key), value, kind_of(f))
        if base is None:
            return cast(OptionsT, cast(Any, cls)(**changes))
        return cast(OptionsT, dataclasses.replace(cast(Any, base), **changes))

    def values(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self.option_fields()}


class SectionRegistry:
    """The declared sections by name: the shipped ones, then third parties' as they are found."""

    def __init__(self) -> None:
        self._types: dict[str, type[BackendOptions]] = {}
        self._lock = threading.RLock()
        self._discovered = False
        self._names: frozenset[str] = frozenset()
        self._variables: frozenset[str] = frozenset()
        self._prefixes: tuple[str, ...] = ()

    def reserve(
        self, names: Collection[str], variables: Collection[str], prefixes: tuple[str, ...]
    ) -> None:
        """The core settings' names and the variables read elsewhere: no section may take them."""
        self._names = frozenset(names)
        self._variables = frozenset(variables) | {f"{ENV_PREFIX}{n.upper()}" for n in names}
        self._prefixes = prefixes

    def add(self, options: type[BackendOptions]) -> type[BackendOptions]:
        """Declare ``options``'s section; ``ConfigurationError`` when its name or one of its
        variables is taken (the same type again is a no-op)."""
        name = options.SECTION
        with self._lock:
            existing = self._types.get(name)
            if existing is options:
                return options
            problem = self._clash(options, existing)
            if problem:
                raise ConfigurationError(problem, hint="rename the section or the key")
            self._types[name] = options
        return options

    def _clash(self, options: type[BackendOptions], existing: type[BackendOptions] | None) -> str:
        name = options.SECTION
        if existing is not None:
            return (
                f"section [{name}] is declared twice: {existing.__qualname__}, {options.__name__}"
            )
        if not _SECTION_NAME.match(name):
            return (
                f"section name {name!r} ({options.__qualname__}) must be lowercase letters and "
                "digits, without '_' (OUTBOX_<SECTION>_<KEY> must split one way)"
            )
        if name == "outbox" or name in self._names:
            return f"section [{name}] ({options.__qualname__}) has the name of a setting"
        for key in options.option_fields():
            variable = options.variable(key)
            if variable in self._variables or variable.startswith(self._prefixes):
                return (
                    f"[{name}] {key} ({options.__qualname__}) would be read from {variable}, "
                    "which is another setting's or read elsewhere"
                )
        return ""

    def get(self, name: str) -> type[BackendOptions] | None:
        with self._lock:
            return self._types.get(name)

    def find(self, name: str) -> type[BackendOptions] | None:
        """The section ``name``, reading the entry points once if no one declared it yet."""
        found = self.get(name)
        if found is None and not self._discovered:
            self.discover()
            found = self.get(name)
        return found

    def __iter__(self) -> Iterator[type[BackendOptions]]:
        with self._lock:
            return iter(list(self._types.values()))

    def names(self) -> list[str]:
        with self._lock:
            return list(self._types)

    def flat(self, name: str) -> tuple[type[BackendOptions], str] | None:
        """(section, key) for a flat name of a shipped section (``kafka_bootstrap_servers``)."""
        head, _, key = name.partition("_")
        options = self.get(head)
        if options is not None and options.FLAT and key in options.option_fields():
            return options, key
        return None

    def split(self, name: str) -> tuple[type[BackendOptions], str] | None:
        """(section, key) for ``name`` (a variable's name after the prefix, lowercase)."""
        head, _, key = name.partition("_")
        options = self.find(head) if key else None
        if options is not None and key in options.option_fields():
            return options, key
        return None

    def discover(self) -> None:
        """Declare the sections of the backends registered by entry points (once)."""
        from importlib.metadata import entry_points  # only when a name is not known

        with self._lock:
            if self._discovered:
                return
            self._discovered = True
        for group in ENTRY_POINT_GROUPS:
            for ep in entry_points(group=group):
                try:
                    options = getattr(ep.load(), "options", None)
                except Exception as e:  # outbox.wiring's registry says so when it loads it
                    log.debug("entry point %s failed to load: %s", ep, e)
                    continue
                if isinstance(options, type) and issubclass(options, BackendOptions):
                    try:
                        self.add(options)
                    except ConfigurationError as e:
                        log.warning("entry point %s: %s; its settings are ignored", ep, e)


#: Every declared section (``outbox.core.settings`` adds the shipped ones).
SECTIONS = SectionRegistry()
_noticed: set[str] = set()


def notice_flat(name: str, options: type[BackendOptions], key: str, where: str) -> None:
    """Once per process and name: the file still uses a flat name (it works, for now)."""
    if name in _noticed:
        return
    _noticed.add(name)
    log.warning(
        "%s: %r is deprecated: write %s under [%s] (the variable %s is unchanged)",
        where,
        name,
        key,
        options.SECTION,
        options.variable(key),
    )


def group(
    values: Mapping[str, Any],
    core: Collection[str],
    *,
    where: str | None = None,
) -> dict[str, Any]:
    """One source's values with the backends' settings grouped by section: core names stay,
    ``kafka={...}`` or ``kafka=KafkaOptions(...)`` and the flat ``kafka_bootstrap_servers`` become
    ``{"kafka": {"bootstrap_servers": ...}}``. ``where`` (a settings file) logs the deprecation
    notice for each flat name. The same key given twice in one source is an error; an unknown
    name is one error with a did-you-mean."""
    out: dict[str, Any] = {}
    spelled: dict[tuple[str, str], str] = {}

    def put(section: str, key: str, value: Any, how: str) -> None:
        if (section, key) in spelled:
            raise ConfigurationError(
                f"setting '{section}_{key}' is given twice, as {spelled[section, key]} and "
                f"as {how}",
                hint=f"keep the one under [{section}]",
            )
        spelled[section, key] = how
        out.setdefault(section, {})[key] = value

    def section(options: type[BackendOptions], value: Any) -> None:
        name = options.SECTION
        if isinstance(value, BackendOptions):
            if not isinstance(value, options):
                raise ConfigurationError(
                    f"setting [{name}] must be {options.__name__}, not {type(value).__name__}"
                )
            value = value.values()
        if not isinstance(value, Mapping):
            raise ConfigurationError(f"setting [{name}] must be a table, not {value!r}")
        for key, item in value.items():
            put(name, str(key), item, f"{key} under [{name}]")

    for name, value in values.items():
        if name in core:
            out[name] = value
        elif (options := SECTIONS.get(name)) is not None:
            section(options, value)
        elif (found := SECTIONS.flat(name)) is not None:
            options, key = found
            if where is not None:
                notice_flat(name, options, key, where)
            put(options.SECTION, key, value, name)
        elif (options := SECTIONS.find(name)) is not None:  # a third party's, not read yet
            section(options, value)
        else:
            flat = {o.setting_name(k) for o in SECTIONS if o.FLAT for k in o.option_fields()}
            known = set(core) | flat
            raise ConfigurationError(
                f"unknown setting {name!r}{did_you_mean(name, known | set(SECTIONS.names()))}",
                hint=f"known settings: {', '.join(sorted(known))}",
            )
    return out


def merge(lower: dict[str, Any], upper: Mapping[str, Any]) -> dict[str, Any]:
    """``upper`` over ``lower``: a section's keys one by one, any other value whole."""
    for name, value in upper.items():
        if SECTIONS.get(name) is not None and isinstance(lower.get(name), dict):
            lower[name] = {**lower[name], **value}
        else:
            lower[name] = value
    return lower
