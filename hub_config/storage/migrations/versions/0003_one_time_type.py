"""One time type: the jobs' times are naive UTC like every other table's.

0.1.0 declared them ``timestamp with time zone``; SQLite stores both the same
way, so only PostgreSQL (and other servers with a zoned type) change.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

COLUMNS = ("created_at", "started_at", "finished_at")


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    with op.batch_alter_table("gpulab_jobs") as batch:
        for name in COLUMNS:
            batch.alter_column(
                name,
                type_=sa.DateTime(),
                existing_type=sa.DateTime(timezone=True),
                postgresql_using=f"{name} AT TIME ZONE 'UTC'",
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    with op.batch_alter_table("gpulab_jobs") as batch:
        for name in COLUMNS:
            batch.alter_column(
                name,
                type_=sa.DateTime(timezone=True),
                existing_type=sa.DateTime(),
                postgresql_using=f"{name} AT TIME ZONE 'UTC'",
            )
