"""Parameter sweeps: a sweep (the job its runs are made from, its grid, cap and objective) and its runs.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpulab_sweeps",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("team", sa.String(63), nullable=False),
        sa.Column("job_json", sa.Text(), nullable=False),
        sa.Column("groups_json", sa.Text(), nullable=False),
        sa.Column("grid_json", sa.Text(), nullable=False),
        sa.Column("max_parallel", sa.Integer(), nullable=False),
        sa.Column("objective_json", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.String(128), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.UniqueConstraint("user", "idempotency_key", name="uq_gpulab_sweeps_idempotency"),
    )
    op.create_index("ix_gpulab_sweeps_user", "gpulab_sweeps", ["user"])
    op.create_index("ix_gpulab_sweeps_team", "gpulab_sweeps", ["team"])
    op.create_index("ix_gpulab_sweeps_state", "gpulab_sweeps", ["state"])
    op.create_table(
        "gpulab_sweep_runs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("sweep_id", sa.Integer(), sa.ForeignKey("gpulab_sweeps.id", ondelete="CASCADE"), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("parameters_json", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("metrics_json", sa.Text(), nullable=False),
        sa.Column("metrics_final", sa.Boolean(), nullable=False),
        sa.Column("metrics_read_at", sa.DateTime(), nullable=True),
        sa.UniqueConstraint("sweep_id", "index", name="uq_gpulab_sweep_runs_index"),
    )
    op.create_index("ix_gpulab_sweep_runs_sweep_id", "gpulab_sweep_runs", ["sweep_id"])
    op.create_index("ix_gpulab_sweep_runs_state", "gpulab_sweep_runs", ["state"])
    op.create_index("ix_gpulab_sweep_runs_job_id", "gpulab_sweep_runs", ["job_id"])


def downgrade() -> None:
    op.drop_table("gpulab_sweep_runs")
    op.drop_table("gpulab_sweeps")
