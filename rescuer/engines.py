"""Pick an engine by name (``--engine local|spark``)."""

from __future__ import annotations

from collections.abc import Mapping

from outbox.core.errors import ValidationError
from rescuer.planner import Engine

ENGINES = ("local", "spark")


def make_engine(name: str, *, storage_options: Mapping[str, str] | None = None) -> Engine:
    """``local`` (delta-rs, the default, no JVM) or ``spark`` (PySpark + delta-spark)."""
    if name == "local":
        from rescuer.cdf_local import LocalEngine

        return LocalEngine(storage_options=storage_options)
    if name == "spark":
        from rescuer.cdf_spark import SparkEngine

        return SparkEngine(storage_options=storage_options)
    raise ValidationError(f"unknown rescuer engine {name!r}", hint="use --engine local or spark")
