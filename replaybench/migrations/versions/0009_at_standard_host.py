"""Eager at standard host speed: results.host_normalised of eager rows and results.normalised_speedup
of graph rows computed again from the units every row stores (since 0004). Eager is now scaled to a
host whose reference block takes a fixed time, by the reference to the power
analysis.HOST_ELASTICITY (0.75), instead of divided by the reference: host_normalised becomes a time
in seconds, and a nightly history's earlier nights hold the same figure as its new ones. Rows whose
units cannot give it keep none (their verdicts fall back to eager throughput); graph rows stored
before 0008 get their normalised_speedup here for the first time. Acknowledged eager regressions
keep their acknowledgement under the figure's new name. Downgrading leaves the figures as they are.

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

EAGER = ("host_normalised", "host_normalised_ci_low", "host_normalised_ci_high")
SPEEDUP = ("normalised_speedup", "normalised_speedup_ci_low", "normalised_speedup_ci_high")
results = sa.table(
    "results", sa.column("id", sa.Integer), sa.column("run_id", sa.Integer), sa.column("workload", sa.String),
    sa.column("params_key", sa.String), sa.column("mode", sa.String), sa.column("status", sa.String),
    sa.column("repeat", sa.Integer), sa.column("variant", sa.String), sa.column("samples", sa.JSON),
    *(sa.column(name, sa.Double) for name in EAGER + SPEEDUP),
)
acknowledgements = sa.table("acknowledgements", sa.column("metric", sa.String))
OLD_EAGER_NAME, NEW_EAGER_NAME = "eager over the host reference", "eager at standard host speed"


def upgrade() -> None:
    connection = op.get_bind()
    connection.execute(results.update().values(**dict.fromkeys(EAGER + SPEEDUP)))
    backfill(connection)
    connection.execute(acknowledgements.update().where(acknowledgements.c.metric == OLD_EAGER_NAME)
                       .values(metric=NEW_EAGER_NAME))


def backfill(connection) -> None:
    """One run at a time (a run's samples fit in memory; a whole history may not)."""
    from replaybench.analysis import figures, stored_units

    run_ids = connection.execute(sa.select(results.c.run_id).where(results.c.mode == "eager").distinct()).scalars().all()
    for run_id in run_ids:
        configs: dict[tuple, dict] = {}
        rows = connection.execute(
            sa.select(results.c.id, results.c.workload, results.c.params_key, results.c.mode, results.c.repeat,
                      results.c.variant, results.c.samples)
            .where(results.c.run_id == run_id, results.c.status == "ok")
        )
        for r in rows:
            configs.setdefault((r.workload, r.params_key, r.repeat, r.variant), {})[r.mode] = SimpleNamespace(id=r.id, samples=r.samples)
        for stored in configs.values():
            modes = {m: stored[m] for m in ("eager", "graph") if m in stored}
            if "eager" not in modes:
                continue
            try:
                found = figures(stored_units(modes), list(modes))
            except (KeyError, TypeError, ValueError, IndexError):  # units not stored, or stored in an older shape
                continue
            if found.normalised is not None:
                connection.execute(results.update().where(results.c.id == modes["eager"].id).values(
                    dict(zip(EAGER, (found.normalised.value, found.normalised.ci_low, found.normalised.ci_high)))))
            speedup = found.normalised_speedup.get("graph")
            if speedup is not None and "graph" in modes:
                connection.execute(results.update().where(results.c.id == modes["graph"].id).values(
                    dict(zip(SPEEDUP, (speedup.value, speedup.ci_low, speedup.ci_high)))))


def downgrade() -> None:
    pass
