"""A third party's backend brings its settings the way the shipped ones do (issue 43, item 3):
a toy transport, installed for a child process as a real distribution (a ``.dist-info`` with an
``entry_points.txt`` in a folder on its path), reads its section ``[toy]`` and its variables
``OUTBOX_TOY_*``; an unknown key in its section is one did-you-mean line from the CLI, and a bad
value is named by its variable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OUTBOX = str(Path(sys.executable).with_name("outbox"))

TOY = '''
"""A toy transport with settings of its own."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from outbox.plugins import Backend, BackendOptions, setting


@dataclass(frozen=True)
class ToyOptions(BackendOptions):
    """A toy transport."""

    SECTION = "toy"

    colour: str = setting("blue", "the colour of the toy")
    size: int = setting(1, "how big, 1 to 10")

    def validate(self, settings: Any) -> None:
        if not 1 <= self.size <= 10:
            raise self.invalid("size", f"{self.size}; must be 1 to 10")


def build(b: Any) -> Any:
    from dispatcher.transports.memory import InMemoryTransport

    transport = InMemoryTransport()
    transport.toy = b.settings.options(ToyOptions)
    return transport


BACKEND = Backend("toy", build, options=ToyOptions, description="a toy")
'''

PROGRAM = """
import json, sys
from outbox.core.settings import Settings
from outbox.wiring import Backends

settings = Settings.load(sys.argv[1])
with Backends(settings) as backends:
    toy = backends.transport().toy
print(json.dumps({"type": type(toy).__name__, "colour": toy.colour, "size": toy.size,
                  "flat": settings.to_dict()["toy_colour"]}))
"""


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A folder holding the toy package and its distribution's metadata, as pip installs one."""
    site = tmp_path / "site"
    (site / "toy_outbox").mkdir(parents=True)
    (site / "toy_outbox" / "__init__.py").write_text(TOY)
    info = site / "toy_outbox-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-outbox\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[delta_outbox.transports]\ntoy = toy_outbox:BACKEND\n")
    return site


def _env(site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    return {**env, "PYTHONPATH": f"{site}{os.pathsep}{REPO}", **extra}


def _workspace(tmp_path: Path, toml: str) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "outbox.toml").write_text(toml)
    return ws


def _run_program(ws: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``PROGRAM`` on ``ws`` in a child process whose path is ``env``'s."""
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, str(ws)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_a_plugin_backend_reads_its_section_and_its_variables(site: Path, tmp_path: Path) -> None:
    ws = _workspace(tmp_path, '[outbox]\ntransport = "toy"\n[toy]\ncolour = "green"\n')
    result = _run_program(ws, _env(site, OUTBOX_TOY_SIZE="3"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "type": "ToyOptions",
        "colour": "green",  # its section of the file
        "size": 3,  # its variable, read as its kind (an int)
        "flat": "green",
    }
    assert result.stderr == ""  # OUTBOX_TOY_SIZE is a known variable: no warning


def test_without_the_plugin_its_section_is_not_read(tmp_path: Path) -> None:
    """The control: the same program without the distribution on the path fails to find the
    backend (so the test above proves the entry point, not something else, brought it)."""
    ws = _workspace(tmp_path, '[outbox]\ntransport = "toy"\n[toy]\ncolour = "green"\n')
    result = _run_program(ws, _env(tmp_path / "nothing-here"))
    assert result.returncode != 0
    assert "'toy' is not a transport" in result.stderr


@pytest.mark.parametrize(
    ("toml", "env", "message"),
    [
        (
            '[outbox]\ntransport = "toy"\n[toy]\ncolor = "green"\n',
            {},
            "error: unknown setting 'color' in [toy] (did you mean 'colour'?) (fix: known [toy] "
            "settings: colour, size)",
        ),
        (
            '[outbox]\ntransport = "toy"\n',
            {"OUTBOX_TOY_SIZE": "11"},
            "error: setting 'toy_size' is invalid: 11; must be 1 to 10",
        ),
        (
            '[outbox]\ntransport = "toy"\n',
            {"OUTBOX_TOY_SIZE": "big"},
            "error: setting 'toy_size' has an invalid value 'big'",
        ),
    ],
    ids=["misspelt key", "bad value", "unreadable value"],
)
def test_the_cli_reports_a_plugin_setting_in_one_line(
    site: Path, tmp_path: Path, toml: str, env: dict[str, str], message: str
) -> None:
    ws = _workspace(tmp_path, toml)
    result = subprocess.run(
        [OUTBOX, "-w", str(ws), "status"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(site, **env),
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == message
    assert "Traceback" not in result.stderr
