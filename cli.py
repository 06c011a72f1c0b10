"""The repository's thin entry point: ``python cli.py ...`` runs the ``outbox`` command.

The command's code lives in :mod:`outbox.app.cli` (the installed console script points there); this
file exists so the repository's top level shows where the CLI starts, and ships in no wheel.
"""

from outbox.app.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
