"""Children of the per-key order proof (``test_key_order_processes``): writers that commit in
phases a supervisor opens by files, and a command worker. Spawned, not forked (deltalake hangs in
forked children).

``local_lines`` is the mutation: the child keeps its paused keys in its own memory, as every
process did before the lines moved to the queue's database, so a key paused by a writer holds
nothing in the worker.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

KEYS_PER_WRITER = 3
SHARED = "shared"


def _open(ws: str, bootstrap: str, topic: str, local_lines: bool) -> Any:
    from dispatcher.queue.key_lines import MemoryKeyLines
    from outbox.app.facade import Outbox

    ob = Outbox.open(
        ws,
        create=False,
        transport="kafka",
        kafka_bootstrap_servers=bootstrap,
        kafka_send_timeout=2.0,
        default_destination=topic,
    )
    if local_lines:
        ob.runtime.dispatcher.keys.lines = MemoryKeyLines()
    return ob


def _wait_file(path: Path, deadline: float = 300.0) -> None:
    end = time.monotonic() + deadline
    while not path.exists():
        if time.monotonic() > end:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)


def writer(
    where: tuple[str, str, str], w: int, phases: str, per_phase: int, local_lines: bool
) -> None:
    """Commit ``per_phase`` units of work in each of three phases; each sends one message on one
    of this writer's keys, numbered in commit order. Every third unit of work adds a message to
    the document two commits back (a document that may be a key's gate). Writer 0 also sends one
    message on the ``SHARED`` key in phase 2 (the broker is down: it pauses the key), the others
    one each in phase 3 (committed after it: they must wait behind it)."""
    logging.basicConfig(level=logging.WARNING)
    folder = Path(phases)
    n = 0
    with _open(*where, local_lines) as ob:
        for phase in (1, 2, 3):
            _wait_file(folder / f"go-{phase}")
            shared = (phase == 2 and w == 0) or (phase == 3 and w > 0)
            if shared:  # one key of all writers: paused by writer 0's failed send
                with ob.unit_of_work() as uow:
                    doc = uow.create(f"w{w}-shared", type="T")
                    doc.send(
                        "E",
                        json.dumps({"key": SHARED, "phase": phase, "w": w}),
                        ordering_key=SHARED,
                    )
            for _ in range(per_phase):
                key = f"w{w}-k{n % KEYS_PER_WRITER}"
                body = json.dumps({"key": key, "n": n})
                with ob.unit_of_work() as uow:
                    if n % 3 == 2:
                        doc = uow.get(f"w{w}-d{n - 2}")
                        assert doc is not None
                        key = f"w{w}-k{(n - 2) % KEYS_PER_WRITER}"
                        body = json.dumps({"key": key, "n": n})
                    else:
                        doc = uow.create(f"w{w}-d{n}", type="T")
                    doc.send("E", body, ordering_key=key)
                n += 1
            (folder / f"w{w}-{phase}").touch()


def worker(where: tuple[str, str, str], stop: str, local_lines: bool) -> None:
    """``outbox run-dispatcher --batch-size 1`` until ``stop`` appears."""
    import threading

    from dispatcher.worker import DispatcherWorker

    logging.basicConfig(level=logging.WARNING)
    with _open(*where, local_lines) as ob:
        w = DispatcherWorker(ob.runtime, batch_size=1, poll_interval=0.05)

        def watch() -> None:
            _wait_file(Path(stop), deadline=3600)
            w.stop()

        threading.Thread(target=watch, daemon=True).start()
        w.run()
