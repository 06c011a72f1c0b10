"""Targets for real child processes (``tests.children``: forked from a fork server that never used
deltalake; it hangs in children forked from a process that has).

Each child opens the workspace on its own, as a separate application or worker process would, and
may arm a crash point (``point[@n]=kill|kill_soon:S|raise``) so it dies there for real.
"""

from __future__ import annotations

import logging

from dispatcher.worker import DispatcherWorker
from outbox.app.facade import Outbox
from outbox.testing.crash_points import ENV_VAR, crash_points, install
from tests.dispatcher.helpers import write_docs


def writer(workspace: str, n_docs: int, n_msgs: int, crash: str, max_batch: int) -> None:
    install()
    crash_points.arm_from_env({ENV_VAR: crash})
    with Outbox.open(workspace, default_destination="shipments", create=False) as ob:
        ob.runtime.dispatcher.max_batch_messages = max_batch
        write_docs(ob, {}, n_docs, n_msgs)


def worker(workspace: str, crash: str, until_idle: bool = True, batch_size: int = 4) -> None:
    logging.basicConfig(level=logging.WARNING)
    install()
    crash_points.arm_from_env({ENV_VAR: crash})
    with Outbox.open(workspace, create=False) as ob:
        worker = DispatcherWorker(ob.runtime, batch_size=batch_size, poll_interval=0.05)
        worker.run(until_idle=until_idle)
