"""results.repeat: 0 for a config's measurement, 1 and up for its same-night confirmations in fresh
measuring processes; runs.open_regressions: the slower levels still holding when the run was
judged, which its reports list; acknowledgements: open regressions someone has seen and accepted,
so that reports stop listing them.

Revision ID: 0005
Revises: 0004
"""
from alembic import op
import sqlalchemy as sa

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("results") as batch:
        batch.add_column(sa.Column("repeat", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("open_regressions", sa.JSON(), nullable=True))
    op.create_table(
        "acknowledgements",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("workload", sa.String(length=128), nullable=False),
        sa.Column("params_key", sa.String(length=512), nullable=False),
        sa.Column("mode", sa.String(length=32), nullable=False),
        sa.Column("metric", sa.String(length=64), nullable=False),
        sa.Column("first_run_id", sa.Integer(), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("workload", "params_key", "mode", "metric", "first_run_id", name="uq_acknowledgement"),
    )


def downgrade() -> None:
    op.drop_table("acknowledgements")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("open_regressions")
    with op.batch_alter_table("results") as batch:
        batch.drop_column("repeat")
