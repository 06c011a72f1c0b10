"""The roof: everything an application or an operator touches, over the floors below.

- ``facade`` - ``Outbox``, the application's entry point (``Outbox.open``, ``unit_of_work``);
- ``spark`` - ``SparkOutbox``, the Spark write path (a DataFrame of changes, one Delta commit);
- ``status`` and ``maintenance`` - what ``outbox status`` reads and ``outbox maintain`` does;
- ``checker`` - the end-to-end invariant checker (``outbox check``);
- ``demos`` - the stories ``outbox demo`` tells;
- ``cli`` - the ``outbox`` command.

Nothing below imports from here (docs/design.md, "Layers"). ``from outbox.app import Outbox``
keeps working; the name is resolved on first use, so importing ``outbox.app.cli`` for
``outbox --help`` does not load the facade.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.core.lazy import guard, lazy_exports

if TYPE_CHECKING:
    from outbox.app.facade import Outbox

__all__ = ["Outbox"]

__getattr__, __dir__ = lazy_exports(__name__, {"Outbox": "outbox.app.facade"}, guard=guard)
