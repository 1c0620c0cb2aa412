"""Each user's last started profile, for "Start again" on the spawn page and the hub home.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpulab_last_choice",
        sa.Column("user", sa.String(length=255), nullable=False),
        sa.Column("team", sa.String(length=63), nullable=False),
        sa.Column("profile", sa.String(length=63), nullable=False),
        sa.Column("image", sa.String(length=63), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("user"),
    )


def downgrade() -> None:
    op.drop_table("gpulab_last_choice")
