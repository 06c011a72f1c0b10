"""``outbox console``: the operator console in a browser (docs/console.md)."""

from outbox.app.console.app import create_app
from outbox.app.console.config import ConsoleConfig

__all__ = ["ConsoleConfig", "create_app"]
