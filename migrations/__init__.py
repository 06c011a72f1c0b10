"""Schema migrations: the Delta table (``migrations.delta``), the SQL schema (``migrations.sql``).

Importing alembic logs one INFO line per built-in plugin ("setup plugin alembic.autogenerate...");
through ``Outbox.open`` those would land in the application's log, so that logger starts at
WARNING unless the application already gave it a level.
"""

import logging

_plugins = logging.getLogger("alembic.runtime.plugins")
if _plugins.level == logging.NOTSET:
    _plugins.setLevel(logging.WARNING)
