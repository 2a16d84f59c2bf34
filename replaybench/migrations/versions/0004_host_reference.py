"""results.host_reference_s and host_disturbed_share: the host's undisturbed time for a fixed CPU
reference block while a config was measured, and the share of its timed units set aside because
that reference showed the core disturbed. Replaces host_calibration_s (a pure-Python loop timed
once per config, which said nothing about the blocks themselves); old values stay, in the new column.
results.host_normalised (and its interval): eager throughput over the reference block's time.

Revision ID: 0004
Revises: 0003
"""
from alembic import op
import sqlalchemy as sa

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("results") as batch:
        batch.alter_column("host_calibration_s", new_column_name="host_reference_s")
        batch.add_column(sa.Column("host_disturbed_share", sa.Double(), nullable=True))
        for name in ("host_normalised", "host_normalised_ci_low", "host_normalised_ci_high"):
            batch.add_column(sa.Column(name, sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("results") as batch:
        for name in ("host_normalised", "host_normalised_ci_low", "host_normalised_ci_high"):
            batch.drop_column(name)
        batch.drop_column("host_disturbed_share")
        batch.alter_column("host_reference_s", new_column_name="host_calibration_s")
