"""The rescuer as a library: one pass over the change feed, its checkpoints, engines and sinks.

``outbox rescue`` and the Spark job (``outbox-rescue-spark``) are the usual way in; these names are
for a program that runs passes itself (docs/rescuer.md). Names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.core.lazy import guard, lazy_exports

if TYPE_CHECKING:
    from rescuer.cdf_local import LocalEngine
    from rescuer.cdf_spark import SparkEngine
    from rescuer.checkpoint import (
        Checkpoint,
        CheckpointStore,
        InMemoryCheckpointStore,
        SqlCheckpointStore,
    )
    from rescuer.runner import PassReport, RescuePass, run_pass
    from rescuer.sink import CommandSink, InMemorySink, QueueSink

_EXPORTS = {
    "run_pass": "rescuer.runner",
    "RescuePass": "rescuer.runner",
    "PassReport": "rescuer.runner",
    "Checkpoint": "rescuer.checkpoint",
    "CheckpointStore": "rescuer.checkpoint",
    "SqlCheckpointStore": "rescuer.checkpoint",
    "InMemoryCheckpointStore": "rescuer.checkpoint",
    "LocalEngine": "rescuer.cdf_local",
    "SparkEngine": "rescuer.cdf_spark",
    "CommandSink": "rescuer.sink",
    "QueueSink": "rescuer.sink",
    "InMemorySink": "rescuer.sink",
}

__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "CommandSink",
    "InMemoryCheckpointStore",
    "InMemorySink",
    "LocalEngine",
    "PassReport",
    "QueueSink",
    "RescuePass",
    "SparkEngine",
    "SqlCheckpointStore",
    "run_pass",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, guard=guard)
