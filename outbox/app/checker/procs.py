"""What the checker's child processes run. They are forked from a fresh ``forkserver`` that has
already imported the heavy modules (deltalake hangs in children forked from a process that has
*used* it; the server never has), so a child starts in milliseconds instead of seconds. Each opens
the workspace on its own, as a separate application or worker would.

A writer is an application: it saves documents with messages and dispatches them immediately
through a fault-injecting transport. A worker is ``outbox run-dispatcher`` with the checker's
broker as its transport (the CLI's transport comes from settings, and the checker needs every
send in one log, re-sends included). Both arm their crash point from the plan. ``raise`` stands for
an exception escaping at that point: a writer then reopens its ``Outbox`` (an application
restart) and goes on; a worker process ends with it and the supervisor starts a new one. When a
crash point fires, the child journals it first, so the report can list every planned fault and
whether it fired.

A *stranded* round is one only the rescuer can finish: fresh documents, every send of the round
fails, and the dispatcher's retry command is suppressed. A *mutation* (``mutations``,
named in ``cfg["mutation"]``) breaks the child on purpose, to prove the checker catches it.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outbox.app.checker import deleting, mutations
from outbox.app.checker.retries import RetryCommands

if TYPE_CHECKING:
    from outbox.app.checker.scenario import DeletePlan
    from outbox.testing.faulty import FaultyTransport

DESTINATION = "shipments"
MAKEUP_ROUNDS = 50  # at most this many extra rounds for a crash point the plan did not reach
OUTAGE_WAIT_LIMIT = 30.0  # a make-up round waits at most this long for an outage to end
AWAIT_KILL_LIMIT = 120.0  # a writer waits at most this long for the supervisor's SIGKILL


def _log_to(path: str) -> None:
    logging.basicConfig(
        level=logging.WARNING,
        filename=path,
        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s",
    )


class _Journal:
    """A writer's or worker's event log: one ``write(2)`` per line, so it survives SIGKILL."""

    def __init__(self, path: str) -> None:
        self._f = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - process-long

    def write(self, event: dict[str, Any]) -> None:
        self._f.write(json.dumps(event) + "\n")


class _Crash:
    """The process's planned crash point: armed, journaled when it fires, and (for
    ``kill_soon``) the pending SIGKILL, which the process waits for rather than exiting first."""

    def __init__(self, spec: str, journal: _Journal) -> None:
        from outbox.testing.crash_points import crash_points, install, kill_now, parse_action

        self.spec, self.fired = spec, False
        self.timers: list[threading.Timer] = []
        crash_points.disarm()
        install()
        if not spec:
            return
        name, _, how = spec.partition("=")
        point, _, nth = name.partition("@")
        how = how or "kill"
        action = parse_action(how)  # validates the spec

        def fire(hit: str) -> None:
            self.fired = True
            journal.write({"event": "fired", "point": hit, "spec": spec, "at": time.time()})
            if how.startswith("kill_soon:"):
                # our own timer, kept: a process about to exit waits for it (see ``settle``)
                timer = threading.Timer(float(how.split(":", 1)[1]), kill_now, args=(hit,))
                timer.daemon = True
                self.timers.append(timer)
                timer.start()
                return
            action(hit)

        crash_points.arm(point, fire, at_hit=int(nth or 1))

    @property
    def pending(self) -> bool:
        """Planned and not fired yet in this process."""
        return bool(self.spec) and not self.fired

    def settle(self) -> None:
        """Wait for a ``kill_soon`` SIGKILL already on its way: exiting first would leave a fault
        that journaled "fired" without the kill ever landing."""
        for timer in self.timers:
            timer.join()


def _transport(cfg: dict[str, Any], role: str, seed: int) -> FaultyTransport:
    from outbox.app.checker.broker import LogTransport
    from outbox.testing.faulty import FaultyTransport

    faulty = FaultyTransport(
        LogTransport(cfg["log"], role=role, outage_flag=cfg["outage_flag"]), seed=seed
    )
    faulty.failure_rate(cfg["failure_rate"])
    if cfg["latency_ms"]:
        faulty.latency(cfg["latency_ms"] / 1000, jitter=cfg["latency_ms"] / 1000)
    return faulty


@dataclass
class _Round:
    index: int
    ids: list[str]
    msgs: int
    stranded: bool
    conflicted: bool = False


def plan_rounds(cfg: dict[str, Any], rng: random.Random) -> list[_Round]:
    """A writer's planned rounds, drawn first from its generator (the tests pick seeds by them:
    which documents a round touches, how many messages each gets)."""
    shared = [f"pkg-{i:03d}" for i in range(cfg["pool"])]
    private = [f"w{cfg['index']}-{i:03d}" for i in range(cfg["pool"])]
    lo, hi = cfg["docs_per_round"]
    mlo, mhi = cfg["msgs_per_doc"]
    plan = []
    for r in range(cfg["rounds"]):
        pool = private if rng.random() < cfg.get("private_share", 0.0) else shared
        ids = sorted(rng.sample(pool, rng.randint(lo, min(hi, len(pool)))))
        stranded = r in cfg.get("stranded", ())
        if stranded:  # fresh documents: no later save can carry their messages out
            ids = [f"w{cfg['index']}-s{r}-{k}" for k in range(len(ids))]
        conflicted = r in cfg.get("conflicted", ())
        plan.append(_Round(r, ids, rng.randint(mlo, mhi), stranded, conflicted))
    return plan


class _Writer:
    """One application process: its rounds, its ``Outbox`` (reopened after a raised crash)."""

    def __init__(self, cfg: dict[str, Any], journal: _Journal, crash: _Crash) -> None:
        self.cfg, self.journal, self.crash = cfg, journal, crash
        self.rng = random.Random(cfg["seed"])
        self.mutation = mutations.get(cfg.get("mutation"))
        self.rounds = plan_rounds(cfg, self.rng)
        self.ob, self.faulty, self.retries = self._open()

    def _open(self) -> tuple[Any, FaultyTransport, RetryCommands]:
        from outbox.app.facade import Outbox

        faulty = _transport(self.cfg, "writer", self.rng.randrange(2**31))
        transport = self.mutation.wrap_transport(faulty) if self.mutation else faulty
        ob = Outbox.open(
            self.cfg["workspace"], create=False, transport=transport, **self.cfg["settings"]
        )
        if self.mutation:
            self.mutation.patch_outbox(ob)
        return ob, faulty, RetryCommands(ob.runtime, self.journal)

    def reopen(self) -> None:
        """An application restart after a crash escaped the dispatcher."""
        self.ob.close()
        self.ob, self.faulty, self.retries = self._open()

    def run(self, start: int) -> None:
        """The planned rounds from ``start``, then make-up rounds while the crash point has not
        fired (see ``_makeup``)."""
        for rnd in self.rounds[start:]:
            self._journaled(rnd)
        index = max(start, len(self.rounds))
        while self.crash.pending and index < len(self.rounds) + MAKEUP_ROUNDS:
            self._journaled(self._makeup(index))
            index += 1
        self.ob.close()
        self.journal.write({"event": "done"})

    def _journaled(self, rnd: _Round) -> None:
        retries_before = self.ob.store.commit_retries
        event = self._round(rnd)
        event["commit_retries"] = self.ob.store.commit_retries - max(0, retries_before)
        event["makeup"] = rnd.index >= len(self.rounds)
        self.journal.write(event)

    def _makeup(self, index: int) -> _Round:
        """An extra round on this writer's private documents, for a crash point the planned
        rounds did not reach: most points need a send that succeeded, and an outage or the send
        failure rate can take every send of a short plan. Waiting out an outage first (as an
        application retrying later would) means the round's sends can reach the broker, so the
        planned fault fires whatever the timing was."""
        flag = Path(self.cfg["outage_flag"])
        deadline = time.monotonic() + OUTAGE_WAIT_LIMIT
        while flag.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        private = [f"w{self.cfg['index']}-{i:03d}" for i in range(self.cfg["pool"])]
        ids = sorted(self.rng.sample(private, min(2, len(private))))
        return _Round(index, ids, 2, stranded=False)

    def _round(self, rnd: _Round) -> dict[str, Any]:
        from outbox.core.errors import ConcurrencyError, OutboxError
        from outbox.testing.crash_points import InjectedCrash

        event: dict[str, Any] = {"event": "round", "round": rnd.index, "occ_retries": 0}
        event["stranded"] = rnd.stranded
        delete = deleting.plan_for(self.cfg, rnd.index) if not rnd.stranded else None
        self.faulty.outage(rnd.stranded)
        self.retries.suppress = self.retries.stranded = rnd.stranded
        compete, attempts, refused_until = rnd.conflicted, 0, 0.0
        try:
            while attempts < 20:
                try:
                    done = self._save(rnd, compete=compete, delete=delete)
                    return {**event, "saved": True, **self._delete(delete, rnd, done)}
                except ConcurrencyError as e:
                    compete = False
                    # A create over another writer's tombstone whose last messages are not
                    # sent yet is refused: wait for them (a worker or the rescuer sends them)
                    # as a retrying application would, rather than spend the round's retries.
                    refused_until = refused_until or time.monotonic() + deleting.REFUSED_WAIT_LIMIT
                    if deleting.refused(e) and time.monotonic() < refused_until:
                        event["refused"] = int(event.get("refused", 0)) + 1
                        time.sleep(deleting.REFUSED_PAUSE)
                        continue
                    attempts += 1
                    event["occ_retries"] += 1  # another writer saved one of these first
                except InjectedCrash as e:
                    # The commit happened, then the dispatcher "died": restart the application.
                    self.reopen()
                    return {**event, "saved": True, "crash": e.point}
                except OutboxError as e:
                    return {
                        **event,
                        "saved": False,
                        "error": type(e).__name__,
                        "message": str(e)[:300],
                    }
            return {**event, "saved": False, "error": "GaveUp", "message": "20 OCC retries"}
        finally:
            self.faulty.outage(False)
            self.retries.suppress = self.retries.stranded = False

    def _save(
        self, rnd: _Round, *, compete: bool = False, delete: DeletePlan | None = None
    ) -> bool:
        """The round's unit of work; True when it also made the planned delete (``last``)."""
        with self.ob.unit_of_work() as uow:
            docs = uow.get_many(rnd.ids)
            if compete:
                self._compete(rnd)
            for doc_id in rnd.ids:
                doc = docs.get(doc_id) or uow.create(doc_id, type="package")
                for k in range(rnd.msgs):
                    body = {"doc": doc_id, "writer": self.cfg["index"], "round": rnd.index, "k": k}
                    doc.send("StatusChanged", body, destination=DESTINATION)
                doc.state["updates"] = int(doc.state.get("updates", 0)) + rnd.msgs
            return deleting.in_round(uow, delete, rnd.ids, set(docs))

    def _delete(self, plan: DeletePlan | None, rnd: _Round, done: bool) -> dict[str, Any]:
        """The round's planned delete (and re-create) once it saved: what the journal keeps.
        A crash point that fires in it is the round's (``crash``), as one in the save is."""
        if plan is None:
            return {}
        out = deleting.after_round(self, plan, rnd.ids, done=done)
        crash = out.pop("crash", None)
        return {"delete": out, **({"crash": crash} if crash else {})}

    def _compete(self, rnd: _Round) -> None:
        """Another unit of work commits a message on the round's first document now, between
        the round's read and its commit; its dispatch fails (the round's retry carries it)."""
        from outbox.core.errors import ConcurrencyError

        doc_id = rnd.ids[0]
        self.faulty.outage(True)
        suppress, self.retries.suppress = self.retries.suppress, True
        deadline = time.monotonic() + deleting.REFUSED_WAIT_LIMIT
        try:
            while True:
                try:
                    with self.ob.unit_of_work() as other:
                        doc = other.get(doc_id) or other.create(doc_id, type="package")
                        body = {"doc": doc_id, "writer": self.cfg["index"], "round": rnd.index}
                        doc.send("Competing", {**body, "competing": True}, destination=DESTINATION)
                    return
                except ConcurrencyError:
                    # another writer's delete left a tombstone whose last messages are not sent
                    # (the create is refused), or a save came first: the competing save must
                    # still commit, or the round would have no lost race
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(deleting.REFUSED_PAUSE)
        finally:
            self.faulty.outage(rnd.stranded)
            self.retries.suppress = suppress


