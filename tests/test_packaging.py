"""The wheel installs only the product's packages: ``outbox``, ``dispatcher``, ``rescuer`` and
``migrations`` (the generic names ``cli`` or ``benchmarks`` would collide with other projects in
site-packages), and its console scripts: ``outbox`` (``outbox.app.cli:main``) and the Spark
rescuer job.

Built offline, once for the module: ``uv build --offline`` (hatchling comes from uv's cache),
else ``pip wheel``. Installed with ``--no-deps --no-index`` into a fresh venv, so nothing is
downloaded; the venv is made without pip (``ensurepip`` installing it was most of the test) and
this interpreter's pip installs into it (``pip --python``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"outbox", "dispatcher", "rescuer", "migrations"}


def _uv() -> str | None:
    beside = Path(sys.executable).with_name("uv")
    return str(beside) if beside.exists() else shutil.which("uv")


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"{' '.join(argv)} failed:\n{proc.stdout}\n{proc.stderr}"


def _build_wheel(out: Path) -> Path:
    uv = _uv()
    if uv is not None:
        _run([uv, "build", "--wheel", "--offline", "--out-dir", str(out), str(REPO)])
    else:
        if os.environ.get("CI") != "true":
            pytest.skip("no uv to build the wheel offline (CI must have it)")
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(REPO)])
    [wheel] = out.glob("delta_outbox-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_wheel(tmp_path_factory.mktemp("dist"))


def _site_packages(venv: Path) -> Path:
    purelib = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_path('purelib'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Path(purelib)


@pytest.mark.slow
@pytest.mark.skipif(sysconfig.get_platform().startswith("win"), reason="POSIX venv layout")
def test_the_wheel_adds_only_the_product_packages_and_the_outbox_script(
    wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    site = _site_packages(venv)
    before = {p.name for p in site.iterdir()}
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-index",
            str(wheel),
        ]
    )
    added = {p.name for p in site.iterdir()} - before
    dist_info = {n for n in added if n.endswith(".dist-info")}
    assert [n.split("-")[0] for n in dist_info] == ["delta_outbox"], added
    assert added - dist_info == PACKAGES  # no cli, no benchmarks, no tests, no stray module
    assert (site / "outbox" / "app" / "cli" / "__init__.py").is_file()
    # the console's pages are served from the installed package: no CDN, no build step
    console = site / "outbox" / "app" / "console"
    templates = {p.name for p in (console / "templates").glob("*.html")}
    assert {"base.html", "overview.html", "dead_letters.html", "devices.html"} <= templates
    assert (console / "static" / "console.css").is_file()
    assert (console / "static" / "favicon.svg").is_file()  # base.html links it

    [info] = dist_info
    entry_points = (site / info / "entry_points.txt").read_text()
    scripts = _section(entry_points, "console_scripts")
    assert scripts == {
        "outbox": "outbox.app.cli:main",
        "outbox-rescue-spark": "outbox.app.spark.rescue_job:main",  # the Databricks wheel task
    }
    script = (venv / "bin" / "outbox").read_text()
    assert "from outbox.app.cli import main" in script


#: The testing kit's modules the wheel ships (``outbox/testing/``, besides ``contracts/`` and
#: ``servicebus_fake/``): what users run and test their own backends with. The proving ground
#: (the device fleet, the Kafka broker, the browser kit, the console's data builders) is
#: ``testkit/``, left out; the checker's broken builds and JVM options are the checker's own.
KIT = {
    "__init__.py",
    "crash_points.py",
    "devices.py",
    "faulty.py",
    "mosquitto.py",
    "servers.py",
    "tables.py",
}


def test_the_wheel_ships_the_kit_but_not_the_proving_ground(wheel: Path) -> None:
    """The wheel's own file list: the testing kit's contract suites and fakes are in it, the
    proving ground is not (before issue 43 it carried ``outbox/testing/fleet.py``, the broker and
    browser launchers and the data builders)."""
    with zipfile.ZipFile(wheel) as built:
        names = [n for n in built.namelist() if n.endswith(".py")]
    assert {n.split("/")[0] for n in names} == PACKAGES  # no testkit/, tests/, benchmarks/
    testing = {n.removeprefix("outbox/testing/") for n in names if n.startswith("outbox/testing/")}
    assert {n for n in testing if "/" not in n} == KIT
    assert {n.split("/")[0] for n in testing if "/" in n} == {"contracts", "servicebus_fake"}
    assert "contracts/transport.py" in testing
    assert "outbox/app/checker/mutations.py" in names  # OUTBOX_CHECK_MUTATION: a checker feature


def _section(ini: str, name: str) -> dict[str, str]:
    out: dict[str, str] = {}
    current = None
    for raw in ini.splitlines():
        line = raw.strip()
        if line.startswith("["):
            current = line.strip("[]")
        elif line and current == name:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out
