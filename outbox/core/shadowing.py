"""A user's module that hides one of the wheel's top-level packages is named in one line.

Why: the wheel installs ``dispatcher``, ``rescuer`` and ``migrations`` as top-level packages (the
card's layout), and Python puts the program's own folder first on ``sys.path``. A ``dispatcher.py``
next to the user's ``app.py`` (or a ``migrations/`` package) then wins, and ``Outbox.open`` failed
deep inside with ``ModuleNotFoundError: No module named 'dispatcher.runtime'; 'dispatcher' is not a
package``. The check looks each name up with ``importlib.util.find_spec`` (a top-level lookup
imports nothing) and compares where it was found with where ours lie, beside this package.
"""

from __future__ import annotations

import functools
import importlib.util
import os

from outbox.core.errors import ShadowedPackageError

#: The top-level packages the wheel installs besides ``outbox`` (pyproject's ``only-include``).
PACKAGES = ("dispatcher", "rescuer", "migrations")

#: Where ours are: the folder that holds the ``outbox`` package.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def _same(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def shadowing(name: str) -> ShadowedPackageError | None:
    """The error for ``name`` when the module Python would import under that name is not ours;
    None when it is ours, or when nothing is found (a broken install fails on its own)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a half-imported module of that name
        spec = None
    if spec is None:
        return None
    ours = os.path.join(ROOT, name, "__init__.py")
    if spec.origin is not None and spec.origin not in ("namespace", "built-in", "frozen"):
        found = spec.origin
        if _same(found, ours):
            return None
    else:  # a namespace package: a folder without __init__.py that nothing regular outranked
        locations = list(spec.submodule_search_locations or [])
        if any(_same(p, os.path.dirname(ours)) for p in locations):
            return None
        found = locations[0] if locations else name
    package = os.path.basename(found) == "__init__.py" or os.path.isdir(found)
    where = os.path.dirname(found) if os.path.basename(found) == "__init__.py" else found
    kind = "package" if package else "module"
    return ShadowedPackageError(
        f"your {kind} {where} hides delta-outbox's package '{name}' (installed in {ROOT}), so "
        "the outbox cannot import its own",
        hint=f"rename your {kind} (e.g. my_{name}) and its imports, or run your program from a "
        f"folder that does not hold a '{name}'",
    )


@functools.cache
def check_top_level_packages() -> None:
    """Raise ``ShadowedPackageError`` for the first of ``PACKAGES`` hidden by a user's module.

    Called before anything imports those packages (the public modules' first heavy name, the
    CLI's group); a clean result is remembered for the process (a raise is not cached)."""
    for name in PACKAGES:
        error = shadowing(name)
        if error is not None:
            raise error
