"""results.normalised_speedup computed again from every graph row's stored units: eager is now
scaled to the standard host by the reference to the power analysis.HOST_ELASTICITY (0.75) instead
of divided by it, so that a nightly history's earlier nights and its new ones hold the same figure.
Rows stored before 0008 get it here for the first time (every row since 0004 stores its units);
rows whose units cannot give it keep none. Downgrading leaves the figures as they are.

Revision ID: 0009
Revises: 0008
"""
from types import SimpleNamespace

from alembic import op
import sqlalchemy as sa

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

COLUMNS = ("normalised_speedup", "normalised_speedup_ci_low", "normalised_speedup_ci_high")
results = sa.table(
    "results", sa.column("id", sa.Integer), sa.column("run_id", sa.Integer), sa.column("workload", sa.String),
    sa.column("params_key", sa.String), sa.column("mode", sa.String), sa.column("status", sa.String),
    sa.column("repeat", sa.Integer), sa.column("variant", sa.String), sa.column("samples", sa.JSON),
    *(sa.column(name, sa.Double) for name in COLUMNS),
)


def upgrade() -> None:
    connection = op.get_bind()
    connection.execute(results.update().values(**dict.fromkeys(COLUMNS)))
    backfill(connection)


def backfill(connection) -> None:
    """One run at a time (a run's samples fit in memory; a whole history may not)."""
    from replaybench.analysis import figures, stored_units

    run_ids = connection.execute(sa.select(results.c.run_id).where(results.c.mode == "graph").distinct()).scalars().all()
    for run_id in run_ids:
        configs: dict[tuple, dict] = {}
        rows = connection.execute(
            sa.select(results.c.id, results.c.workload, results.c.params_key, results.c.mode, results.c.repeat,
                      results.c.variant, results.c.samples)
            .where(results.c.run_id == run_id, results.c.status == "ok", results.c.mode.in_(("eager", "graph")))
        )
        for r in rows:
            configs.setdefault((r.workload, r.params_key, r.repeat, r.variant), {})[r.mode] = SimpleNamespace(id=r.id, samples=r.samples)
        for modes in configs.values():
            if set(modes) != {"eager", "graph"}:
                continue
            try:
                found = figures(stored_units(modes), ["eager", "graph"]).normalised_speedup.get("graph")
            except (KeyError, TypeError, ValueError, IndexError):  # units not stored, or stored in an older shape
                continue
            if found is not None:
                connection.execute(results.update().where(results.c.id == modes["graph"].id).values(
                    normalised_speedup=found.value, normalised_speedup_ci_low=found.ci_low,
                    normalised_speedup_ci_high=found.ci_high))


def downgrade() -> None:
    pass
