"""Source mutations: a function recompiled from its own source with an edit applied, patched
onto its class. ``tests/test_mutations.py`` runs its rows through ``mutated`` in process; a
child process of a process-level proof breaks itself with ``apply(name)`` (``CHILD``)."""

from __future__ import annotations

import importlib
import inspect
import linecache
import textwrap
import traceback
from typing import Any

#: Compile the recompiled function as its module was compiled (postponed annotations).
_ANNOTATIONS_FLAG: int = importlib.import_module("__future__").annotations.compiler_flag

#: The mutations a child process can apply to itself, by name: (target, edits).
CHILD: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "gate-lets-its-document-through": (
        "dispatcher.keys:KeyOrder.blocking",
        (("and (seq <= gate.last_seq or len(line) == 1):", ":"),),
    ),
    "nothing-closed-at-exit": (
        "outbox.core.shutdown:close_at_exit",
        (("_AT_EXIT.add(obj)", "pass"),),
    ),
    "exit-hook-joins-nothing": (
        "outbox.core.shutdown:_at_exit",
        (("_join_program_threads()", "pass"),),
    ),
}


def mutated(target: str, edits: tuple[tuple[str, str], ...]) -> tuple[Any, str, Any]:
    """(class or module, attribute, the function recompiled from its source with ``edits``
    applied)."""
    module_name, _, qualname = target.partition(":")
    *owner_path, attr = qualname.split(".")
    module = importlib.import_module(module_name)
    cls: Any = module
    for name in owner_path:
        cls = getattr(cls, name)
    original = inspect.unwrap(getattr(cls, attr))
    lines, first = inspect.getsourcelines(original)
    source = textwrap.dedent("".join(lines))
    for old, new in edits:
        count = source.count(old)
        assert count == 1, f"{target}: {old!r} is in its source {count} times, not once"
        source = source.replace(old, new)
    code = compile(
        "\n" * (first - 1) + source,  # tracebacks keep the real line numbers
        inspect.getsourcefile(original) or module_name,
        "exec",
        flags=_ANNOTATIONS_FLAG,
        dont_inherit=True,
    )
    defined: dict[str, Any] = {}
    exec(code, vars(module), defined)  # the module's globals, as the original sees them
    return cls, attr, defined[original.__name__]


def apply(name: str) -> None:
    """Break this process with the ``CHILD`` mutation ``name`` (for its whole life)."""
    target, edits = CHILD[name]
    owner, attr, broken = mutated(target, edits)
    setattr(owner, attr, broken)


def failing_line(error: BaseException, filename: str, function: str | None = None) -> str:
    """The source line in ``filename`` (and in ``function`` there, if given) that ``error`` was
    raised from, its innermost frame there: a mutation's test checks its owner failed on the line
    it names, not anywhere."""
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if f.filename == filename and (function is None or f.name == function)
    ]
    assert frames, f"the failure did not come from {function or filename}: {error!r}"
    return linecache.getline(filename, frames[-1].lineno or 0).strip()
