"""The idle culler's records belong to a server session, and reclaims carry honest figures.

Warnings gain the server session they belong to and when they were held;
events gain the session, the action as a column (0.1.0 kept it in the evidence
JSON), and ``idle_gpu_hours``: what 0.1.0 called ``gpu_hours_reclaimed`` was the
idle time observed before the reclaim, so that is where its values go.

Revision ID: 0002
Revises: 0001
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpulab_idle_warnings") as batch:
        batch.add_column(sa.Column("session", sa.String(length=64), nullable=False, server_default=""))
        batch.add_column(sa.Column("held_at", sa.Float(), nullable=True))
    with op.batch_alter_table("gpulab_idle_events") as batch:
        batch.add_column(sa.Column("session", sa.String(length=64), nullable=False, server_default=""))
        batch.add_column(sa.Column("action", sa.String(length=32), nullable=False, server_default=""))
        batch.add_column(sa.Column("idle_gpu_hours", sa.Float(), nullable=False, server_default="0"))
    events = sa.table(
        "gpulab_idle_events",
        sa.column("id", sa.Integer),
        sa.column("evidence", sa.Text),
        sa.column("action", sa.String),
        sa.column("idle_gpu_hours", sa.Float),
        sa.column("gpu_hours_reclaimed", sa.Float),
    )
    conn = op.get_bind()
    conn.execute(events.update().values(idle_gpu_hours=events.c.gpu_hours_reclaimed))
    for row_id, evidence in conn.execute(sa.select(events.c.id, events.c.evidence)).all():
        try:
            action = json.loads(evidence or "{}").get("action", "")
        except (ValueError, AttributeError):
            action = ""
        if isinstance(action, str) and action:
            conn.execute(events.update().where(events.c.id == row_id).values(action=action[:32]))
    with op.batch_alter_table("gpulab_idle_events") as batch:
        batch.drop_column("gpu_hours_reclaimed")


def downgrade() -> None:
    with op.batch_alter_table("gpulab_idle_events") as batch:
        batch.add_column(sa.Column("gpu_hours_reclaimed", sa.Float(), nullable=False, server_default="0"))
    events = sa.table(
        "gpulab_idle_events", sa.column("idle_gpu_hours", sa.Float), sa.column("gpu_hours_reclaimed", sa.Float)
    )
    op.get_bind().execute(events.update().values(gpu_hours_reclaimed=events.c.idle_gpu_hours))
    with op.batch_alter_table("gpulab_idle_events") as batch:
        batch.drop_column("idle_gpu_hours")
        batch.drop_column("action")
        batch.drop_column("session")
    with op.batch_alter_table("gpulab_idle_warnings") as batch:
        batch.drop_column("held_at")
        batch.drop_column("session")
