"""A seed becomes a fault plan: how many writers and workers, what each writes, where each one
crashes, when the supervisor SIGKILLs whom, when the broker is down.

The seed fixes the *plan*, not the operating system's scheduling: replaying a seed replays the same
faults at the same hits and times, which is what makes a failure reproducible in practice (the
same crash point, the same kill, the same outage), even though processes interleave differently.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field, replace
from typing import Any

WRITER_POINTS = ("after_commit", "mid_batch", "after_send", "during_watermark")
#: How a writer deletes (``outbox.app.checker.deleting``): ``last``, in the round's own unit of
#: work, after the round's messages (its last ones); ``bare``, in a unit of work of its own with
#: no message; ``raced``, the same, with another unit of work saving the document between the
#: delete's read and its commit (the delete loses and is retried).
DELETE_KINDS = ("last", "bare", "raced")
#: The share of a writer's ordinary rounds followed by a delete.
DELETE_RATE = 0.2
#: XORed into the seed for the delete decisions' own generator: drawing them from the plan's
#: generator would shift every later draw, and every seed's plan with it.
DELETE_STREAM = 0xDE1E7E
WORKER_POINTS = ("worker_holding", "mid_batch", "after_send", "during_watermark")
ACTIONS = ("raise", "kill", "kill_soon:0.01")


@dataclass(frozen=True, slots=True)
class WriterPlan:
    index: int
    seed: int
    rounds: int
    crash: str  # OUTBOX_CRASH_AT spec ("" = none), e.g. "after_send@3=kill"
    #: Rounds whose messages only the rescuer can deliver: they go to fresh documents no later
    #: round touches, every send of the round fails, and the dispatcher's retry command is
    #: suppressed (as when its process dies before enqueueing it).
    stranded: tuple[int, ...] = ()
    #: Rounds whose first save loses a race on purpose: another unit of work commits a message on
    #: the same document between the read and the commit (its dispatch fails), so the save
    #: raises ``ConcurrencyError`` and is retried. Without it a seed may have no failed commit,
    #: and nothing could show a message sent before its commit (I3).
    conflicted: tuple[int, ...] = ()
    #: Deletes after some rounds (``DeletePlan``), drawn from a generator of their own.
    deletes: tuple[DeletePlan, ...] = ()


@dataclass(frozen=True, slots=True)
class DeletePlan:
    """A delete through the library after round ``round``: of the round's document
    ``pick % len(ids)`` (one the round just saved), as ``kind`` says (``DELETE_KINDS``), then,
    with ``recreate``, the id created again at once (a new life, or refused while the
    tombstone's last messages are not sent: the writer waits and retries)."""

    round: int
    kind: str
    pick: int
    recreate: bool

    def describe(self) -> str:
        return f"round {self.round} {self.kind}" + (" +recreate" if self.recreate else "")


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    index: int
    seed: int
    crash: str


@dataclass(frozen=True, slots=True)
class SparkPlan:
    """The Spark writer of ``outbox check --writer spark`` (``outbox.app.checker.spark_writer``).

    ``batches[b]``: (document, messages) pairs applied in one ``SparkOutbox.apply``: a few of
    the Python writers' shared documents (the same ids and buckets they commit to) and the
    writer's own. ``crash``: the ``after_commit`` crash point on one batch (kill or raise).
    """

    index: int
    seed: int
    batches: tuple[tuple[tuple[str, int], ...], ...]
    crash: str

    @property
    def rounds(self) -> int:
        return len(self.batches)


@dataclass(frozen=True, slots=True)
class Kill:
    """A SIGKILL from the supervisor. A writer is killed once its journal shows ``after_round``
    rounds done (a point it surely reaches alive, wherever its own crash point sent it); a worker
    at ``at`` seconds, or when the writers are done if that comes first, so every kill lands."""

    at: float  # seconds after the start
    role: str  # "writer" or "worker"
    index: int
    after_round: int = 0

    def describe(self) -> str:
        when = f"after round {self.after_round}" if self.role == "writer" else f"at {self.at}s"
        return f"SIGKILL {self.role} {self.index} {when}"


@dataclass(frozen=True, slots=True)
class Outage:
    at: float
    seconds: float


@dataclass(frozen=True)
class Scenario:
    seed: int
    pool: int  # documents shared by all writers: same ids -> optimistic-concurrency retries
    buckets: int  # few buckets: writers and watermark MERGEs collide -> Delta commit conflicts
    docs_per_round: tuple[int, int]
    msgs_per_doc: tuple[int, int]
    failure_rate: float  # per send, in every process
    latency_ms: float
    rescue_failure_rate: float  # a pass dies before its checkpoint (Ctrl-C, crash)
    #: Share of rounds on documents only that writer touches: when it dies there, no other
    #: writer's save carries its stuck messages out, so the rescuer and the worker must.
    private_share: float = 0.0
    writers: list[WriterPlan] = field(default_factory=list)
    workers: list[WorkerPlan] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    outages: list[Outage] = field(default_factory=list)
    spark: SparkPlan | None = None  # ``--writer spark``: one Spark driver beside the writers

    @classmethod
    def from_seed(
        cls, seed: int, *, scale: float = 1.0, writer: str = "python", deletes: bool = True
    ) -> Scenario:
        """``scale`` multiplies the work (rounds per writer); the soak uses more than the tests.

        Every fault is placed where it fires: crash points on an early hit, writer kills at a
        round the writer reaches, worker kills and outages no later than the end of the writes.
        ``writer="spark"`` adds a Spark writer, drawn from a generator of its own so that the
        rest of the plan is the same seed's plan without it. ``deletes`` (the default) adds the
        writers' deletes, also from a generator of their own (``_deletes``): the seed's other
        operations are the same with or without them.
        """
        rng = random.Random(seed)
        n_writers = rng.randint(2, 3)
        n_workers = rng.randint(1, 2)
        writers = [_writer(rng, i, scale) for i in range(n_writers)]
        workers = [
            WorkerPlan(
                i,
                rng.randrange(2**31),
                _crash(rng, WORKER_POINTS, at_most=1) if i == 0 and rng.random() < 0.7 else "",
            )
            for i in range(n_workers)
        ]
        horizon = 1.0 + 1.0 * scale
        kills = [_kill(rng, writers, n_workers, horizon) for _ in range(rng.randint(1, 2))]
        outages = [
            Outage(round(rng.uniform(0.2, horizon), 2), round(rng.uniform(0.2, 0.8), 2))
            for _ in range(rng.randint(0, 2))
        ]
        private_share = rng.choice((0.0, 0.3, 0.6))  # drawn in this order: seeds replay plans
        pool = rng.randint(6, 16)
        spark = _spark(seed, len(writers), pool, scale) if writer == "spark" else None
        if deletes:
            writers = _deletes(seed, writers)
        return cls(
            seed=seed,
            spark=spark,
            private_share=private_share,
            pool=pool,
            buckets=rng.choice((1, 2, 4)),
            docs_per_round=(1, rng.randint(2, 4)),
            msgs_per_doc=(1, rng.randint(1, 3)),
            failure_rate=rng.choice((0.0, 0.05, 0.15)),
            latency_ms=rng.choice((0.0, 2.0, 10.0)),
            rescue_failure_rate=rng.choice((0.0, 0.2)),
            writers=writers,
            workers=workers,
            kills=sorted(kills, key=lambda k: (k.at, k.after_round)),
            outages=sorted(outages, key=lambda o: o.at),
        )

    def faults(self) -> list[str]:
        """Every planned fault, named as the report lists it (outages always happen)."""
        out = [f"writer {w.index} crash {w.crash}" for w in self.writers if w.crash]
        out += [f"worker {w.index} crash {w.crash}" for w in self.workers if w.crash]
        out += [k.describe() for k in self.kills]
        out += [f"stranded writer {w.index} round {r}" for w in self.writers for r in w.stranded]
        if self.spark is not None:
            out.append(f"writer {self.spark.index} crash {self.spark.crash}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        crashes = [w.crash for w in self.writers if w.crash] + [
            w.crash for w in self.workers if w.crash
        ]
        return (
            f"seed {self.seed}: {len(self.writers)} writers x "
            f"{'/'.join(str(w.rounds) for w in self.writers)} rounds on {self.pool} docs in "
            f"{self.buckets} bucket(s), {len(self.workers)} worker(s); crash points "
            f"{crashes or 'none'}; {[k.describe() for k in self.kills]}; stranded rounds "
            f"{[(w.index, r) for w in self.writers for r in w.stranded]}; "
            f"outages {[(o.at, o.seconds) for o in self.outages]}; send failure rate "
            f"{self.failure_rate}, latency {self.latency_ms} ms, rescue failure rate "
            f"{self.rescue_failure_rate}, private rounds {self.private_share:.0%}; deletes "
            f"{[(w.index, d.describe()) for w in self.writers for d in w.deletes]}"
            + (
                f"; Spark writer {self.spark.index}: {self.spark.rounds} batches of "
                f"{'/'.join(str(len(b)) for b in self.spark.batches)} docs, crash "
                f"{self.spark.crash}"
                if self.spark is not None
                else ""
            )
        )


def _crash(rng: random.Random, points: tuple[str, ...], *, at_most: int) -> str:
    """A crash spec. Points hit only after a successful send (``mid_batch``,
    ``during_watermark``) fire on their first hit: with few rounds, some failing on purpose, a
    later hit may never come."""
    point = rng.choice(points)
    hit = rng.randint(1, at_most)
    if point in ("mid_batch", "during_watermark"):
        hit = 1
    return f"{point}@{hit}={rng.choice(ACTIONS)}"


def _writer(rng: random.Random, index: int, scale: float) -> WriterPlan:
    rounds = max(3, round(rng.randint(4, 8) * scale))
    crash = _crash(rng, WRITER_POINTS, at_most=2) if rng.random() < 0.8 else ""
    # writer 0 always strands a round: every seed needs the rescuer for some messages
    stranded = (rng.randrange(rounds),) if index == 0 or rng.random() < 0.5 else ()
    normal = [r for r in range(rounds) if r not in stranded]
    conflicted = (rng.choice(normal),) if index == 0 else ()
    return WriterPlan(index, rng.randrange(2**31), rounds, crash, stranded, conflicted)


def _deletes(seed: int, writers: list[WriterPlan]) -> list[WriterPlan]:
    """The writers with their deletes: after a ``DELETE_RATE`` share of their ordinary rounds
    (neither stranded nor conflicted: those are placed for the rescuer and for I3), of a kind
    from ``DELETE_KINDS``, half of them re-created at once. Writer 1 (every seed has two writers
    at least) always races one against a save, and some delete of the seed is re-created."""
    rng = random.Random(seed ^ DELETE_STREAM)
    out = []
    for w in writers:
        ordinary = [r for r in range(w.rounds) if r not in w.stranded and r not in w.conflicted]
        plans = [
            DeletePlan(r, rng.choice(DELETE_KINDS), rng.randrange(64), rng.random() < 0.5)
            for r in ordinary
            if rng.random() < DELETE_RATE
        ]
        if w.index == 1 and ordinary and not any(d.kind == "raced" for d in plans):
            r = rng.choice([r for r in ordinary if r not in {d.round for d in plans}] or ordinary)
            plans = [d for d in plans if d.round != r]
            plans.append(DeletePlan(r, "raced", rng.randrange(64), rng.random() < 0.5))
        out.append(replace(w, deletes=tuple(sorted(plans, key=lambda d: d.round))))
    if not any(d.recreate for w in out for d in w.deletes):
        w = out[1]
        first = replace(w.deletes[0], recreate=True)
        out[1] = replace(w, deletes=(first, *w.deletes[1:]))
    return out


def _spark(seed: int, index: int, pool: int, scale: float) -> SparkPlan:
    """A Spark writer's batches: 2-3 of them, each on 1-3 shared documents and its own (about
    8-24 at scale 1), 1-2 messages a document; the crash point on one batch's commit."""
    rng = random.Random(seed ^ 0x5A4B)
    shared = [f"pkg-{i:03d}" for i in range(pool)]
    own = [f"spark-{i:03d}" for i in range(max(4, round(rng.randint(8, 24) * scale)))]
    batches = []
    for _ in range(rng.randint(2, 3)):
        docs = sorted(rng.sample(shared, rng.randint(1, 3))) + own
        batches.append(tuple((d, rng.randint(1, 2)) for d in docs))
    crash = f"after_commit@{rng.randint(1, len(batches))}={rng.choice(('kill', 'kill', 'raise'))}"
    return SparkPlan(index, rng.randrange(2**31), tuple(batches), crash)


def _kill(rng: random.Random, writers: list[WriterPlan], n_workers: int, horizon: float) -> Kill:
    if rng.random() < 0.6:
        w = rng.choice(writers)
        return Kill(0.0, "writer", w.index, after_round=rng.randint(1, max(1, w.rounds - 2)))
    return Kill(round(rng.uniform(0.3, horizon), 2), "worker", rng.randrange(n_workers))
