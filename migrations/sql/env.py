"""Alembic environment: runs on the connection handed over by ``migrations.sql.upgrade``.

There is no alembic.ini: the caller builds the Config in code and passes an open connection in
``config.attributes["connection"]``, so the URL, pool and SQLite pragmas are the framework's own.
"""

from __future__ import annotations

from alembic import context

from migrations.sql import PG_LOCK, VERSION_TABLE
from migrations.sql.tables import metadata

config = context.config
connection = config.attributes.get("connection")
if connection is None:  # pragma: no cover - only when someone runs the alembic CLI by hand
    raise RuntimeError("run migrations through migrations.sql.upgrade(url), not the alembic CLI")

context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    if connection.dialect.name == "postgresql":
        # Two processes migrating at once would both try CREATE TABLE; serialize them.
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PG_LOCK})")
    context.run_migrations()
