"""Schema migrations with Alembic, run in place whenever a store is opened."""

from __future__ import annotations

import time
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


class ForeignDatabase(Exception):
    """The database holds another application's tables: replaybench adds none to it."""


def check_ours(engine: Engine, script: ScriptDirectory) -> set[str]:
    """The revisions an empty database (none) or a store of replaybench's is at; ForeignDatabase
    otherwise, naming what is there (a store is never made inside another application's database)."""
    tables = set(inspect(engine).get_table_names())
    if not tables:
        return set()
    if "alembic_version" not in tables:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise ForeignDatabase(f"it holds tables that are not a replaybench store's ({shown})")
    with engine.connect() as connection:
        versions = {row[0] for row in connection.execute(text("SELECT version_num FROM alembic_version"))}
    known = {revision.revision for revision in script.walk_revisions()}
    if versions - known:
        raise ForeignDatabase(f"its schema is at revision {', '.join(sorted(versions - known))}, which is not "
                              "replaybench's (another application's, or a newer replaybench's)")
    return versions


def upgrade(engine: Engine, revision: str = "head", attempts: int = 5) -> None:
    """Upgrade in place. Several processes may open a new database at once (workers starting
    together); the one that loses the race to create a table tries again and finds it done."""
    script = ScriptDirectory.from_config(alembic_config(engine))  # read once: it parses every migration
    at = check_ours(engine, script)
    if revision == "head" and at == {script.get_current_head()}:
        return  # nothing to do: no write lock taken, so opening a store never waits on its writers
    for attempt in range(attempts):
        try:
            command.upgrade(alembic_config(engine), revision)
            return
        except OperationalError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
