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
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps a public name to its module."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value  # resolve once
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
