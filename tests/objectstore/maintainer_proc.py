"""A maintainer process of the two-maintainers proof (``test_object_store``): started once, it runs
``outbox maintain --json`` in itself at each round's ``go`` file and writes the exit code and
output to that round's ``done`` file. Two of them start each round within a poll of each other:
the race of two ``outbox maintain`` started together, without an interpreter start and the
product's imports before every round. Spawned, not forked (deltalake hangs in forked children).
"""

from __future__ import annotations

import time
from pathlib import Path


def maintainer(ws: str, rounds: int, folder: str, me: str) -> None:
    from click.testing import CliRunner

    from outbox.app.cli import main as cli_main

    where = Path(folder)
    for round_ in range(rounds):
        go = where / f"go-{round_}"
        end = time.monotonic() + 600
        while not go.exists():
            if time.monotonic() > end:
                raise TimeoutError(f"{go} never appeared")
            time.sleep(0.01)
        result = CliRunner().invoke(cli_main, ["-w", ws, "maintain", "--json"])
        done = where / f"done-{round_}-{me}"
        done.with_suffix(".tmp").write_text(f"{result.exit_code}\n{result.output}")
        done.with_suffix(".tmp").rename(done)
