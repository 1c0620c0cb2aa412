"""The spawn queue ("queue me"), and the GPU memory of utilisation samples (the right-size hint).

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpulab_queue",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("user", sa.String(length=255), nullable=False),
        sa.Column("server_name", sa.String(length=255), nullable=False),
        sa.Column("team", sa.String(length=63), nullable=False),
        sa.Column("profile", sa.String(length=63), nullable=False),
        sa.Column("image", sa.String(length=63), nullable=False),
        sa.Column("gpu_milli", sa.Integer(), nullable=False),
        sa.Column("gpu_model", sa.String(length=64), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("enqueued_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_gpulab_queue_user", "gpulab_queue", ["user"])
    op.create_index("ix_gpulab_queue_state", "gpulab_queue", ["state"])
    with op.batch_alter_table("gpulab_util_sample") as batch:
        batch.add_column(sa.Column("memory_mib", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpulab_util_sample") as batch:
        batch.drop_column("memory_mib")
    op.drop_index("ix_gpulab_queue_state", table_name="gpulab_queue")
    op.drop_index("ix_gpulab_queue_user", table_name="gpulab_queue")
    op.drop_table("gpulab_queue")
