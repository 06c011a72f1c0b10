"""Child processes of the multi-process tests, forked from a fork server that imported the heavy
modules once instead of spawned: a spawned child is a fresh interpreter that imports outbox,
deltalake, pyarrow and SQLAlchemy again, a second or two of CPU each, and these tests start
dozens. The server is single-threaded and never *uses* deltalake (forking a process that has
used it hangs the child), so forking it is safe where forking pytest would not be; the checker's
children come from such a server too (``outbox.app.checker.reap``).

The fork server is started once per test process, with the environment and working directory
of that moment; a child is given the parent's as they are when it is made (as a spawned child
would inherit them), so a variable a test set later still reaches it.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from typing import Any

#: Imported once by the fork server (a module missing here is imported by the child that needs
#: it: slower, never wrong; another module's preload list, if its server started first, too).
#: A test process has one fork server, whoever starts it first: this list holds the checker's
#: (``outbox.app.checker.reap.PRELOAD``), so its children lose nothing when these tests came first.
PRELOAD = [
    "outbox.app.checker.procs",
    "outbox.app.facade",
    "dispatcher.worker",
    "outbox.testing.faulty",
    "dispatcher.queue",
    "dispatcher.queue.inbox",
    "tests.dispatcher.procs",
    "tests.queue.workers",
    "tests.queue.order_workers",
    "psycopg",
]

#: The context every child here comes from (its ``Barrier``, ``Queue`` and ``Event`` too).
ctx: Any = multiprocessing.get_context("forkserver")
ctx.set_forkserver_preload(PRELOAD)


def process(target: Callable[..., object], *args: Any, **kwargs: Any) -> Any:
    """A child (not started) running ``target(*args, **kwargs)`` in this process's environment
    and working directory as they are now."""
    ctx.set_forkserver_preload(PRELOAD)  # no effect once this process's server runs
    return ctx.Process(
        target=_as_the_parent,
        args=(dict(os.environ), os.getcwd(), target, args, kwargs),
        name=getattr(target, "__name__", None),
    )


def _as_the_parent(
    environment: dict[str, str],
    cwd: str,
    target: Callable[..., object],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    os.environ.clear()
    os.environ.update(environment)
    os.chdir(cwd)
    target(*args, **kwargs)
