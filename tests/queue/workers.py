"""Process entry points for the multi-process queue tests (importable: ``tests.children``
pickles a target by its name)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from dispatcher.queue import Consumer, SqlQueue
from dispatcher.queue.messages import ReceivedMessage


def _claim(markers: Path, key: str, violations: Path) -> Path:
    path = markers / key
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        with violations.open("a") as f:
            f.write(f"{key} held twice\n")
    return path


def compete(url: str, workdir: str, worker: int, start: Any = None, holding: Any = None) -> None:
    """Receive and complete until the queue is empty, proving exclusivity with O_EXCL markers
    that are held until the message is settled.

    With ``holding`` (a barrier across the receivers), a receiver records its first batch in
    ``first-<worker>.log`` and settles nothing until every receiver holds one: the receivers
    then hold locks at the same moment, so each gets some of the work whatever the scheduler
    does, and the first batches must be disjoint."""
    root = Path(workdir)
    markers, violations = root / "markers", root / "violations.txt"
    queue = SqlQueue(url, lock_duration=120)
    abandoned: set[str] = set()
    if start is not None:
        start.wait()  # every receiver starts at once, so they really compete
    while True:
        batch = queue.receive("work", 3)
        if not batch:
            if not queue.stats():
                break
            time.sleep(0.005)  # polling for other workers' completions, not waiting on time
            continue
        if holding is not None:
            (root / f"first-{worker}.log").write_text(
                "".join(f"{m.message_id} {m.session_id or '-'}\n" for m in batch)
            )
            holding.wait()  # every receiver holds a first batch now
            holding = None
        for m in batch:
            held = [_claim(markers, f"m-{m.message_id}", violations)]
            if m.session_id:
                held.append(_claim(markers, f"s-{m.session_id}", violations))
            # exercise redelivery: abandon every 7th message once
            again = int(m.message_id.split("-")[-1]) % 7 == 0 and m.message_id not in abandoned
            if m.session_id and not again:
                with (root / f"session-{m.session_id}.log").open("a") as f:
                    f.write(f"{m.message_id}\n")
            # Markers are held for the whole lock period and released at the last moment each
            # can be: the session's (and an abandoned message's) just before the settlement
            # that lets another receiver take them, a completed message's after (it is gone).
            message_marker, session_markers = held[0], held[1:]
            for path in session_markers:
                path.unlink()
            if again:
                abandoned.add(m.message_id)
                message_marker.unlink()
                queue.abandon(m)
                continue
            queue.complete(m)
            message_marker.unlink()
            with (root / f"done-{worker}.log").open("a") as f:
                f.write(f"{m.message_id}\n")
    queue.close()


def hold_and_hang(url: str, ready: str, count: int) -> None:
    """Take locks, say so, then hang until SIGKILLed."""
    queue = SqlQueue(url, lock_duration=30)
    got = queue.receive("work", count)
    tmp = Path(ready + ".tmp")
    tmp.write_text("\n".join(m.message_id for m in got))
    tmp.rename(ready)
    time.sleep(600)


def consume_until_sigterm(url: str, started: str) -> None:
    """Run a consumer whose handler takes a while; SIGTERM must let it finish cleanly."""
    queue = SqlQueue(url, lock_duration=30)

    def handler(m: ReceivedMessage) -> None:
        Path(started).write_text(m.message_id)
        time.sleep(0.5)  # in-flight work that SIGTERM arrives in the middle of

    Consumer(queue, "work", handler, poll_interval=0.05).run_forever()
    queue.close()
