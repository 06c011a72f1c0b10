"""``outbox migrate``: the Delta table, the SQL schema, (when an account is configured) the
Cosmos DB database and containers, and whatever the chosen backends provision (the Service Bus
command queue and declared destinations, for example); idempotent and safe to run twice.

Why the backends' provisioning is handed in: this floor knows the table and the schema; which
backends the settings choose, and what each needs created, is ``outbox.wiring``'s to say
(``Backends.migrate`` passes their provisioners).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outbox.core.errors import ConfigurationError, WorkspaceError
from outbox.core.settings import Settings
from outbox.core.sql import redact_url

log = logging.getLogger("outbox.migrate")


@dataclass
class Provisioned:
    """What a backend's provisioning did, and the entities it found in conflict with the
    settings (reported, never changed)."""

    actions: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)


#: A backend's provisioning step: creates what it needs, returns what it did.
Provisioner = Callable[[Settings], Provisioned]


@dataclass
class MigrationReport:
    workspace: str
    table_uri: str
    sql_url: str
    actions: list[str] = field(default_factory=list)
    #: Existing entities whose properties conflict with the settings (reported, never changed).
    conflicts: list[str] = field(default_factory=list)

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
            "conflicts": self.conflicts,
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


def migrate(
    settings: Settings,
    *,
    provisioners: Sequence[Provisioner] = (),
    only_if_missing: bool = False,
    raise_on_conflict: bool = True,
) -> MigrationReport:
    """Create or upgrade everything the settings point at, then run ``provisioners`` (the chosen
    backends', from ``outbox.wiring``).

    ``only_if_missing`` is the cheap path ``Outbox.open`` takes: it skips the work when the table
    already exists (an explicit ``outbox migrate`` always checks both schemas). An entity in
    conflict with the settings raises ``ConfigurationError`` after everything else was
    provisioned; with ``raise_on_conflict=False`` it is only listed in ``report.conflicts`` (the
    CLI prints the report, then exits 1).
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
    for provision in provisioners:
        provisioned = provision(settings)
        report.actions += provisioned.actions
        report.conflicts += provisioned.conflicts
    for a in report.actions:
        log.debug("migrate: %s", a)
    if report.conflicts and raise_on_conflict:
        raise ConfigurationError("; ".join(report.conflicts))
    return report


def ensure_cosmos(settings: Settings) -> list[str]:
    """The Cosmos DB database and its checkpoint, inbox and claim-log containers, each
    partitioned on ``/pk`` (docs/cosmos.md); what was created. A container with another
    partition key is reported, never changed."""
    from outbox.core.cosmos import ensure_container, make_client, translate

    endpoint = settings.cosmos_endpoint
    client = make_client(
        endpoint, settings.cosmos_key, unavailable=ConfigurationError, failed=ConfigurationError
    )
    actions: list[str] = []
    try:
        for container in (
            settings.cosmos_checkpoint_container,
            settings.cosmos_inbox_container,
            settings.cosmos_claims_container,
        ):
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
