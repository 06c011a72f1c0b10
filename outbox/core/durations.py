"""Human durations (``15s``, ``5m``, ``1h30m``, ``250ms``) used by settings and the CLI, and the
one way a duration is keyed in JSON output (seconds, under a key ending ``_s``)."""

from __future__ import annotations

import math
import re
from typing import Any

from outbox.core.errors import ValidationError

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_HOW = "write it like 15s, 90s, 5m, 1h or 1h30m"
#: A duration's key names its unit, and the one unit is the second (``_s``); the library's own
#: names for the same values (``lag_seconds``, a report's ``seconds``, a retention in
#: ``_hours``) are renamed on their way out, so every command (the ``outbox`` CLI and the Spark
#: rescue job alike) follows the one convention.
_SECONDS_SUFFIXES = {"_seconds": 1, "_hours": 3600}
_BARE_NAMES = {"seconds": "duration_s"}
#: Mappings whose keys are the user's (a message's application properties), never renamed.
_USER_KEYS = frozenset({"headers"})


def parse_duration(
    text: str | float | int, *, name: str = "duration", need_unit: bool = False
) -> float:
    """Seconds in ``text``; ``ValidationError`` names ``name``.

    A bare number means seconds (a TOML number, an ``OUTBOX_*`` variable), unless ``need_unit``:
    on a command line ``--poll-interval 5`` reads as 5 ms to one person and 5 minutes to
    another, so the CLI asks for the unit instead of guessing."""
    if isinstance(text, bool):
        raise ValidationError(f"{name}: expected a duration like 15s, 5m or 1h, got {text!r}")
    if isinstance(text, int | float):
        if not math.isfinite(text):  # TOML has inf and nan: no wait is that long
            raise ValidationError(f"{name}: {text!r} is not a duration", hint=_HOW)
        if text < 0:
            raise ValidationError(f"{name}: a duration cannot be negative, got {text!r}")
        return float(text)
    raw = text.strip().lower().replace(" ", "")
    try:
        value = float(raw)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):  # float() reads "inf" and "nan" too
            raise ValidationError(f"{name}: {text!r} is not a duration", hint=_HOW)
        if value < 0:
            raise ValidationError(f"{name}: a duration cannot be negative, got {text!r}")
        if need_unit:
            raise ValidationError(
                f"{name}: {text!r} has no unit",
                hint=f"say which: {raw}ms, {raw}s, {raw}m or {raw}h",
            )
        return value
    pos, total = 0, 0.0
    for m in _PART.finditer(raw):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if pos != len(raw) or not raw:
        raise ValidationError(f"{name}: {text!r} is not a duration", hint=_HOW)
    return total


def format_duration(seconds: float) -> str:
    """Short human form for reports: ``45s``, ``12m05s``, ``2h03m``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    h, m, sec = s // 3600, (s % 3600) // 60, s % 60
    return f"{h}h{m:02d}m{sec:02d}s" if sec else f"{h}h{m:02d}m"


def unit_keys(data: Any) -> Any:
    """``data`` with every duration keyed in seconds, ``_s``: ``lag_seconds`` -> ``lag_s``,
    ``seconds`` -> ``duration_s``, ``vacuum_retention_hours`` (2) -> ``vacuum_retention_s``
    (7200). Scripts then read one unit from every command, whatever the report's field is
    called in Python. A message's headers keep their keys: those names are the user's."""
    if isinstance(data, list | tuple):
        return [unit_keys(v) for v in data]
    if not isinstance(data, dict):
        return data
    out: dict[Any, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str) or key in _USER_KEYS:
            out[key] = value
            continue
        name, factor = _BARE_NAMES.get(key, key), 1
        for suffix, seconds in _SECONDS_SUFFIXES.items():
            if name.endswith(suffix):
                name, factor = name.removesuffix(suffix) + "_s", seconds
        scaled = factor != 1 and isinstance(value, int | float) and not isinstance(value, bool)
        out[name] = value * factor if scaled else unit_keys(value)
    return out
