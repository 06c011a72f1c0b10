"""Typed settings: defaults, then a TOML file, then ``OUTBOX_*`` variables, then explicit values.

The CLI and the library read the same ``Settings``. Validation happens once, at construction, and
an invalid value raises ``ConfigurationError`` naming the setting and what it accepts.

The core settings are fields here, each declared with the sentence the settings reference prints
(docs/configuration.md is generated from them: ``settings_reference``). A backend's own settings
are its options type, read from its section (``[kafka]``, ``OUTBOX_KAFKA_*``;
``settings_sections``); ``settings.options(KafkaOptions)`` returns them, typed, and the flat
names they had before (``settings.kafka_bootstrap_servers``) stay as views (``settings_flat``).
The file and variable readers are ``settings_sources``, the value readers ``settings_values``.

Why one module: every core setting's field, default, documentation and validation meet in one
dataclass; split, a new setting would need edits in several places that must agree.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from outbox.core.errors import ConfigurationError
from outbox.core.settings_backends import ENTITY_NAME, SHIPPED, TOPIC_PREFIX
from outbox.core.settings_flat import FlatNames
from outbox.core.settings_sections import ENV_PREFIX, SECTIONS, BackendOptions, group, merge
from outbox.core.settings_sources import (
    OTHER_PREFIXES,
    OTHER_VARIABLES,
    SETTINGS_FILE,
    from_env,
    read_file,
)
from outbox.core.settings_values import (
    coerce,
    default_of,
    did_you_mean,
    is_secret,
    kind_of,
    setting,
)

__all__ = [
    "BACKEND_SETTINGS",
    "DEFAULT_INBOX_RETENTION",
    "ENV_PREFIX",
    "MAX_RESCUE_DELAY",
    "MIN_RESCUE_DELAY",
    "OTHER_PREFIXES",
    "OTHER_VARIABLES",
    "SETTINGS_FILE",
    "SQLITE_FILE",
    "TABLE_DIR",
    "TOPIC_PREFIX",
    "BackendOptions",
    "DispatchMode",
    "Settings",
    "did_you_mean",
    "setting",
]

TABLE_DIR = "documents"
SQLITE_FILE = "outbox.db"

DispatchMode = Literal["immediate", "deferred"]
OptionsT = TypeVar("OptionsT", bound=BackendOptions)

#: The settings that name a backend (``outbox.wiring`` checks the names).
BACKEND_SETTINGS = (
    "transport",
    "command_transport",
    "checkpoint_store",
    "rescuer_engine",
    "claim_log",
    "inbox_store",
)

MIN_RESCUE_DELAY = 15.0
MAX_RESCUE_DELAY = 3600.0
#: How long a consumer inbox keeps a handled id (``inbox_retention``): a week, as long as Service
#: Bus's longest duplicate-detection window and far longer than the SQL queue's default.
DEFAULT_INBOX_RETENTION = 7 * 24 * 3600.0


@dataclasses.dataclass(frozen=True, slots=True, init=False)
class Settings(FlatNames):
    """Everything the framework can be told. Durations are seconds (``5m`` strings accepted).

    ``Settings(...)`` takes the core settings by name and a backend's as ``kafka={...}`` (or the
    flat ``kafka_bootstrap_servers=...`` of before); ``load`` reads them from their sources."""

    workspace: Path = setting(  # noqa: RUF009 (a dataclasses.field)
        Path(".outbox"),
        "folder holding the default table and SQLite file (`--workspace`)",
        shown="`./.outbox`",
    )
    table_uri: str = setting(
        "",
        "Delta table: a path, `az://` / `abfss://` (ADLS Gen2, Blob Storage) or `s3://` "
        "([object-storage.md](object-storage.md))",
        shown="`<workspace>/documents`",
    )
    storage_options: dict[str, str] = setting(  # noqa: RUF009
        {},
        "deltalake storage options, by deltalake's key names (the environment variables of the "
        "same names work too); values never printed",
        secret=True,
    )
    sql_url: str = setting(
        "",
        "queue, checkpoints and inbox; `postgresql+psycopg://…` for many machines",
        shown="`sqlite:///<workspace>/outbox.db`",
    )
    # Backends, by name (``outbox.wiring`` knows the names, a plugin may add its own):
    transport: str = setting(
        "sql",
        "`sql` (embedded queue), `memory` (tests, docs), `servicebus`, `mqtt`, `kafka` (Kafka or "
        "Event Hubs)",
    )
    command_transport: str = setting(
        "sql", "where `ProcessDocument` commands go: `sql` (the SQL queue) or `servicebus`"
    )
    rescuer_engine: str = setting(
        "local",
        "the rescuer's change-feed engine: `local` (deltalake) or `spark`; `outbox rescue "
        "--engine` overrides it",
    )
    checkpoint_store: str = setting("sql", "where rescuer checkpoints live: `sql` or `cosmos`")
    inbox_store: str = setting(
        "sql", "the inbox `Backends(settings).inbox(name)` gives a consumer: `sql` or `cosmos`"
    )
    claim_log: str = setting(
        "sql", "the two-region claim log `Backends(settings).claim_log()` gives: `sql` or `cosmos`"
    )
    dispatch: DispatchMode = setting(  # noqa: RUF009
        "immediate",
        "`immediate` publishes after the commit; `deferred` only enqueues `ProcessDocument` "
        "commands",
    )
    rescue_delay: float = setting(15.0, "rescuer lag, 15 s to 1 h")
    rescue_interval: float = setting(
        30.0,
        "how often `outbox rescue --every` (given without a value) starts a pass: passes start "
        "this far apart, however long each takes (`--every 10s` overrides it); with "
        "`rescue_delay` it bounds rescue time (I5)",
    )
    rescuer_name: str = setting(
        "default",
        "checkpoint key, when `outbox rescue --name` is not given; run several rescuers under "
        "different names. A name without a checkpoint (other than `default`) needs "
        "`outbox rescue --new` once",
    )
    buckets: int = setting(16, "partitions of a new table (`crc32(id) % buckets`)")
    max_message_bytes: int = setting(
        256 * 1024,
        "size limit per message: UTF-8 bytes of the body and properties (id, type, content type, "
        "session, correlation id, headers), as the broker counts them (Service Bus standard "
        "tier: 256 KiB)",
    )
    claim_log_timeout: float = setting(
        1.0,
        "how long a send through `GeoReplicatedTransport` may wait on its claim log (SQLite busy "
        "timeout, PostgreSQL lock and statement timeouts, Cosmos DB request and read timeouts) "
        "before it fails retryably: the commit is already durable, and the retry command or the "
        "rescuer sends the messages later. At most `30s`; a `claim_log_timeout=` given to the "
        "transport wins; consumers keep their longer waits ([geo.md](geo.md))",
    )
    max_in_flight: int = setting(16, "documents sent concurrently by the immediate dispatcher")
    watermark_window: float = setting(
        0.2,
        "the immediate dispatcher writes watermarks off the caller's path: they ride in the next "
        "save's append, or one append per window writes every mark waiting (`0`: one per "
        "dispatch, inline). A crash inside the window costs re-sends with the same message ids, "
        "never a loss ([performance-write-path.md](performance-write-path.md))",
    )
    max_commit_retries: int = setting(
        10, "Delta commit-conflict retries before `CommitConflictError`"
    )
    group_commit: bool = setting(
        True,
        "units of work from different threads of one process that queue while a commit runs "
        "share the next append (disjoint documents only; a stale one alone fails with "
        "`ConcurrencyError`); `false`: one append per unit of work ([delta.md](delta.md))",
    )
    command_queue: str = setting("outbox-commands", "queue for `ProcessDocument` commands")
    default_destination: str | None = setting(None, "destination when `send` names none")
    destinations: tuple[str, ...] = setting(
        (),
        "the destinations `send` may name; declared (here or in `[servicebus] destinations`), "
        "any other name fails before the commit with a did-you-mean; none: any valid name. Env: "
        "comma-separated",
    )
    lock_duration: float = setting(30.0, "peek-lock duration (max 5 min, as Service Bus)")
    max_delivery_count: int = setting(
        10, "deliveries before a message is dead-lettered `MaxDeliveryCountExceeded`"
    )
    duplicate_detection_window: float = setting(
        600.0, "the queue drops a repeated message id inside this window"
    )
    inbox_retention: float = setting(
        DEFAULT_INBOX_RETENTION,
        "how long a consumer inbox remembers a handled id (the repeats after it run again); "
        "`outbox maintain` and each running consumer delete older ones; at least "
        "`duplicate_detection_window`",
    )
    compact_every: int = setting(
        100,
        "versions between the writer's automatic upkeep: the fold, compaction and the log trim "
        "(0: off; then schedule `outbox maintain`). On an object store (`abfss://`, `s3://`) "
        "writers fold but never compact: schedule `outbox maintain`, which compacts under the "
        "maintenance lease",
    )
    log_retention: float = setting(
        900.0,
        "commit files younger than this stay in `_delta_log`; older ones are trimmed, never past "
        "the oldest rescuer checkpoint (never less than `rescue_delay`; "
        '[operations.md](operations.md), "Keeping commits fast")',
    )
    sample_interval: float = setting(
        60.0,
        "how often the running dispatcher samples pending documents and messages, the oldest "
        "pending age, each rescuer's lag and the geo claims in flight into the SQL database for "
        "`outbox console`'s history (each rescue pass samples too, one row per metric and slot); "
        "`0`: off, else at least `1s` ([console.md](console.md))",
    )
    sample_retention: float = setting(
        7 * 24 * 3600.0,
        "how long those samples, and the rescuer's journal ([trace.md](trace.md)), are kept",
    )
    dead_letter_retention: float = setting(
        30 * 24 * 3600.0,
        "how long the SQL queue keeps a dead letter; `outbox maintain` deletes older ones (and "
        "logs how many); `0`: keep them until requeued or purged",
    )
    claim_retention: float = setting(
        DEFAULT_INBOX_RETENTION,
        "how long the geo claim log keeps a completed or failed claim (it drops the other "
        "region's late copy); `outbox maintain` deletes older ones; `0`: keep them; else at "
        "least `duplicate_detection_window` ([geo.md](geo.md))",
    )
    replay_retention: float = setting(
        30 * 24 * 3600.0,
        "how long `outbox maintain` keeps the records of finished replays, and the longest an "
        "unfinished replay holds the log trim ([replay.md](replay.md)); `0`: keep them, and hold "
        "until done",
    )
    audit_retention: float = setting(
        0.0,
        "how long `outbox maintain` keeps the audit trail ([console.md](console.md)); `0`: keep it",
    )
    sections: Mapping[str, BackendOptions] = setting(
        {},
        "the backends' own settings, one section each: the tables below (`[cosmos]`, `[kafka]`, "
        "`[servicebus]`, `[mqtt]`) and a third party's; in Python "
        "`settings.options(KafkaOptions)`",
        shown="—",
    )

    def __init__(self, **values: Any) -> None:
        given = dict(values)
        base: Mapping[str, BackendOptions] = given.pop("sections", None) or {}
        layer = group(given, CORE)
        for f in dataclasses.fields(self):
            if f.name in CORE:
                value = layer[f.name] if f.name in layer else default_of(f)
                object.__setattr__(self, f.name, value)
        built: dict[str, BackendOptions] = {}
        named = [n for n in layer if n not in CORE]  # sections (``group`` found each one)
        for name in dict.fromkeys([*SECTIONS.names(), *base, *named]):
            start = base.get(name)
            options = SECTIONS.get(name) or cast("type[BackendOptions]", type(start))
            built[name] = options.build(layer.get(name, {}), start)
        object.__setattr__(self, "sections", built)
        ws = Path(self.workspace)
        object.__setattr__(self, "workspace", ws)
        if not self.table_uri:
            object.__setattr__(self, "table_uri", str((ws / TABLE_DIR).absolute()))
        if not self.sql_url:
            object.__setattr__(self, "sql_url", f"sqlite:///{(ws / SQLITE_FILE).absolute()}")
        object.__setattr__(self, "destinations", coerce("destinations", self.destinations, "list"))
        self._validate()

    def options(self, kind: type[OptionsT]) -> OptionsT:
        """The options of ``kind``'s section (``settings.options(KafkaOptions)``): one typed call
        for a shipped backend and a third party's alike, which is why it takes the type rather
        than a name. A section no source mentioned has its defaults."""
        found = self.sections.get(kind.SECTION)
        if found is None:
            SECTIONS.add(kind)
            return kind.build({})
        if not isinstance(found, kind):
            raise ConfigurationError(
                f"section [{kind.SECTION}] holds {type(found).__name__}, not {kind.__name__}"
            )
        return found

    def _validate(self) -> None:
        """Each group of settings in turn; the first invalid one raises ``ConfigurationError``."""

        def bad(name: str, why: str) -> ConfigurationError:
            return ConfigurationError(f"setting {name!r} is invalid: {why}")

        self._validate_choices(bad)
        self._validate_rescue_timing(bad)
        self._validate_counts(bad)
        self._validate_queue_timing(bad)
        self._validate_upkeep(bad)
        self._validate_sampling(bad)
        if not self.command_queue:
            raise bad("command_queue", "must not be empty")
        for options in self.sections.values():
            options.validate(self)
        self._validate_destinations(bad)
        if "://" not in self.sql_url:
            raise bad(
                "sql_url",
                f"{self.sql_url!r} is not a database URL; use sqlite:///path.db or "
                "postgresql+psycopg://user@host/db",
            )

    def _validate_choices(self, bad: Any) -> None:
        for name in BACKEND_SETTINGS:  # which names exist is outbox.wiring's to say
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise bad(name, "must name a backend")
        if self.dispatch not in ("immediate", "deferred"):
            raise bad("dispatch", f"{self.dispatch!r}; use immediate or deferred")

    def _validate_rescue_timing(self, bad: Any) -> None:
        if not MIN_RESCUE_DELAY <= self.rescue_delay <= MAX_RESCUE_DELAY:
            raise bad("rescue_delay", f"{self.rescue_delay:g}s is outside 15s..1h")
        if self.rescue_interval <= 0:
            raise bad("rescue_interval", "must be positive")

    def _validate_counts(self, bad: Any) -> None:
        for name in ("buckets", "max_message_bytes", "max_in_flight", "max_delivery_count"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise bad(name, f"{value!r}; must be a positive integer")
        if self.buckets > 1024:
            raise bad("buckets", f"{self.buckets}; at most 1024 partitions are supported")
        if self.max_commit_retries < 0:
            raise bad("max_commit_retries", "must be 0 or more")

    def _validate_queue_timing(self, bad: Any) -> None:
        if self.lock_duration <= 0 or self.lock_duration > 300:
            raise bad("lock_duration", f"{self.lock_duration:g}s; must be in (0s, 5m]")
        if self.duplicate_detection_window < 20:
            raise bad("duplicate_detection_window", "must be at least 20s (as on Service Bus)")
        if self.inbox_retention < self.duplicate_detection_window:
            raise bad(
                "inbox_retention",
                f"{self.inbox_retention:g}s is shorter than duplicate_detection_window "
                f"({self.duplicate_detection_window:g}s): the inbox drops the repeats the queue's "
                "duplicate detection lets through, so it must remember an id at least as long; "
                "e.g. 7d",
            )
        if not 0 <= self.watermark_window <= 5:
            raise bad("watermark_window", f"{self.watermark_window:g}s is outside 0s..5s")
        if not 0 < self.claim_log_timeout <= 30:
            raise bad("claim_log_timeout", f"{self.claim_log_timeout:g}s; must be in (0s, 30s]")

    def _validate_upkeep(self, bad: Any) -> None:
        """Compaction and log retention (which never drops below the rescue delay)."""
        if self.compact_every < 0:
            raise bad("compact_every", "must be 0 (off) or more")
        if self.log_retention <= 0:
            raise bad("log_retention", "must be positive, e.g. 15m")
        if self.log_retention < self.rescue_delay:
            # The rescuer times its window from the commits in the log, so the log always keeps
            # at least one rescue delay. Keeping more is the safe direction: no error for it.
            object.__setattr__(self, "log_retention", self.rescue_delay)

    def _validate_sampling(self, bad: Any) -> None:
        """A sample a second at most (each writes a row per metric and rescuer); retentions."""
        if self.sample_interval < 0 or 0 < self.sample_interval < 1:
            raise bad(
                "sample_interval", f"{self.sample_interval:g}s; must be 0 (off) or at least 1s"
            )
        if self.sample_retention <= 0:
            raise bad("sample_retention", "must be positive, e.g. 7d")
        for name in [f"{k}_retention" for k in ("dead_letter", "claim", "replay", "audit")]:
            if getattr(self, name) < 0:
                raise bad(name, f"{getattr(self, name):g}s; must be 0 (keep) or positive, e.g. 30d")
        if 0 < self.claim_retention < self.duplicate_detection_window:
            raise bad(
                "claim_retention",
                f"{self.claim_retention:g}s is shorter than duplicate_detection_window "
                f"({self.duplicate_detection_window:g}s): a finished claim drops the copies that "
                "detection lets through, so it must stay at least as long; e.g. 7d (or 0: keep)",
            )

    def _validate_destinations(self, bad: Any) -> None:
        for name in self.destinations:
            if not ENTITY_NAME.match(name) or len(name) > 260:
                raise bad(
                    "destinations",
                    f"{name!r} is not a queue or topic name; names are 1-260 letters, digits, "
                    "'.', '-', '_' or '/', starting with a letter or digit",
                )
        declared = self.declared_destinations
        if declared and self.default_destination and self.default_destination not in declared:
            raise bad(
                "default_destination",
                f"{self.default_destination!r} is not a declared destination"
                f"{did_you_mean(self.default_destination, declared)}; declared: "
                f"{', '.join(sorted(declared))}",
            )

    @property
    def declared_destinations(self) -> frozenset[str]:
        """Where ``doc.send`` may send: ``destinations`` and the names in
        ``servicebus_destinations`` (without ``topic:``). Empty: not declared, anything goes."""
        names = {e.removeprefix(TOPIC_PREFIX) for e in self.servicebus_destinations}
        return frozenset(names | set(self.destinations))

    @property
    def cosmos_configured(self) -> bool:
        """True when a Cosmos DB account is set: ``outbox migrate`` then provisions it."""
        return bool(self.cosmos_endpoint)

    # --- derived locations -------------------------------------------------------------------

    @property
    def settings_file(self) -> Path:
        return self.workspace / SETTINGS_FILE

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every setting under its flat name (a backend's as ``kafka_bootstrap_servers``), the
        secrets masked."""
        d: dict[str, Any] = {name: getattr(self, name) for name in CORE}
        d["workspace"] = str(self.workspace)
        d["storage_options"] = {k: "***" for k in self.storage_options}  # never print secrets
        for options in self.sections.values():
            for key, f in options.option_fields().items():
                value = getattr(options, key)
                if is_secret(f):
                    value = (
                        {k: "***" for k in value} if isinstance(value, dict) else value and "***"
                    )
                d[options.setting_name(key)] = value
        return d

    # --- loading -----------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        workspace: str | Path | None = None,
        *,
        config_file: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> Settings:
        """Defaults < settings file < ``OUTBOX_*`` environment < ``overrides``.

        The workspace comes from the argument, else ``OUTBOX_WORKSPACE``, else ``./.outbox``. The
        settings file is ``config_file``, else ``OUTBOX_CONFIG``, else ``<workspace>/outbox.toml``
        when it exists. A backend's settings merge key by key across the sources.
        """
        env = os.environ if env is None else env
        ws = Path(workspace or env.get(f"{ENV_PREFIX}WORKSPACE") or ".outbox")
        raw: dict[str, Any] = {}
        path = config_file or env.get(f"{ENV_PREFIX}CONFIG")
        if path is None and (ws / SETTINGS_FILE).is_file():
            path = ws / SETTINGS_FILE
        if path is not None:
            merge(raw, read_file(Path(path), CORE, _TABLES))
            if "workspace" in raw and workspace is None and not env.get(f"{ENV_PREFIX}WORKSPACE"):
                ws = Path(str(raw["workspace"]))
        merge(raw, from_env(env, CORE))
        merge(raw, group({k: v for k, v in overrides.items() if v is not None}, CORE))
        raw["workspace"] = ws if workspace is not None else raw.get("workspace", ws)
        return cls.from_mapping(raw)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Settings:
        """Settings from names and values as a file or the environment gives them (text is read
        by each setting's kind)."""
        layer = group(raw, CORE)
        kinds = {f.name: kind_of(f) for f in dataclasses.fields(cls)}
        return cls(**{k: coerce(k, v, kinds[k]) if k in CORE else v for k, v in layer.items()})


#: The core settings' names (every field but ``sections``).
CORE = frozenset(f.name for f in dataclasses.fields(Settings) if f.name != "sections")
#: Core settings a table may hold at the top of a settings file (``[storage_options]``).
_TABLES = frozenset(f.name for f in dataclasses.fields(Settings) if kind_of(f) == "dict") - {
    "sections"
}
SECTIONS.reserve(CORE, OTHER_VARIABLES, OTHER_PREFIXES)
for _shipped in SHIPPED:
    SECTIONS.add(_shipped)
