"""Human durations (``15s``, ``5m``, ``1h30m``, ``250ms``) used by settings and the CLI."""

from __future__ import annotations

import math
import re

from outbox.core.errors import ValidationError

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_HOW = "write it like 15s, 90s, 5m, 1h or 1h30m"


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
