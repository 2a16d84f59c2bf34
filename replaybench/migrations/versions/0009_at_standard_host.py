"""Eager at standard host speed: results.host_normalised of eager rows and results.normalised_speedup
of graph rows computed again from the units every row stores (since 0004). Eager is now scaled to a
host whose reference block takes analysis.STANDARD_REFERENCE_S, by the reference to the power 0.75,
instead of divided by the reference: host_normalised becomes a time in seconds, and a nightly
history's earlier nights hold the same figure as its new ones. Rows whose units cannot give it keep
none (their verdicts fall back to eager throughput); graph rows stored before 0008 get their
normalised_speedup here for the first time. Acknowledged eager regressions keep their
acknowledgement under the figure's new name (a step whose first night the new figure places
elsewhere is a new regression), and the open regressions stored with each run are dropped, so that
reports compute them again from the new figures. Downgrading computes the old figures again.

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

ELASTICITY = 0.75  # this revision's power, fixed here: a later HOST_ELASTICITY is a migration of its own
EAGER = ("host_normalised", "host_normalised_ci_low", "host_normalised_ci_high")
SPEEDUP = ("normalised_speedup", "normalised_speedup_ci_low", "normalised_speedup_ci_high")
results = sa.table(
    "results", sa.column("id", sa.Integer), sa.column("run_id", sa.Integer), sa.column("workload", sa.String),
    sa.column("params_key", sa.String), sa.column("mode", sa.String), sa.column("status", sa.String),
    sa.column("repeat", sa.Integer), sa.column("variant", sa.String), sa.column("samples", sa.JSON),
    *(sa.column(name, sa.Double) for name in EAGER + SPEEDUP),
)
runs = sa.table("runs", sa.column("open_regressions", sa.JSON))
acknowledgements = sa.table("acknowledgements", sa.column("metric", sa.String))
OLD_NAME, NEW_NAME = "eager over the host reference", "eager at standard host speed"


def upgrade() -> None:
    recompute(op.get_bind(), ELASTICITY, OLD_NAME, NEW_NAME)


def downgrade() -> None:
    # 0008's figures: eager over the reference (a ratio), and the speedup from it
    from replaybench.analysis import STANDARD_REFERENCE_S

    recompute(op.get_bind(), 1.0, NEW_NAME, OLD_NAME, eager_scale=1 / STANDARD_REFERENCE_S)


def recompute(connection, elasticity: float, old_name: str, new_name: str, eager_scale: float = 1.0) -> None:
    connection.execute(results.update().where(results.c.mode.in_(("eager", "graph"))).values(**dict.fromkeys(EAGER + SPEEDUP)))
    backfill(connection, elasticity, eager_scale)
    connection.execute(acknowledgements.update().where(acknowledgements.c.metric == old_name).values(metric=new_name))
    connection.execute(runs.update().values(open_regressions=sa.null()))


def backfill(connection, elasticity: float, eager_scale: float) -> None:
    """One run at a time (a run's samples fit in memory; a whole history may not). Eager's figure
    from eager's own units, the speedup's from both modes': a graph row that cannot give it leaves
    eager's as it is."""
    from replaybench.analysis import figures, stored_units

    def found(modes: dict):
        try:
            return figures(stored_units(modes), list(modes), elasticity=elasticity)
        except (KeyError, TypeError, ValueError, IndexError):  # units not stored, or stored in an older shape
            return None

    run_ids = connection.execute(sa.select(results.c.run_id).where(results.c.mode == "eager").distinct()).scalars().all()
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
            if "eager" not in modes:
                continue
            eager = found({"eager": modes["eager"]})
            if eager is not None and eager.normalised is not None:
                e = eager.normalised
                connection.execute(results.update().where(results.c.id == modes["eager"].id).values(
                    dict(zip(EAGER, (e.value * eager_scale, e.ci_low * eager_scale, e.ci_high * eager_scale)))))
            both = found(modes) if "graph" in modes else None
            speedup = both and both.normalised_speedup.get("graph")
            if speedup is not None:
                connection.execute(results.update().where(results.c.id == modes["graph"].id).values(
                    dict(zip(SPEEDUP, (speedup.value, speedup.ci_low, speedup.ci_high)))))
