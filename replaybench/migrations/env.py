from alembic import context
from sqlalchemy import text

from replaybench.storage import Base

engine = context.config.attributes["engine"]

with engine.connect() as connection:
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        # Batch mode recreates a table by copying it: with foreign keys on, dropping the old `runs`
        # would cascade to every result. Off for the migration (it cannot change inside a transaction).
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
        connection.commit()
    try:
        with connection.begin():
            # Workers starting together migrate one after another; the later ones find it done.
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(7240517)"))
            elif sqlite:
                # The driver leaves DDL outside any transaction, so a second process could see half a
                # schema: one transaction holding the write lock (others wait out the busy timeout).
                connection.exec_driver_sql("BEGIN IMMEDIATE")
            # render_as_batch: SQLite alters tables by copying them, which Alembic's batch mode does.
            context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
            context.run_migrations()
    finally:
        if sqlite:
            connection.exec_driver_sql("PRAGMA foreign_keys=ON")
            connection.commit()
