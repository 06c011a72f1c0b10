"""Typed settings: defaults, then a TOML file, then ``OUTBOX_*`` variables, then explicit values.

The CLI and the library read the same ``Settings``. Validation happens once, at construction, and
an invalid value raises ``ConfigurationError`` naming the setting and what it accepts.

Why one module: every source of a value (file, ``OUTBOX_*`` variables, arguments), its coercion,
its validation and the did-you-mean for a misspelt name meet in one dataclass; split, a new
setting would need edits in several places that must agree.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from outbox.core.durations import parse_duration
from outbox.core.errors import ConfigurationError, ValidationError

log = logging.getLogger("outbox.settings")

SETTINGS_FILE = "outbox.toml"
TABLE_DIR = "documents"
SQLITE_FILE = "outbox.db"
ENV_PREFIX = "OUTBOX_"

DispatchMode = Literal["immediate", "deferred"]

#: ``servicebus_destinations`` entries with this prefix are topics; the others are queues.
TOPIC_PREFIX = "topic:"
_ENTITY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")

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


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the framework can be told. Durations are seconds (``5m`` strings accepted)."""

    workspace: Path = Path(".outbox")
    table_uri: str = ""  # default: <workspace>/documents
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)
    sql_url: str = ""  # default: sqlite:///<workspace>/outbox.db
    # Backends, by name (``outbox.wiring`` knows the names, a plugin may add its own):
    transport: str = "sql"  # sql, memory, servicebus, mqtt, kafka
    dispatch: DispatchMode = "immediate"
    rescue_delay: float = 15.0
    rescue_interval: float = 30.0
    rescuer_name: str = "default"
    buckets: int = 16
    max_message_bytes: int = 256 * 1024
    max_in_flight: int = 16
    max_commit_retries: int = 10
    command_queue: str = "outbox-commands"
    command_transport: str = "sql"  # where ProcessDocument goes: sql or servicebus
    rescuer_engine: str = "local"  # the rescuer's change-feed engine: local or spark
    default_destination: str | None = None
    # The destinations ``doc.send`` may name (env: comma-separated). Empty: any valid name (a
    # typo creates a queue no one reads). Declared: an unknown name fails before the commit with
    # a did-you-mean. The names in ``servicebus_destinations`` count as declared too, so on
    # Service Bus each destination is listed once, there (``declared_destinations``).
    destinations: tuple[str, ...] = ()
    # Destinations ``outbox migrate`` creates on Service Bus (docs/servicebus.md): queue names,
    # and ``topic:NAME`` for topics. Env: comma-separated, e.g. "shipments,topic:events".
    servicebus_destinations: tuple[str, ...] = ()
    # MQTT as the transport (``transport = "mqtt"``): the broker's URL (mqtt://host:port, or
    # mqtts:// for TLS; a password is better in OUTBOX_MQTT_BROKER than in a file) and the topic
    # template each message goes to ({destination}, and {session} for per-device topics).
    mqtt_broker: str = field(default="", repr=False)
    mqtt_topic: str = "{destination}"
    # Kafka or Azure Event Hubs as the transport (``transport = "kafka"``, docs/kafka.md): the
    # bootstrap servers, or an Event Hubs connection string (which sets the servers and
    # SASL_SSL/PLAIN itself); SASL credentials; how long one send may take before it fails
    # retryably; partitions for the topics ``outbox migrate`` creates (0: the broker's default);
    # more librdkafka properties (env: ``key=value,key=value``).
    kafka_bootstrap_servers: str = ""
    kafka_connection_string: str = field(default="", repr=False)
    kafka_security_protocol: str = ""  # default PLAINTEXT, or SASL_SSL with a connection string
    kafka_sasl_mechanism: str = "PLAIN"
    kafka_sasl_username: str = ""
    kafka_sasl_password: str = field(default="", repr=False)
    kafka_send_timeout: float = 30.0
    kafka_partitions: int = 0
    kafka_options: dict[str, str] = field(default_factory=dict, repr=False)
    lock_duration: float = 30.0
    max_delivery_count: int = 10
    duplicate_detection_window: float = 600.0
    # Consumer inboxes forget ids handled longer ago (outbox maintain, and each consumer):
    # never shorter than duplicate_detection_window (docs/sql_queue.md, "Pruning the inbox").
    inbox_retention: float = DEFAULT_INBOX_RETENTION
    compact_every: int = 100  # commits between automatic upkeep (compaction, log trim); 0: off
    log_retention: float = 900.0  # commit files younger than this are never trimmed
    group_commit: bool = True  # concurrent units of work in one process share a Delta commit
    # Immediate dispatch writes watermarks off the caller's path, one MERGE per window (0: one
    # inline MERGE per dispatch). A crash inside the window costs re-sends (same ids), not loss.
    watermark_window: float = 0.2
    # Cosmos DB (docs/cosmos.md): rescuer checkpoints and consumer inboxes. An empty key signs in
    # with DefaultAzureCredential (needs azure-identity).
    checkpoint_store: str = "sql"  # sql or cosmos
    inbox_store: str = "sql"  # a consumer's inbox from settings: sql or cosmos
    claim_log: str = "sql"  # the geo claim log from settings: sql or cosmos (docs/geo.md)
    cosmos_endpoint: str = ""
    cosmos_key: str = field(default="", repr=False)
    cosmos_database: str = "outbox"
    cosmos_checkpoint_container: str = "checkpoints"
    cosmos_inbox_container: str = "inbox"
    cosmos_claims_container: str = "claims"  # the geo claim log (docs/geo.md)
    # How long a send through the geo transport may wait on its claim log before it fails
    # retryably (the commit is durable; a retry or the rescuer sends later). docs/geo.md.
    claim_log_timeout: float = 1.0
    # The console's history (outbox.app.sampling, docs/console.md): how often the running
    # processes sample the table and rescuers into the queue's database (0: never), and how long
    # the samples are kept.
    sample_interval: float = 60.0
    sample_retention: float = 7 * 24 * 3600.0

    def __post_init__(self) -> None:
        ws = Path(self.workspace)
        object.__setattr__(self, "workspace", ws)
        if not self.table_uri:
            object.__setattr__(self, "table_uri", str((ws / TABLE_DIR).absolute()))
        if not self.sql_url:
            object.__setattr__(self, "sql_url", f"sqlite:///{(ws / SQLITE_FILE).absolute()}")
        object.__setattr__(
            self,
            "servicebus_destinations",
            _coerce("servicebus_destinations", self.servicebus_destinations, "list"),
        )
        object.__setattr__(self, "destinations", _coerce("destinations", self.destinations, "list"))
        self._validate()

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
        self._validate_cosmos(bad)
        self._validate_kafka(bad)
        self._validate_servicebus_destinations(bad)
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
        """A sample a second at most: each writes a row per metric and rescuer."""
        if self.sample_interval < 0 or 0 < self.sample_interval < 1:
            raise bad(
                "sample_interval", f"{self.sample_interval:g}s; must be 0 (off) or at least 1s"
            )
        if self.sample_retention <= 0:
            raise bad("sample_retention", "must be positive, e.g. 7d")

    def _validate_kafka(self, bad: Any) -> None:
        if self.kafka_security_protocol and self.kafka_security_protocol.upper() not in (
            "PLAINTEXT",
            "SSL",
            "SASL_PLAINTEXT",
            "SASL_SSL",
        ):
            raise bad(
                "kafka_security_protocol",
                f"{self.kafka_security_protocol!r}; use PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
            )
        if not 0 < self.kafka_send_timeout <= 600:
            raise bad("kafka_send_timeout", f"{self.kafka_send_timeout:g}s; must be in (0s, 10m]")
        if not isinstance(self.kafka_partitions, int) or self.kafka_partitions < 0:
            raise bad("kafka_partitions", "must be 0 (the broker's default) or more")

    def _validate_cosmos(self, bad: Any) -> None:
        if self.cosmos_endpoint and not self.cosmos_endpoint.startswith(("https://", "http://")):
            raise bad("cosmos_endpoint", f"{self.cosmos_endpoint!r} is not an https:// URL")
        for name in (
            "cosmos_database",
            "cosmos_checkpoint_container",
            "cosmos_inbox_container",
            "cosmos_claims_container",
        ):
            if not getattr(self, name):
                raise bad(name, "must not be empty")

    def _validate_servicebus_destinations(self, bad: Any) -> None:
        """Each entry is ``NAME`` (a queue) or ``topic:NAME``; NAME as Service Bus spells entity
        paths. Checked here so a typo fails at load, not half-way through ``outbox migrate``."""
        seen: set[str] = set()
        for entry in self.servicebus_destinations:
            name = entry[len(TOPIC_PREFIX) :] if entry.startswith(TOPIC_PREFIX) else entry
            if not _ENTITY_NAME.match(name) or len(name) > 260:
                raise bad(
                    "servicebus_destinations",
                    f"{entry!r} is not a queue name or topic:NAME; names are 1-260 letters, "
                    "digits, '.', '-', '_' or '/', starting with a letter or digit",
                )
            if name in seen:
                raise bad("servicebus_destinations", f"{name!r} is listed twice")
            if name == self.command_queue:
                raise bad(
                    "servicebus_destinations",
                    f"{name!r} is the command_queue, which outbox migrate creates on its own",
                )
            seen.add(name)

    def _validate_destinations(self, bad: Any) -> None:
        for name in self.destinations:
            if not _ENTITY_NAME.match(name) or len(name) > 260:
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
        d = dataclasses.asdict(self)
        d["workspace"] = str(self.workspace)
        d["storage_options"] = {k: "***" for k in self.storage_options}  # never print secrets
        d["kafka_options"] = {k: "***" for k in self.kafka_options}
        for secret in ("cosmos_key", "kafka_connection_string", "kafka_sasl_password"):
            d[secret] = "***" if getattr(self, secret) else ""
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
        when it exists.
        """
        env = os.environ if env is None else env
        ws = Path(workspace or env.get(f"{ENV_PREFIX}WORKSPACE") or ".outbox")
        raw: dict[str, Any] = {}
        path = config_file or env.get(f"{ENV_PREFIX}CONFIG")
        if path is None and (ws / SETTINGS_FILE).is_file():
            path = ws / SETTINGS_FILE
        if path is not None:
            raw.update(_read_toml(Path(path)))
            if "workspace" in raw and workspace is None and not env.get(f"{ENV_PREFIX}WORKSPACE"):
                ws = Path(str(raw["workspace"]))
        raw.update(_from_env(env))
        raw.update({k: v for k, v in overrides.items() if v is not None})
        raw["workspace"] = ws if workspace is not None else raw.get("workspace", ws)
        return cls.from_mapping(raw)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Settings:
        names = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in names:
                raise ConfigurationError(
                    f"unknown setting {key!r}{did_you_mean(key, names)}",
                    hint=f"known settings: {', '.join(sorted(names))}",
                )
            kwargs[key] = _coerce(key, value, cls._kind(key))
        return cls(**kwargs)

    @staticmethod
    def _kind(name: str) -> str:
        return _KINDS.get(name, "str")


_DURATIONS = {
    "rescue_delay",
    "rescue_interval",
    "lock_duration",
    "duplicate_detection_window",
    "inbox_retention",
    "log_retention",
    "watermark_window",
    "claim_log_timeout",
    "kafka_send_timeout",
    "sample_interval",
    "sample_retention",
}
_INTS = {
    "buckets",
    "max_message_bytes",
    "max_in_flight",
    "max_commit_retries",
    "max_delivery_count",
    "compact_every",
    "kafka_partitions",
}
#: How each setting is read from text, TOML or the environment (``_COERCE``); "str" otherwise.
_KINDS = {
    **dict.fromkeys(_DURATIONS, "duration"),
    **dict.fromkeys(_INTS, "int"),
    "storage_options": "dict",
    "kafka_options": "dict",
    "workspace": "path",
    "group_commit": "bool",
    "servicebus_destinations": "list",
    "destinations": "list",
}


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(value)
    return int(value)


def _as_dict(value: Any) -> dict[str, str]:
    if isinstance(value, str):
        pairs = [p.split("=", 1) for p in value.split(",") if p]
        return {k.strip(): v.strip() for k, v in pairs}
    if not isinstance(value, Mapping):
        raise ValueError(value)
    return {str(k): str(v) for k, v in value.items()}


def _as_list(value: Any) -> tuple[str, ...]:
    """A TOML array, or comma-separated text (environment variables)."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ValueError(value)
    return tuple(i.strip() for i in items if i.strip())


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


