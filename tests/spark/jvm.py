"""JVM options for the short-lived JVMs the tests start in child processes: the shipped
``outbox.app.checker.jvm`` ones (C1 only, serial GC). Only child JVMs get them: the in-process
SparkSession runs the whole Spark group for minutes, where C2's code pays back."""

from __future__ import annotations

from outbox.app.checker.jvm import SHORT_LIVED_JVM_OPTIONS as CHILD_JVM_OPTIONS
from outbox.app.checker.jvm import short_lived_jvm_env as child_jvm_env

__all__ = ["CHILD_JVM_OPTIONS", "child_jvm_env"]
