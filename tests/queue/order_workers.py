"""Process entry points for the redelivery-order proof (importable: ``tests.children`` pickles
a target by its name).

Every handling is one ``os.write`` of one line to a log opened with ``O_APPEND``, so the lines of
all processes land in one file in the order they were written.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from dispatcher.queue import SqlQueue

QUEUE = "order"


def _record(log: int, line: str) -> None:
    os.write(log, line.encode())


def _claim(markers: Path, key: str, violations: Path) -> Path:
    """An O_EXCL marker per session while a receiver holds it: two at once is a violation."""
    path = markers / key
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        with violations.open("a") as f:
            f.write(f"{key} held twice\n")
    return path


def work(url: str, workdir: str, worker: int, start: Any, holding: Any = None) -> None:
    """Handle until nothing is left but dead letters: a poison body is abandoned (50 ms backoff)
    until it is dead-lettered; every message whose index is 1 mod 4 is abandoned with a 200 ms
    backoff on its first delivery; the rest are completed.

    With ``holding`` (a barrier across the workers), a worker handles nothing of its first batch
    until every worker holds one, so each takes part however the machine schedules them."""
    root = Path(workdir)
    markers, violations = root / "markers", root / "violations.txt"
    queue = SqlQueue(url, lock_duration=20, max_delivery_count=3)
    log = os.open(root / "handled.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    start.wait()
    while True:
        batch = queue.receive(QUEUE, 2)
        if not batch:
            stats = queue.stats(QUEUE).get(QUEUE)
            if stats is None or stats.total == 0:
                break
            time.sleep(0.01)  # polling for backoffs and an expired lock, not waiting on time
            continue
        if holding is not None:
            holding.wait()  # every worker holds a first batch now
            holding = None
        for m in batch:
            marker = _claim(markers, f"s-{m.session_id}", violations)
            _record(log, f"{m.session_id} {m.message_id} {m.delivery_count} w{worker}\n")
            index = int(m.message_id.split("-")[1])
            marker.unlink()  # released just before the settlement that frees the session
            if m.body == b"poison":
                queue.abandon(m, delay=0.05)
            elif index % 4 == 1 and m.delivery_count == 1:
                queue.abandon(m, delay=0.2)
            else:
                queue.complete(m)
    os.close(log)
    queue.close()


def take_and_hang(url: str, workdir: str, ready: str) -> None:
    """Take three sessions' heads with a 1 s lock, record their handling, then hang until
    SIGKILLed: those messages come back only when the locks expire."""
    root = Path(workdir)
    queue = SqlQueue(url, lock_duration=1, max_delivery_count=3)
    log = os.open(root / "handled.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    got = queue.receive(QUEUE, 3)
    for m in got:
        _record(log, f"{m.session_id} {m.message_id} {m.delivery_count} killed\n")
    tmp = Path(ready + ".tmp")
    tmp.write_text("\n".join(m.message_id for m in got))
    tmp.rename(ready)
    time.sleep(600)
