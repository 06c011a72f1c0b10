"""Lazy package exports (PEP 562), shared by every package that exports names from heavy modules.

Why: a package's ``__init__`` that imported its public names eagerly would load SQLAlchemy,
deltalake or the facade for any import of a small sibling module, and ``outbox``'s own
``__init__`` would import the dispatcher back from the kernel's home. Resolving on first use keeps
imports light and the layers acyclic at run time.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(
    package: str,
    exports: Mapping[str, str],
    *,
    guard: Callable[[str], None] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps a public name to its module.

    ``guard(module)`` runs before a module is first imported for a name (the public modules check
    there that no user module hides ``dispatcher``: ``outbox.core.shadowing``)."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if guard is not None:
            guard(module)
        value = getattr(import_module(module), name)
        namespace[name] = value  # resolve once
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__


def guard(module: str) -> None:
    """The ``guard`` of the public modules: a name from the kernel (``outbox.core``) needs none
    of the top-level packages, so the errors themselves stay importable; anything else first
    checks that no user module hides ``dispatcher``, ``rescuer`` or ``migrations``
    (``outbox.core.shadowing``, imported only then: ``import outbox`` stays as light as before)."""
    if not module.startswith("outbox.core."):
        from outbox.core.shadowing import check_top_level_packages

        check_top_level_packages()
