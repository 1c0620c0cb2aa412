"""Each Kubernetes notebook session's pod and what Prometheus answered of its GPUs at its end
(peak memory, device memory, utilisation p95), for the right-size line.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpulab_session_gpu",
        sa.Column("usage_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("pod", sa.String(length=253), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("peak_memory_mib", sa.Float(), nullable=True),
        sa.Column("device_memory_mib", sa.Float(), nullable=True),
        sa.Column("util_p95", sa.Float(), nullable=True),
        sa.Column("samples", sa.Integer(), nullable=True),
        sa.Column("devices", sa.String(length=1000), nullable=False),
        sa.Column("reason", sa.String(length=500), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("measured_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("usage_id"),
    )
    op.create_index("ix_gpulab_session_gpu_key", "gpulab_session_gpu", ["key"])
    op.create_index("ix_gpulab_session_gpu_state", "gpulab_session_gpu", ["state"])


def downgrade() -> None:
    op.drop_index("ix_gpulab_session_gpu_state", table_name="gpulab_session_gpu")
    op.drop_index("ix_gpulab_session_gpu_key", table_name="gpulab_session_gpu")
    op.drop_table("gpulab_session_gpu")
