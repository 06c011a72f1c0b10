"""The ``outbox`` command, where it was before the renovation (issue 30) moved it to
:mod:`outbox.app.cli`: ``from outbox.cli import main`` and ``python -m outbox.cli`` keep working.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.core.lazy import lazy_exports

if TYPE_CHECKING:
    from outbox.app.cli import main

_EXPORTS = {"main": "outbox.app.cli"}

__all__ = ["main"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if __name__ == "__main__":  # pragma: no cover - run through subprocesses in the tests
    from outbox.app.cli import main as _main

    _main()
