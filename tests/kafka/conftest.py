"""The Kafka tests: their broker fixtures (``kafka``, ``topic``) are in tests/conftest.py, which
the Spark tests share."""

from __future__ import annotations

import os

try:
    import confluent_kafka  # noqa: F401
except ImportError:  # under CI the test modules' own imports fail loudly instead
    if not os.environ.get("CI"):
        collect_ignore_glob = ["test_*.py"]
