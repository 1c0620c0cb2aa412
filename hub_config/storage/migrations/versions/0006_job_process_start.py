"""A job runner's start time beside its pid: with the owner's uid, what makes the pid the runner's.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpulab_jobs") as batch:
        batch.add_column(sa.Column("pid_started", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpulab_jobs") as batch:
        batch.drop_column("pid_started")
