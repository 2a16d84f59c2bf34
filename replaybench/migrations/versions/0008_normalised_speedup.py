"""results.normalised_speedup (and its interval): the speedup with the host's speed taken out
(replaybench.analysis.host_normalised_speedup). 0009 fills it in for rows stored before it.

Revision ID: 0008
Revises: 0007
"""
from alembic import op
import sqlalchemy as sa

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

COLUMNS = ("normalised_speedup", "normalised_speedup_ci_low", "normalised_speedup_ci_high")


def upgrade() -> None:
    with op.batch_alter_table("results") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("results") as batch:
        for name in COLUMNS:
            batch.drop_column(name)
