"""Alembic environment: runs against the connection handed in by ``benchwright.store.db.migrate``."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import benchwright.store.models  # noqa: F401  (registers the tables on SQLModel.metadata)

target_metadata = SQLModel.metadata
connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only used with `alembic` on the command line
    from sqlalchemy import create_engine

    url = context.config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("alembic.ini sets no sqlalchemy.url and no connection was passed in")
    connection = create_engine(url).connect()

context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