def with_environment(
    main: Callable[[dict[str, Any]], None], cfg: dict[str, Any], environment: dict[str, str]
) -> None:
    """Run ``main`` with the supervisor's environment as it is now. Why: the fork server is
    started once per supervisor process, and its children inherit *its* environment, which
    misses any variable set since (an object store's endpoint, say: deltalake reads
    ``AZURITE_BLOB_STORAGE_URL`` and the ``AWS_*`` variables from the environment)."""
    os.environ.clear()
    os.environ.update(environment)
    main(cfg)


def writer_main(cfg: dict[str, Any]) -> None:
    """Run rounds ``cfg['start']..cfg['rounds']``: one unit of work each, journaled.

    ``cfg['await_kill']``: the supervisor still means to SIGKILL this writer (after a round it
    has journaled by now), so once done it waits for that kill instead of exiting: the planned
    kill then always finds it alive, however late the supervisor looks.
    """
    mutation = mutations.get(cfg.get("mutation"))
    if mutation:
        mutation.at_writer_start()
    _log_to(cfg["stderr"])
    journal = _Journal(cfg["journal"])
    crash = _Crash(cfg["crash"], journal)
    _Writer(cfg, journal, crash).run(cfg["start"])
    crash.settle()
    if cfg.get("await_kill"):
        journal.write({"event": "awaiting_kill", "at": time.time()})
        threading.Event().wait(AWAIT_KILL_LIMIT)
        os._exit(3)  # the supervisor never came: the kill stays unfired in the report


def worker_main(cfg: dict[str, Any]) -> None:
    """``outbox run-dispatcher`` on the checker's broker, until SIGTERM (or a crash point)."""
    from dispatcher.worker import DispatcherWorker
    from outbox.app.facade import Outbox

    _log_to(cfg["stderr"])
    _Crash(cfg["crash"], _Journal(cfg["journal"]))
    mutation = mutations.get(cfg.get("mutation"))
    faulty = _transport(cfg, "worker", cfg["seed"])
    transport = mutation.wrap_transport(faulty) if mutation else faulty
    with Outbox.open(cfg["workspace"], create=False, transport=transport, **cfg["settings"]) as ob:
        if mutation:
            mutation.patch_outbox(ob)
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
