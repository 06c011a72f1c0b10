"""What the checker's child processes run (multiprocessing ``spawn``: deltalake hangs in forked
children). Each opens the workspace on its own, as a separate application or worker would.

A writer is an application: it saves documents with messages and dispatches them immediately
through a fault-injecting transport. A worker is ``outbox run-dispatcher`` with the checker's
broker as its transport (the CLI's transport comes from settings, and the checker needs every
send in one log, re-sends included). Both arm their crash point from the plan. ``raise`` stands for
an exception escaping at that point: a writer then reopens its ``Outbox`` (an application
restart) and goes on; a worker process ends with it and the supervisor starts a new one.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
from pathlib import Path
from typing import Any

DESTINATION = "shipments"


def _journal(path: str) -> Any:
    return open(path, "a", buffering=1, encoding="utf-8")


def _log_to(path: str) -> None:
    logging.basicConfig(
        level=logging.WARNING,
        filename=path,
        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s",
    )


def _transport(cfg: dict[str, Any], role: str, seed: int) -> Any:
    from outbox.checker.broker import LogTransport
    from outbox.testing.faulty import FaultyTransport

    faulty = FaultyTransport(
        LogTransport(cfg["log"], role=role, outage_flag=cfg["outage_flag"]), seed=seed
    )
    faulty.failure_rate(cfg["failure_rate"])
    if cfg["latency_ms"]:
        faulty.latency(cfg["latency_ms"] / 1000, jitter=cfg["latency_ms"] / 1000)
    return faulty


def writer_main(cfg: dict[str, Any]) -> None:
    """Run rounds ``cfg['start']..cfg['rounds']``: one unit of work each, journaled."""
    from outbox.app import Outbox
    from outbox.core.errors import ConcurrencyError, OutboxError
    from outbox.testing.crash_points import ENV_VAR, InjectedCrash, crash_points, install

    _log_to(cfg["stderr"])
    crash_points.disarm()
    install()
    crash_points.arm_from_env({ENV_VAR: cfg["crash"]})
    rng = random.Random(cfg["seed"])
    journal = _journal(cfg["journal"])
    shared = [f"pkg-{i:03d}" for i in range(cfg["pool"])]
    private = [f"w{cfg['index']}-{i:03d}" for i in range(cfg["pool"])]
    lo, hi = cfg["docs_per_round"]
    mlo, mhi = cfg["msgs_per_doc"]
    plan = []
    for _ in range(cfg["rounds"]):
        pool = private if rng.random() < cfg.get("private_share", 0.0) else shared
        ids = sorted(rng.sample(pool, rng.randint(lo, min(hi, len(pool)))))
        plan.append((ids, rng.randint(mlo, mhi)))

    def open_outbox() -> Any:
        return Outbox.open(
            cfg["workspace"],
            create=False,
            transport=_transport(cfg, "writer", rng.randrange(2**31)),
            **cfg["settings"],
        )

    ob = open_outbox()
    for r in range(cfg["start"], cfg["rounds"]):
        ids, n_msgs = plan[r]
        retries_before = ob.store.commit_retries
        event: dict[str, Any] = {"event": "round", "round": r, "occ_retries": 0}
        for _attempt in range(20):
            try:
                with ob.unit_of_work() as uow:
                    docs = uow.get_many(ids)
                    for doc_id in ids:
                        doc = docs.get(doc_id) or uow.create(doc_id, type="package")
                        for k in range(n_msgs):
                            doc.send(
                                "StatusChanged",
                                {"doc": doc_id, "writer": cfg["index"], "round": r, "k": k},
                                destination=DESTINATION,
                            )
                        doc.state["updates"] = int(doc.state.get("updates", 0)) + n_msgs
                event["saved"] = True
                break
            except ConcurrencyError:
                event["occ_retries"] += 1  # another writer saved one of these documents first
            except InjectedCrash as e:
                # The commit happened, then the dispatcher "died": restart the application.
                event.update(saved=True, crash=e.point)
                journal.write(json.dumps(event) + "\n")
                ob.close()
                ob = open_outbox()
                break
            except OutboxError as e:
                event.update(saved=False, error=type(e).__name__, message=str(e)[:300])
                break
        else:
            event.update(saved=False, error="GaveUp", message="20 optimistic-concurrency retries")
        event["commit_retries"] = ob.store.commit_retries - max(0, retries_before)
        if "crash" not in event:
            journal.write(json.dumps(event) + "\n")
    ob.close()
    journal.write(json.dumps({"event": "done"}) + "\n")


def worker_main(cfg: dict[str, Any]) -> None:
    """``outbox run-dispatcher`` on the checker's broker, until SIGTERM (or a crash point)."""
    from dispatcher.worker import DispatcherWorker
    from outbox.app import Outbox
    from outbox.testing.crash_points import ENV_VAR, crash_points, install

    _log_to(cfg["stderr"])
    crash_points.disarm()
    install()
    crash_points.arm_from_env({ENV_VAR: cfg["crash"]})
    with Outbox.open(
        cfg["workspace"],
        create=False,
        transport=_transport(cfg, "worker", cfg["seed"]),
        **cfg["settings"],
    ) as ob:
        worker = DispatcherWorker(
            ob.runtime,
            batch_size=8,
            poll_interval=0.05,
            backoff_base=0.1,
            backoff_max=1.0,
            seed=cfg["seed"],
        )
        worker.run()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (deltalake's runtime threads make it slow)


def read_journal(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_text("utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line torn by SIGKILL
    return out
