"""Counters recorded outside dispatcher/metrics.py: Delta conflict retries and lock renewals."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake.exceptions import CommitFailedError

from dispatcher.queue.lock_renewer import LockRenewer
from dispatcher.queue.messages import ReceivedMessage
from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock
from tests.telemetry.conftest import Otel


def test_conflict_retries_are_counted(
    workspace: Path, clock: ManualClock, otel: Otel, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Outbox.open(workspace, clock=clock, default_destination="events") as ob:
        from outbox.delta import appends

        calls = {"n": 0}
        real = appends.append

        def flaky(*a: Any, **k: Any) -> Any:
            calls["n"] += 1
            if calls["n"] <= 2:
                raise CommitFailedError("Transaction failed: version already exists")
            return real(*a, **k)

        monkeypatch.setattr(appends, "append", flaky)
        with ob.unit_of_work() as uow:
            uow.create("a", type="T")
        assert ob.store.commit_retries == 2
    assert otel.metric_points()["outbox.conflict_retries"] == 2


class RenewingQueue:
    lock_duration = timedelta(seconds=10)

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock

    def renew_lock(self, msg: ReceivedMessage) -> datetime:
        return self.clock.now() + self.lock_duration


def test_lock_renewals_are_counted(clock: ManualClock, otel: Otel) -> None:
    now = clock.now()
    held = [
        ReceivedMessage("q", f"m{i}", b"", i, now, 1, f"t{i}", now + timedelta(seconds=1))
        for i in range(2)
    ]
    renewer = LockRenewer(RenewingQueue(clock), lambda: held, clock, check_interval=0.001)  # type: ignore[arg-type]
    with renewer:
        deadline = time.monotonic() + 10
        while renewer.renewals < 2:  # both locks are due (1 s left of 10): one renewal each
            assert time.monotonic() < deadline, "the renewer never renewed"
            time.sleep(0.001)
    assert otel.metric_points()["outbox.lock.renewals"] == renewer.renewals == 2
