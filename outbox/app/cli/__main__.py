"""``python -m outbox.app.cli``: the ``outbox`` command without the console script."""

from outbox.app.cli import main

main()
