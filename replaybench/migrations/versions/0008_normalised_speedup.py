"""results.normalised_speedup (and its interval): the speedup with the host's speed taken out
(replaybench.analysis.host_normalised_speedup). Graph rows stored before it get it from the timed
units they stored (every row since 0004 stores them), so that a nightly history's earlier nights
count toward its interval across nights at once; rows whose units cannot give it keep none.

Revision ID: 0008
Revises: 0007
"""
from types import SimpleNamespace

from alembic import op
import sqlalchemy as sa

revision = "0008"
down_revision = "0007"
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
    with op.batch_alter_table("results") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.Double(), nullable=True))
    backfill(op.get_bind())


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
    with op.batch_alter_table("results") as batch:
        for name in COLUMNS:
            batch.drop_column(name)