def _as_text(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(value)
    return value


#: Each kind's reader but "duration" (which needs the setting's name for its errors).
_COERCE: dict[str, Callable[[Any], Any]] = {
    "int": _as_int,
    "dict": _as_dict,
    "list": _as_list,
    "path": Path,
    "bool": _as_bool,
}


def _coerce(name: str, value: Any, kind: str) -> Any:
    try:
        if kind == "duration":
            return parse_duration(value, name=name)
        read: Callable[[Any], Any] = _COERCE.get(kind, _as_text)
        return read(value)
    except (ValueError, TypeError, ValidationError) as e:
        raise ConfigurationError(f"setting {name!r} has an invalid value {value!r}") from e


def _read_toml(path: Path) -> dict[str, Any]:
    """The ``[outbox]`` table of ``path``. Every way a file can fail to be a settings file is a
    ``ConfigurationError`` naming it: these are mistakes in a path or a file, not bugs."""
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError as e:
        raise ConfigurationError(f"settings file {path} does not exist") from e
    except IsADirectoryError as e:
        raise ConfigurationError(
            f"settings file {path} is a folder, not a file",
            hint=f"name the TOML file itself, e.g. --config {path / SETTINGS_FILE}",
        ) from e
    except OSError as e:
        raise ConfigurationError(
            f"settings file {path} cannot be read: {e.strerror or e}",
            hint="check the path and its permissions",
        ) from e
    except UnicodeDecodeError as e:  # tomllib decodes UTF-8 before it parses
        raise ConfigurationError(
            f"settings file {path} is not a TOML text file: byte {e.start} is not UTF-8",
            hint="point --config (OUTBOX_CONFIG) at the TOML settings file",
        ) from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigurationError(f"settings file {path} is not valid TOML: {e}") from e
    section = data.get("outbox", data)
    if not isinstance(section, dict):
        raise ConfigurationError(f"settings file {path}: [outbox] must be a table")
    if section is data:  # settings at the top: a table there is one of the dict settings
        tables = {"outbox"} | {n for n, kind in _KINDS.items() if kind == "dict"}
        for key, value in data.items():
            if isinstance(value, dict) and key not in tables:
                raise ConfigurationError(
                    f"settings file {path}: unknown section [{key}]{did_you_mean(key, tables)}",
                    hint="put the settings under [outbox], or at the top of the file",
                )
    return dict(section)


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(Settings)}
    out: dict[str, Any] = {}
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX) or key in (
            f"{ENV_PREFIX}WORKSPACE",
            f"{ENV_PREFIX}CONFIG",
        ):
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name in names:
            out[name] = value
        elif key not in OTHER_VARIABLES and not key.startswith(OTHER_PREFIXES):
            _warn_unknown_variable(key, names)
    return out


