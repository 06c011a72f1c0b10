"""``outbox console``: the operator console in a browser (docs/console.md)."""

from outbox.app.console.app import ConsoleConfig, create_app

__all__ = ["ConsoleConfig", "create_app"]
