"""Jobs run a notebook or a script (with its arguments), on one or more nodes, with a checkpoint folder.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpulab_jobs") as batch:
        batch.add_column(sa.Column("kind", sa.String(16), nullable=False, server_default="notebook"))
        batch.add_column(sa.Column("args_json", sa.Text(), nullable=False, server_default="[]"))
        batch.add_column(sa.Column("nodes", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("checkpoint_path", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("gpulab_jobs") as batch:
        for column in ("checkpoint_path", "nodes", "args_json", "kind"):
            batch.drop_column(column)
