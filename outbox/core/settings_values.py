"""How one setting's value is declared and read: ``setting(...)`` declares a field (its default,
the sentence the settings reference prints, whether it is a secret), and ``coerce`` reads a value
from TOML, an ``OUTBOX_*`` variable or a Python argument by the field's kind.

Why a kind per field rather than per call site: the same value arrives as TOML (a number, an
array, a table), as text (every environment variable) or as a Python object, and the three must
agree. The kind follows from the default (a float is a duration, a tuple a list, a dict a table),
so a new setting needs no entry in a separate table.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from outbox.core.durations import parse_duration
from outbox.core.errors import ConfigurationError, ValidationError

#: Field metadata keys (``setting`` writes them, the reference and ``to_dict`` read them).
DOC, SECRET, SHOWN, KIND = "doc", "secret", "shown", "kind"


def setting(
    default: Any,
    doc: str,
    *,
    secret: bool = False,
    shown: str | None = None,
    kind: str | None = None,
) -> Any:
    """A settings field: ``default`` (a dict or a list is copied for each object), ``doc`` (its
    row in the generated reference, docs/configuration.md), ``secret`` (never printed nor in
    ``repr``), ``shown`` (the default as the reference writes it, when the value alone would
    mislead, e.g. ``<workspace>/documents``) and ``kind`` (how text is read, when the default's
    type does not say: see ``kind_of``)."""
    metadata = {DOC: doc, SECRET: secret, SHOWN: shown, KIND: kind or _kind_of_value(default)}
    if isinstance(default, dict | list):
        made = type(default)
        return dataclasses.field(
            default_factory=lambda: made(default), metadata=metadata, repr=not secret
        )
    return dataclasses.field(default=default, metadata=metadata, repr=not secret)


#: A default's type and the kind it gives (the first match: a bool is an int to isinstance).
_KIND_OF_TYPE: tuple[tuple[type[Any] | tuple[type[Any], ...], str], ...] = (
    (bool, "bool"),
    (int, "int"),
    (float, "duration"),  # every float setting is a duration in seconds
    (dict, "dict"),
    ((tuple, list), "list"),
    (Path, "path"),
)


def _kind_of_value(default: Any) -> str:
    return next((kind for t, kind in _KIND_OF_TYPE if isinstance(default, t)), "str")


def kind_of(f: dataclasses.Field[Any]) -> str:
    """How the field's value is read (``str``, ``int``, ``bool``, ``duration``, ``dict``,
    ``list``, ``path``)."""
    return str(f.metadata.get(KIND) or "str")


def default_of(f: dataclasses.Field[Any]) -> Any:
    """The field's default (a fresh one for a dict or a list)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    factory: Any = f.default_factory
    return factory()


def is_secret(f: dataclasses.Field[Any]) -> bool:
    return bool(f.metadata.get(SECRET))


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


def coerce(name: str, value: Any, kind: str) -> Any:
    """``value`` read as ``kind``; ``ConfigurationError`` naming the setting ``name``."""
    try:
        if kind == "duration":
            return parse_duration(value, name=name)
        read: Callable[[Any], Any] = _COERCE.get(kind, _as_text)
        return read(value)
    except (ValueError, TypeError, ValidationError) as e:
        raise ConfigurationError(f"setting {name!r} has an invalid value {value!r}") from e


def did_you_mean(name: str, known: Any) -> str:
    """`` (did you mean 'x'?)`` for the closest known name, or nothing."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def shown_default(f: dataclasses.Field[Any]) -> str:
    """The default as the settings reference prints it: ``15s``, ``{}``, ``none``..."""
    if f.metadata.get(SHOWN):
        return str(f.metadata[SHOWN])
    value = default_of(f)
    if value in (None, "", ()):
        return "none"
    if kind_of(f) == "duration":
        return f"`{short_duration(float(value))}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict):
        return "`{}`"
    return f"`{value}`"


def short_duration(seconds: float) -> str:
    """``15s``, ``10m``, ``7d``, ``200ms``: the largest unit that divides the duration."""
    if seconds == 0:
        return "0s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{round(seconds * 1000)}ms"
