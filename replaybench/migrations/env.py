from alembic import context

from replaybench.storage import Base

engine = context.config.attributes["engine"]

with engine.begin() as connection:
    # render_as_batch: SQLite alters tables by copying them, which Alembic's batch mode does.
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    context.run_migrations()
