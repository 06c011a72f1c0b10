"""Two processes, one delivery each of one message id, released together, over the Cosmos inbox
on the local Cosmos-protocol server: the handler runs in one process only (the worker and the
SQL version: tests/queue/test_inbox_processes.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from migrations.sql import upgrade
from outbox.core.settings import Settings
from tests.cosmos.server import KEY
from tests.queue.test_inbox_processes import finish, run_two_processes

pytestmark = pytest.mark.slow


def test_two_processes_one_handler(
    tmp_path: Path, cosmos_endpoint: str, cosmos_settings: Settings, cosmos_inbox_container: Any
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    upgrade(url)
    spec = (
        "cosmos",
        cosmos_endpoint,
        KEY,
        cosmos_settings.cosmos_database,
        cosmos_settings.cosmos_inbox_container,
    )
    lines = run_two_processes(url, spec, tmp_path)
    assert len(lines) == 1, f"the handler ran in both processes: {lines}"
    assert finish(url, spec) == []
