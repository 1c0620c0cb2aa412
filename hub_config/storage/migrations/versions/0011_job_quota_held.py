"""Whether a job holds its quota admission: a queued job whose share reclaim took back for
another team's in-quota work holds none until it is admitted again.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpulab_jobs") as batch:
        batch.add_column(sa.Column("quota_held", sa.Boolean(), nullable=False, server_default=sa.true()))


def downgrade() -> None:
    with op.batch_alter_table("gpulab_jobs") as batch:
        batch.drop_column("quota_held")