#: ``OUTBOX_*`` variables that are not settings but are read elsewhere (the Service Bus
#: connection, the Spark JARs, crash injection, the gateway's options, the test suites).
OTHER_VARIABLES = frozenset(
    f"{ENV_PREFIX}{n}"
    for n in (
        "WORKSPACE",
        "CONFIG",
        "DELTA_JARS",
        "CRASH_AT",
        "SERVICEBUS_CONNECTION_STRING",
        "SERVICEBUS_NAMESPACE",
        "SERVICEBUS_TOPICS",
        "SERVICEBUS_QUEUE",
        "SERVICEBUS_SESSIONS",
    )
)
OTHER_PREFIXES = (f"{ENV_PREFIX}GATEWAY_", f"{ENV_PREFIX}TEST_", f"{ENV_PREFIX}CHECK_")
_warned: set[str] = set()


def did_you_mean(name: str, known: Any) -> str:
    """`` (did you mean 'x'?)`` for the closest known name, or nothing."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _warn_unknown_variable(key: str, names: set[str]) -> None:
    """Once per process: a misspelt variable is otherwise silently ignored."""
    if key in _warned:
        return
    _warned.add(key)
    known = {f"{ENV_PREFIX}{n.upper()}" for n in names if n != "workspace"} | OTHER_VARIABLES
    log.warning(
        "ignoring the environment variable %s: no setting has that name%s",
        key,
        did_you_mean(key, known) or " (the settings table in docs/configuration.md lists them)",
    )
