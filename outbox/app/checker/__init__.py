"""The end-to-end checker behind ``outbox check``: writer processes, dispatcher worker processes
and rescuer passes run together under seeded faults, then the delivery log is held against every
committed message (I1, I2, I3, I4, I6), with exact counts.

Why a package of its own, outside ``tests/``: operators run it as a soak (``outbox check --seeds
20 --minutes 10``) against a release, and the test suite runs a fixed set of seeds through the same
code. Everything heavy (deltalake, the dispatcher, the rescuer) is imported inside functions, so
``import outbox`` stays cheap.
"""

from __future__ import annotations

from outbox.app.checker.report import CheckReport

__all__ = ["CheckReport"]
