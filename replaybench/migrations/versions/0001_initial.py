"""initial schema: runs and results

Revision ID: 0001
Revises: 
Create Date: 2026-12-02 16:49:31.578119
"""
from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('trigger', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=True),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('cpu_model', sa.String(length=255), nullable=True),
    sa.Column('gpu_name', sa.String(length=255), nullable=True),
    sa.Column('gpu_driver', sa.String(length=64), nullable=True),
    sa.Column('cuda_version', sa.String(length=32), nullable=True),
    sa.Column('torch_version', sa.String(length=64), nullable=True),
    sa.Column('python_version', sa.String(length=32), nullable=True),
    sa.Column('package_version', sa.String(length=32), nullable=True),
    sa.Column('git_commit', sa.String(length=64), nullable=True),
    sa.Column('flow_run_id', sa.String(length=64), nullable=True),
    sa.Column('environment', sa.JSON(), nullable=False),
    sa.Column('parameters', sa.JSON(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('results',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('measured_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('workload', sa.String(length=128), nullable=False),
    sa.Column('params', sa.JSON(), nullable=False),
    sa.Column('params_key', sa.String(length=512), nullable=False),
    sa.Column('mode', sa.String(length=32), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('phase', sa.String(length=32), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('device', sa.String(length=255), nullable=True),
    sa.Column('cpu_core', sa.Integer(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('throughput_s', sa.Double(), nullable=True),
    sa.Column('throughput_ci_low', sa.Double(), nullable=True),
    sa.Column('throughput_ci_high', sa.Double(), nullable=True),
    sa.Column('throughput_min', sa.Double(), nullable=True),
    sa.Column('throughput_max', sa.Double(), nullable=True),
    sa.Column('throughput_iqr', sa.Double(), nullable=True),
    sa.Column('throughput_blocks', sa.Integer(), nullable=True),
    sa.Column('iters_per_block', sa.Integer(), nullable=True),
    sa.Column('precision_met', sa.Boolean(), nullable=True),
    sa.Column('latency_s', sa.Double(), nullable=True),
    sa.Column('latency_ci_low', sa.Double(), nullable=True),
    sa.Column('latency_ci_high', sa.Double(), nullable=True),
    sa.Column('gpu_s', sa.Double(), nullable=True),
    sa.Column('gpu_ci_low', sa.Double(), nullable=True),
    sa.Column('gpu_ci_high', sa.Double(), nullable=True),
    sa.Column('host_enqueue_s', sa.Double(), nullable=True),
    sa.Column('kernels_per_iter', sa.Double(), nullable=True),
    sa.Column('launch_overhead_s', sa.Double(), nullable=True),
    sa.Column('launch_bound_fraction', sa.Double(), nullable=True),
    sa.Column('speedup', sa.Double(), nullable=True),
    sa.Column('speedup_ci_low', sa.Double(), nullable=True),
    sa.Column('speedup_ci_high', sa.Double(), nullable=True),
    sa.Column('capture_s', sa.Double(), nullable=True),
    sa.Column('first_replay_s', sa.Double(), nullable=True),
    sa.Column('graph_pool_bytes', sa.BigInteger(), nullable=True),
    sa.Column('break_even_replays', sa.Double(), nullable=True),
    sa.Column('compile_s', sa.Double(), nullable=True),
    sa.Column('graphs_used', sa.Boolean(), nullable=True),
    sa.Column('max_abs_diff', sa.Float(), nullable=True),
    sa.Column('host_calibration_s', sa.Double(), nullable=True),
    sa.Column('flags', sa.JSON(), nullable=False),
    sa.Column('health', sa.JSON(), nullable=False),
    sa.Column('samples', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_results_run_id'), ['run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_results_workload'), ['workload'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_results_workload'))
        batch_op.drop_index(batch_op.f('ix_results_run_id'))

    op.drop_table('results')
    op.drop_table('runs')
