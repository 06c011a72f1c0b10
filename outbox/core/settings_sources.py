"""Where settings come from besides arguments: the TOML settings file and the ``OUTBOX_*``
variables. Each source is read into one layer (``settings_sections.group``: core names, and the
backends' settings by section) that ``Settings.load`` lays over the one below.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from outbox.core.errors import ConfigurationError
from outbox.core.settings_sections import ENV_PREFIX, SECTIONS, group
from outbox.core.settings_values import did_you_mean

log = logging.getLogger("outbox.settings")

SETTINGS_FILE = "outbox.toml"

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


def _load(path: Path) -> dict[str, Any]:
    """The file's TOML. Every way a file can fail to be a settings file is a
    ``ConfigurationError`` naming it: these are mistakes in a path or a file, not bugs."""
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
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


def read_file(path: Path, core: Collection[str], tables: Collection[str]) -> dict[str, Any]:
    """The settings of ``path``: the ``[outbox]`` table (or the top of the file when there is
    none) and the backends' sections (``[kafka]``...). ``tables`` are the core settings a table
    may hold at the top (``[storage_options]``). With ``[outbox]``, other tables are ignored as
    before (the file may be shared), except one whose name is close to a section's (a typo)."""
    data = _load(path)
    top = data.get("outbox", data)
    if not isinstance(top, dict):
        raise ConfigurationError(f"settings file {path}: [outbox] must be a table")
    values = dict(top)
    if top is not data:
        for key, value in data.items():
            if key == "outbox" or not isinstance(value, dict):
                continue
            if SECTIONS.find(key) is not None:  # a third party's is found by its entry point
                if key in values:
                    raise ConfigurationError(
                        f"settings file {path}: [{key}] is given twice, at the top and inside "
                        "[outbox]",
                        hint=f"keep the top-level [{key}]",
                    )
                values[key] = value
            elif close := did_you_mean(key, SECTIONS.names()):
                raise ConfigurationError(f"settings file {path}: unknown section [{key}]{close}")
    else:  # settings at the top: a table there is a section or a dict setting
        allowed = {"outbox", *tables}
        for key, value in data.items():
            if not isinstance(value, dict) or key in allowed:
                continue
            if SECTIONS.get(key) is None and SECTIONS.flat(key) is None and not SECTIONS.find(key):
                known = allowed | set(SECTIONS.names())
                raise ConfigurationError(
                    f"settings file {path}: unknown section [{key}]{did_you_mean(key, known)}",
                    hint="put the settings under [outbox], or at the top of the file",
                )
    return group(values, core, where=f"settings file {path}")


def from_env(env: Mapping[str, str], core: Collection[str]) -> dict[str, Any]:
    """The ``OUTBOX_*`` variables that name settings: ``OUTBOX_<NAME>`` for a core setting,
    ``OUTBOX_<SECTION>_<KEY>`` for a backend's; any other is warned about once, never fatal."""
    out: dict[str, Any] = {}
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX) or key in (
            f"{ENV_PREFIX}WORKSPACE",
            f"{ENV_PREFIX}CONFIG",
        ):
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name in core:
            out[name] = value
        elif key in OTHER_VARIABLES or key.startswith(OTHER_PREFIXES):
            continue
        elif (found := SECTIONS.split(name)) is not None:
            options, option = found
            out.setdefault(options.SECTION, {})[option] = value
        else:
            _warn_unknown_variable(key, core)
    return group(out, core)


def _warn_unknown_variable(key: str, core: Collection[str]) -> None:
    """Once per process: a misspelt variable is otherwise silently ignored."""
    if key in _warned:
        return
    _warned.add(key)
    known = {f"{ENV_PREFIX}{n.upper()}" for n in core if n != "workspace"} | OTHER_VARIABLES
    known |= {o.variable(k) for o in SECTIONS for k in o.option_fields()}
    log.warning(
        "ignoring the environment variable %s: no setting has that name%s",
        key,
        did_you_mean(key, known) or " (the settings table in docs/configuration.md lists them)",
    )
