"""A user's ``dispatcher.py`` or ``migrations/`` package beside their program hides the wheel's
top-level package of that name: one line naming the clash and the fix, never a traceback.

Real processes in a folder holding the user's module, with that folder first on the path (as
``python app.py`` puts the program's folder first): through the CLI (``python -m outbox.cli`` and
the ``outbox`` script) and through the library (``Outbox.open`` in the user's ``app.py``).
Before this check the library failed with ``ModuleNotFoundError: No module named
'dispatcher.runtime'; 'dispatcher' is not a package`` and the CLI with an "unexpected" line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from outbox.core.errors import ConfigurationError, OutboxError, ShadowedPackageError
from outbox.core.shadowing import ROOT, shadowing

REPO = Path(__file__).resolve().parents[1]
OUTBOX = str(Path(sys.executable).with_name("outbox"))

APP = """\
import outbox

try:
    from outbox import Outbox

    Outbox.open(".outbox").close()
except outbox.OutboxError as e:
    print(type(e).__name__, e)
else:
    print("opened")
"""


def _env(first: Path) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(first), path) if p)}


def _user_folder(tmp_path: Path, clash: str) -> Path:
    """The user's project: their ``app.py`` and the clashing module (or none)."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "app.py").write_text(APP)
    if clash == "dispatcher.py":
        (folder / "dispatcher.py").write_text("def dispatch():\n    return 'mine'\n")
    elif clash == "migrations/":
        (folder / "migrations").mkdir()
        (folder / "migrations" / "__init__.py").write_text("")
        (folder / "migrations" / "0001_users.py").write_text("")
    elif clash == "alembic migrations/":  # Alembic's layout: a folder without __init__.py
        (folder / "migrations" / "versions").mkdir(parents=True)
        (folder / "migrations" / "env.py").write_text("")
    return folder


def _run(argv: list[str], folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=folder,
        env=_env(folder),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("clash", "name"), [("dispatcher.py", "dispatcher"), ("migrations/", "migrations")]
)
def test_the_library_names_the_clash(tmp_path: Path, clash: str, name: str) -> None:
    folder = _user_folder(tmp_path, clash)
    proc = _run([sys.executable, "app.py"], folder)
    assert proc.returncode == 0, proc.stderr
    kind = "module" if clash.endswith(".py") else "package"
    where = folder / clash.rstrip("/")
    assert proc.stdout.splitlines() == [
        f"ShadowedPackageError your {kind} {where} hides delta-outbox's package '{name}' "
        f"(installed in {ROOT}), so the outbox cannot import its own (fix: rename your {kind} "
        f"(e.g. my_{name}) and its imports, or run your program from a folder that does not "
        f"hold a '{name}')"
    ]
    assert not (folder / ".outbox").exists()  # refused before anything was created


@pytest.mark.parametrize(
    ("clash", "argv"),
    [
        ("dispatcher.py", [sys.executable, "-m", "outbox.cli", "migrate"]),
        ("migrations/", [sys.executable, "-m", "outbox.cli", "migrate"]),
        ("dispatcher.py", [OUTBOX, "status"]),
    ],
)
def test_the_cli_prints_one_line(tmp_path: Path, clash: str, argv: list[str]) -> None:
    folder = _user_folder(tmp_path, clash)
    proc = _run(argv, folder)
    assert proc.returncode == 1
    name = clash.rstrip("/").removesuffix(".py")
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: your ")
    assert f"hides delta-outbox's package '{name}'" in lines[0]
    assert "(fix: rename your " in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (folder / ".outbox").exists()


def test_an_alembic_migrations_folder_does_not_clash(tmp_path: Path) -> None:
    """A folder without ``__init__.py`` is a namespace package, which a regular package further
    down the path outranks: Python imports ours, so nothing is reported and everything works."""
    folder = _user_folder(tmp_path, "alembic migrations/")
    proc = _run([sys.executable, "app.py"], folder)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "opened"


def test_nothing_clashes_here() -> None:
    for name in ("dispatcher", "rescuer", "migrations"):
        assert shadowing(name) is None


def test_the_error_is_a_configuration_error() -> None:
    assert issubclass(ShadowedPackageError, ConfigurationError)
    assert issubclass(ShadowedPackageError, OutboxError)
