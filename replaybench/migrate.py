"""Schema migrations with Alembic, run in place whenever a store is opened."""

from __future__ import annotations

import time
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head", attempts: int = 5) -> None:
    """Upgrade in place. Several processes may open a new database at once (workers starting
    together); the one that loses the race to create a table tries again and finds it done."""
    for attempt in range(attempts):
        try:
            command.upgrade(alembic_config(engine), revision)
            return
        except OperationalError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
