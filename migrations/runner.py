"""``outbox migrate``: the Delta table, the SQL schema and (when an account is configured) the
Cosmos DB database and containers; idempotent and safe to run twice."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outbox.core.errors import ConfigurationError, WorkspaceError
from outbox.core.settings import Settings
from outbox.core.sql import redact_url

log = logging.getLogger("outbox.migrate")


@dataclass
class MigrationReport:
    workspace: str
    table_uri: str
    sql_url: str
    actions: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.actions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "workspace": self.workspace,
            "table_uri": self.table_uri,
            "sql_url": redact_url(self.sql_url),
            "actions": self.actions,
            "changed": self.changed,
        }


def _is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def ensure_workspace(settings: Settings) -> list[str]:
    ws = Path(settings.workspace)
    if ws.exists() and not ws.is_dir():
        raise WorkspaceError(f"workspace {ws} is a file, not a folder", hint="use --workspace DIR")
    if ws.is_dir():
        return []
    try:
        ws.mkdir(parents=True)
    except OSError as e:
        raise WorkspaceError(f"cannot create workspace {ws}: {e.strerror}") from e
    return [f"created workspace {ws}"]


def migrate(settings: Settings, *, only_if_missing: bool = False) -> MigrationReport:
    """Create or upgrade everything the settings point at.

    ``only_if_missing`` is the cheap path ``Outbox.open`` takes: it skips the work when the table
    already exists (an explicit ``outbox migrate`` always checks both schemas).
    """
    from migrations.delta import ensure_table
    from migrations.sql import upgrade

    report = MigrationReport(str(settings.workspace), settings.table_uri, settings.sql_url)
    needs_ws = _is_local(settings.table_uri) or settings.sql_url.startswith("sqlite:")
    if only_if_missing and _table_exists(settings):
        return report
    if needs_ws:
        report.actions += ensure_workspace(settings)
    report.actions += ensure_table(
        settings.table_uri, buckets=settings.buckets, storage_options=settings.storage_options
    )
    report.actions += upgrade(settings.sql_url)
    if settings.cosmos_configured:
        report.actions += ensure_cosmos(settings)
    if settings.command_transport == "servicebus":
        report.actions += _provision_servicebus(settings)
    for a in report.actions:
        log.debug("migrate: %s", a)
    return report


def _provision_servicebus(settings: Settings) -> list[str]:
    """The Service Bus command queue (``dispatcher.transports.servicebus_admin``)."""
    from dispatcher.transports.servicebus_admin import provision_command_queue
    from dispatcher.transports.servicebus_queue import connect

    client, admin = connect()
    try:
        return provision_command_queue(admin, settings)
    finally:
        for c in (admin, client):
            c.close()


def ensure_cosmos(settings: Settings) -> list[str]:
    """The Cosmos DB database and its checkpoint and inbox containers, each partitioned on
    ``/pk`` (docs/cosmos.md); what was created. A container with another partition key is
    reported, never changed."""
    from outbox.core.cosmos import ensure_container, make_client, translate

    endpoint = settings.cosmos_endpoint
    client = make_client(
        endpoint, settings.cosmos_key, unavailable=ConfigurationError, failed=ConfigurationError
    )
    actions: list[str] = []
    try:
        for container in (settings.cosmos_checkpoint_container, settings.cosmos_inbox_container):
            actions += ensure_container(client, settings.cosmos_database, container)
    except Exception as e:
        raise translate(
            e,
            "provisioning Cosmos DB",
            endpoint,
            unavailable=ConfigurationError,
            failed=ConfigurationError,
        ) from e
    return actions


def _table_exists(settings: Settings) -> bool:
    import deltalake

    try:
        return bool(
            deltalake.DeltaTable.is_deltatable(
                settings.table_uri, storage_options=dict(settings.storage_options) or None
            )
        )
    except Exception:
        return False
