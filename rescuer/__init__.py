"""The change-data-feed rescuer: finds documents whose messages were committed but never
dispatched, and enqueues a command for each.

Its ports (``typing.Protocol``s) are exported here: ``CheckpointStore`` (where a rescuer
remembers how far it read), ``CommandSink`` (where rescue commands go) and ``Engine`` (how the
table is read: delta-rs or Spark). They are resolved on first use (PEP 562), so importing this
package loads neither SQLAlchemy nor an engine (never pyspark).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.core.lazy import lazy_exports

if TYPE_CHECKING:
    from rescuer.checkpoint import CheckpointStore
    from rescuer.planner import Engine
    from rescuer.sink import CommandSink

_EXPORTS = {
    "CheckpointStore": "rescuer.checkpoint",
    "CommandSink": "rescuer.sink",
    "Engine": "rescuer.planner",
}

__all__ = ["CheckpointStore", "CommandSink", "Engine"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
