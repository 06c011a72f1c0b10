"""Crash points: the testing kit's step hook, which raises or SIGKILLs at a chosen step.

The invariants (no loss, order, no phantom, idempotence) are only worth something if they hold when
the process dies *between* two steps. The dispatcher and the worker call ``hook.hit(name)`` at
each such step (``dispatcher.hooks``); production runs with a hook that does nothing. Install this
registry with ``install()`` (the fault proofs and the checker do) and the hits reach it. A test (or
a child process through ``OUTBOX_CRASH_AT``) arms a point, and the next hit raises
``InjectedCrash`` or kills the process with SIGKILL.

Points, in the order a message passes them:

``after_commit``
    the Delta commit returned, nothing sent yet;
``mid_batch``
    between two send batches of one dispatch (between documents, or between chunks of a long
    document when ``max_batch_messages`` splits it);
``after_send``
    every send settled, the watermark not written;
``during_watermark``
    right before the watermark append (with ``kill_soon`` the kill lands *inside* the commit);
``worker_holding``
    the worker holds locked commands and has read their documents, nothing sent.

``InjectedCrash`` derives from ``BaseException`` on purpose: like ``SystemExit`` it passes through
every ``except Exception`` in the dispatcher, so it behaves like the process stopping there rather
than like a send failure that the dispatcher would handle.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dispatcher import hooks
from dispatcher.hooks import POINTS
from outbox.core.errors import ConfigurationError, ValidationError

ENV_VAR = "OUTBOX_CRASH_AT"

Action = Callable[[str], None]


class InjectedCrash(BaseException):
    """Raised at an armed crash point; stands for the process dying there."""

    def __init__(self, point: str) -> None:
        self.point = point
        super().__init__(f"injected crash at {point!r}")


def raise_crash(point: str) -> None:
    raise InjectedCrash(point)


def kill_now(point: str) -> None:
    """SIGKILL this process: no ``finally``, no atexit, no flush. The real thing."""
    os.kill(os.getpid(), signal.SIGKILL)


def kill_soon(delay_seconds: float) -> Action:
    """Kill this process ``delay_seconds`` after the hit, while the step after the point runs."""

    def action(point: str) -> None:
        timer = threading.Timer(delay_seconds, kill_now, args=(point,))
        timer.daemon = True
        timer.start()

    return action


@dataclass
class _Armed:
    action: Action
    at_hit: int  # fire on this hit (1 = the next one)
    hits: int = 0


class CrashPoints:
    """A registry of armed points. Thread-safe; a point fires once, on its ``at_hit``-th hit."""

    def __init__(self, *, from_env: bool = False) -> None:
        self._lock = threading.Lock()
        self._armed: dict[str, _Armed] = {}
        self.fired: list[str] = []
        # Read OUTBOX_CRASH_AT at the first hit, not at import: a malformed value then fails the
        # run that uses crash points with a ConfigurationError, not every command at start-up.
        self._env_pending = from_env

    def arm(self, point: str, action: Action | None = None, *, at_hit: int = 1) -> None:
        """Make ``point`` fire on its ``at_hit``-th hit from now (default: raise InjectedCrash)."""
        if point not in POINTS:
            raise ValidationError(
                f"unknown crash point {point!r}", hint=f"known points: {', '.join(POINTS)}"
            )
        if at_hit < 1:
            raise ValidationError(f"at_hit {at_hit!r} must be at least 1 (it counts from 1)")
        with self._lock:
            self._armed[point] = _Armed(action or raise_crash, at_hit)

    def disarm(self, point: str | None = None) -> None:
        """Disarm ``point``, or every point (and forget what fired) when none is named."""
        with self._lock:
            if point is None:
                self._armed.clear()
                self.fired.clear()
                self._env_pending = False
            else:
                self._armed.pop(point, None)

    def hit(self, point: str) -> None:
        """Called by the dispatcher at ``point``; fires the armed action on the chosen hit."""
        if self._env_pending:  # the process-wide registry reads OUTBOX_CRASH_AT on first use
            self._arm_from_env_once()
        if not self._armed:  # the hot path: nothing armed
            return
        with self._lock:
            armed = self._armed.get(point)
            if armed is None:
                return
            armed.hits += 1
            if armed.hits < armed.at_hit:
                return
            del self._armed[point]
            self.fired.append(point)
        armed.action(point)

    def arm_from_env(self, env: Mapping[str, str] | None = None) -> None:
        """Arm from ``OUTBOX_CRASH_AT``: ``point[@n][=raise|kill|kill_soon:SECONDS]``.

        The default action is ``kill`` (SIGKILL): the variable exists for real child processes.
        Several specs may be separated by commas.
        """
        self._env_pending = False  # armed explicitly: the first hit must not arm again
        spec = (os.environ if env is None else env).get(ENV_VAR, "").strip()
        try:
            for part in filter(None, (p.strip() for p in spec.split(","))):
                name, _, how = part.partition("=")
                name, _, nth = name.partition("@")
                try:
                    at_hit = int(nth or 1)
                except ValueError as e:
                    raise ValidationError(f"{nth!r} is not a hit number") from e
                self.arm(name, parse_action(how or "kill"), at_hit=at_hit)
        except ValidationError as e:
            raise ConfigurationError(
                f"{ENV_VAR}={spec!r} is malformed: {e}",
                hint="write point[@n][=raise|kill|kill_soon:SECONDS], comma-separated, "
                f"or unset {ENV_VAR}",
            ) from e

    def _arm_from_env_once(self) -> None:
        with self._lock:
            if not self._env_pending:
                return
        self.arm_from_env()


def parse_action(text: str) -> Action:
    if text == "raise":
        return raise_crash
    if text == "kill":
        return kill_now
    if text.startswith("kill_soon:"):
        try:
            return kill_soon(float(text.split(":", 1)[1]))
        except ValueError as e:
            raise ValidationError(
                f"crash action {text!r}: not a number of seconds", hint="kill_soon:0.05"
            ) from e
    raise ValidationError(
        f"unknown crash action {text!r}", hint="use raise, kill or kill_soon:SECONDS"
    )


@dataclass(frozen=True)
class CrashSpec:
    """Crash points armed from ``spec`` (``OUTBOX_CRASH_AT``'s form), built where they are called:
    the step hook of a process the test cannot reach (a Spark executor's partition:
    ``SparkOutbox.executor_hook = CrashSpec("executor_sent@1=kill")``).

    Why a picklable object, not a spec string the executors parse: the crash behaviour is
    injected, so production code only calls a hook factory and never imports this kit. A
    malformed spec fails here, on the driver, with a ``ConfigurationError``."""

    spec: str

    def __post_init__(self) -> None:
        self()  # parse it once now: a bad spec is the caller's error, not an executor's

    def __call__(self) -> CrashPoints:
        points = CrashPoints()
        points.arm_from_env({ENV_VAR: self.spec})
        return points


#: The process-wide registry; ``install()`` makes it the hook new dispatchers and workers use.
crash_points = CrashPoints(from_env=True)


def install(points: CrashPoints | None = None) -> CrashPoints:
    """Install ``points`` (default: the process-wide registry) as the dispatcher's step hook."""
    chosen = points or crash_points
    hooks.install(chosen)
    return chosen
