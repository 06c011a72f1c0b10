"""Every exit code the ``outbox`` command uses, in one place, each number meaning one thing.

Scripts and health checks branch on these numbers, so a code never changes meaning and two
names never share a number.

=====  ===================  ===================================================================
code   name                 meaning
=====  ===================  ===================================================================
0      OK                   done; for ``status``, ``demo`` and ``check``: healthy / every
                            invariant held
1      ERROR                an ``OutboxError`` (bad setting, missing workspace, unreachable
                            database, ...): one ``error: ...`` line on stderr says why and how
                            to fix it; ``status`` also uses it when it cannot read a part of
                            the workspace; ``run-dispatcher --once``/``--until-idle``: a
                            command was abandoned, dead-lettered or lost its lock
2      USAGE                a malformed command line (unknown option, bad option value):
                            click's code, one ``error: ...`` line on stderr
3      PENDING_TOO_OLD      ``status --fail-if-pending-older-than``: the oldest pending message
                            is older than the limit; ``erase --pending send``: documents
                            still have pending messages (run it again)
4      DEAD_LETTERS         ``status --fail-if-dead-letters``: a queue holds dead letters
5      INVARIANT_BROKEN     ``demo`` / ``check``: an invariant (I1-I6) broke; the report says
                            which
130    INTERRUPTED          Ctrl-C (SIGINT): stopped before finishing; nothing committed was
                            lost (128 + SIGINT, as shells report it)
141    BROKEN_PIPE          the reader of the output went away (``outbox status | head -1``):
                            the command stopped writing there, quietly; what it had done is
                            done (128 + SIGPIPE, as shells report ``yes | head -1``)
=====  ===================  ===================================================================

The long-running commands (``run-dispatcher``, ``rescue --every``, ``run-gateway``) take the first
SIGTERM or Ctrl-C as "stop": they finish the work in hand and exit 0 (``--once``/``--until-idle``:
0 or 1 by what they did), since nothing was cut short. 130 is for a command Ctrl-C cut short (a
one-shot command, or the second Ctrl-C). A bad duration (no unit, a zero wait) or setting value
is an ``OutboxError`` (1), like the same value in a settings file; 2 is the command line's own
shape: click's checks (unknown option, a value not of the option's type or range, before or
after the command name), options that exclude each other (``--once --until-idle``) and an empty
``--workspace``/``--config``.
"""

from __future__ import annotations

from typing import Final

OK: Final = 0
ERROR: Final = 1
USAGE: Final = 2
PENDING_TOO_OLD: Final = 3
DEAD_LETTERS: Final = 4
INVARIANT_BROKEN: Final = 5
INTERRUPTED: Final = 130
BROKEN_PIPE: Final = 141

#: name -> code, for the docs and the test that keeps the numbers distinct.
ALL: Final[dict[str, int]] = {
    "OK": OK,
    "ERROR": ERROR,
    "USAGE": USAGE,
    "PENDING_TOO_OLD": PENDING_TOO_OLD,
    "DEAD_LETTERS": DEAD_LETTERS,
    "INVARIANT_BROKEN": INVARIANT_BROKEN,
    "INTERRUPTED": INTERRUPTED,
    "BROKEN_PIPE": BROKEN_PIPE,
}
