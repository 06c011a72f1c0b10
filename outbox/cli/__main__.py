"""``python -m outbox.cli``: the ``outbox`` command without the console script."""

from outbox.cli import main

main()
