"""One table taken through every state (``testkit.table_states``), built once per module: the
readers only read it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox.core.clock import ManualClock
from testkit.table_states import TableStates
from tests.write_path.conftest import bare_outbox


def build_states(where: Path) -> TableStates:
    """The standard run on a fresh bare outbox in ``where`` (the caller closes ``.ob``)."""
    return TableStates(bare_outbox(where / "ws", ManualClock(), buckets=4)).run()


@pytest.fixture(scope="module")
def states(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TableStates]:
    built = build_states(tmp_path_factory.mktemp("states"))
    yield built
    built.ob.close()
