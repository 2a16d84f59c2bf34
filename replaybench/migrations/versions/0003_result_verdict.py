"""results.verdict*: each measured row's verdict against the nightly history, judged once when its
run is finished; one index on (workload, params_key, mode, run_id) for reading one config's history

The new index starts with workload, so it replaces ix_results_workload.

Revision ID: 0003
Revises: 0002
"""
from alembic import op
import sqlalchemy as sa

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("results") as batch:
        batch.add_column(sa.Column("verdict", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("verdict_change", sa.Double(), nullable=True))
        batch.add_column(sa.Column("verdict_baseline", sa.Double(), nullable=True))
        batch.add_column(sa.Column("verdict_reason", sa.Text(), nullable=True))
        batch.create_index("ix_results_history", ["workload", "params_key", "mode", "run_id"], unique=False)
        batch.drop_index("ix_results_workload")


def downgrade() -> None:
    with op.batch_alter_table("results") as batch:
        batch.create_index("ix_results_workload", ["workload"], unique=False)
        batch.drop_index("ix_results_history")
        batch.drop_column("verdict_reason")
        batch.drop_column("verdict_baseline")
        batch.drop_column("verdict_change")
        batch.drop_column("verdict")
