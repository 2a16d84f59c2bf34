from alembic import context
from sqlalchemy import text

from replaybench.storage import Base

engine = context.config.attributes["engine"]

with engine.begin() as connection:
    if connection.dialect.name == "postgresql":
        # Workers starting together migrate one after another; the later ones find it done.
        connection.execute(text("SELECT pg_advisory_xact_lock(7240517)"))
    # render_as_batch: SQLite alters tables by copying them, which Alembic's batch mode does.
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    context.run_migrations()
