"""Which real parts a seed runs on: the SQL database behind the command queue and the rescuer's
checkpoints (``--sql``), and the rescuer's engine (``--engine``).

By default a seed is self-contained: SQLite in its workspace, the local (delta-rs) engine. With a
PostgreSQL URL every seed gets a database of its own on that server, created for the seed and
dropped after it passed (a failed seed's database is kept with its folder), so seeds can run
concurrently against one server and none sees another's queue or checkpoints. With the Spark
engine the rescuer's passes plan on Spark; the session is the process's one (``get_spark``
reuses it), so it starts once for every pass and every seed. ``--writer spark`` adds a Spark
driver process to each seed's writers (``outbox.app.checker.spark_writer``).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

from outbox.core.errors import ConfigurationError

WRITERS = ("python", "spark")
_counter = itertools.count()


@dataclass(frozen=True, slots=True)
class SeedDatabase:
    """The SQL URL one seed uses, and how to clean it up."""

    url: str  # "" = the workspace's own SQLite database
    server_url: str = ""
    name: str = ""

    @property
    def backend(self) -> str:
        return "postgresql" if self.name else "sqlite"

    def drop(self) -> None:
        if self.name:
            _execute(
                self.server_url,
                f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)',
                f"drop the database {self.name}",
            )


def seed_database(sql: str, seed: int) -> SeedDatabase:
    """``sql``: ``sqlite`` (the default) or a PostgreSQL URL the checker may create databases
    with; the seed's database is ``outbox_check_<seed>_<pid>_<n>`` on that server."""
    if sql in ("", "sqlite"):
        return SeedDatabase("")
    from outbox.core.sql import parse_url

    parsed = parse_url(sql)
    if parsed.get_backend_name() != "postgresql":
        raise ConfigurationError(
            f"--sql {sql!r}: the checker runs on sqlite or a PostgreSQL URL",
            hint="e.g. --sql postgresql+psycopg://user@host:5432/postgres",
        )
    name = f"outbox_check_{seed}_{os.getpid()}_{next(_counter)}"
    _execute(sql, f'CREATE DATABASE "{name}"', f"create the database {name}")
    url = parsed.set(database=name).render_as_string(hide_password=False)
    return SeedDatabase(url, server_url=sql, name=name)


def check_engine(engine: str) -> str:
    """A rescuer engine ``outbox.wiring`` knows (``ConfigurationError`` naming them, if not)."""
    from outbox.wiring.builtin import RESCUER_ENGINES

    try:
        RESCUER_ENGINES.get(engine)
    except ConfigurationError as e:
        raise ConfigurationError(
            f"--engine {engine!r} is not a rescuer engine", hint=e.hint
        ) from None
    return engine


def check_writer(writer: str) -> str:
    if writer not in WRITERS:
        raise ConfigurationError(
            f"--writer {writer!r} is not a writer mode", hint="use python or spark"
        )
    return writer


def _execute(url: str, statement: str, what: str) -> None:
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    from outbox.core.sql import make_engine

    engine = make_engine(url, isolation_level="AUTOCOMMIT", pool_size=1)
    try:
        with engine.connect() as c:
            c.execute(text(statement))
    except SQLAlchemyError as e:
        raise ConfigurationError(
            f"the checker could not {what} on the --sql server: {str(e).splitlines()[0]}",
            hint="give a PostgreSQL URL whose user may create databases",
        ) from e
    finally:
        engine.dispose()
