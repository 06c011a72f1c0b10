"""Refresh the console's screenshots in docs/images (shown in README.md and docs/console.md).

A workspace with a week of samples for three rescuers, dead letters on three queues and a fleet
of devices (the builders the console benchmark uses), then ``outbox console`` driven by Debian's
headless Chromium (``testkit.browser``), as tests/console/test_browser.py drives it.
Run by ``scripts/console-screenshots.sh``.
"""

from __future__ import annotations

import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from click.testing import CliRunner

from dispatcher.queue import SqlQueue
from outbox.app.cli import main
from testkit.browser import by, chromium, every, go, screenshot, start_console
from testkit.console import Fleet, fill_dead_letters, fill_devices, fill_samples


def build(ws: Path) -> None:
    result = CliRunner().invoke(main, ["-w", str(ws), "migrate"])
    if result.exit_code:
        sys.exit(result.output)
    (ws / "outbox.toml").write_text("sample_interval = 0\n")  # the week built below is shown
    now = datetime.now(UTC)
    with SqlQueue(f"sqlite:///{ws / 'outbox.db'}") as queue:
        fill_samples(queue, rescuers=["nightly", "east", "west"], end=now, span=timedelta(days=7))
        fill_dead_letters(
            queue,
            240,
            queues={"shipments": 0.5, "invoices": 0.3, "commands": 0.2},
            reasons={"Poison": 0.4, "Timeout": 0.3, "MaxDeliveryCountExceeded": 0.2,
                     "SchemaMismatch": 0.1},
            start=now - timedelta(days=3),
            step=timedelta(minutes=17),
            body_bytes=600,
        )  # fmt: skip
        fill_devices(queue, "devices", 36, Fleet(prefix="door-", offline=0.2), now=now)


def main_() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images")
    with tempfile.TemporaryDirectory(prefix="outbox-shots-") as tmp:
        ws = Path(tmp) / "ws"
        build(ws)
        console = start_console(ws)
        driver = chromium(Path(tmp) / "chromium")
        try:
            driver.get(console.url + "?range=24h")
            screenshot(driver, out / "console-overview.png")
            driver.get(console.url + "dead-letters")
            screenshot(driver, out / "console-dead-letters.png")
            go(driver, "#dead-letters tbody a")
            screenshot(driver, out / "console-dead-letter.png")
            driver.get(console.url + "devices")
            screenshot(driver, out / "console-devices.png")
            assert console.token is not None
            driver.get(console.url + "unlock")
            by(driver, "#token").send_keys(console.token)
            go(driver, "#unlock")
            driver.get(console.url + "dead-letters?reason=Timeout")
            for box in every(driver, "#dead-letters input[type=checkbox]")[:3]:
                box.click()
            go(driver, "#requeue-selected")
            screenshot(driver, out / "console-confirm.png")
        finally:
            driver.quit()
            console.stop()
    print(f"screenshots in {out}")


if __name__ == "__main__":
    main_()
