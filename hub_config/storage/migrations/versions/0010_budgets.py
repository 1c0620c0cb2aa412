"""GPU-hour budgets (budgets, the admin's webhook, threshold notices) and the teams each user's
identity provider grants (the groups and claims of their last login, mapped by
``c.GPULabIdentity.team_rules``).

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpulab_budget",
        sa.Column("key", sa.String(length=330), nullable=False),
        sa.Column("team", sa.String(length=63), nullable=False),
        sa.Column("user", sa.String(length=255), nullable=False),
        sa.Column("milli_gpu_hours", sa.Integer(), nullable=False),
        sa.Column("period", sa.String(length=16), nullable=False),
        sa.Column("at_limit", sa.String(length=16), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("updated_by", sa.String(length=255), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_index("ix_gpulab_budget_team", "gpulab_budget", ["team"])
    op.create_table(
        "gpulab_budget_settings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("webhook_url", sa.String(length=2048), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("updated_by", sa.String(length=255), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "gpulab_budget_notice",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("budget_key", sa.String(length=330), nullable=False),
        sa.Column("team", sa.String(length=63), nullable=False),
        sa.Column("period_start", sa.DateTime(), nullable=False),
        sa.Column("threshold", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(), nullable=True),
        sa.Column("delivered_at", sa.DateTime(), nullable=True),
        sa.Column("last_error", sa.String(length=500), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("budget_key", "period_start", "threshold", name="uq_gpulab_budget_notice"),
    )
    op.create_index("ix_gpulab_budget_notice_budget_key", "gpulab_budget_notice", ["budget_key"])
    op.create_table(
        "gpulab_identity",
        sa.Column("user", sa.String(length=255), nullable=False),
        sa.Column("teams_json", sa.Text(), nullable=False),
        sa.Column("departments_json", sa.Text(), nullable=False),
        sa.Column("evidence_json", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("user"),
    )


def downgrade() -> None:
    op.drop_table("gpulab_identity")
    op.drop_index("ix_gpulab_budget_notice_budget_key", table_name="gpulab_budget_notice")
    op.drop_table("gpulab_budget_notice")
    op.drop_table("gpulab_budget_settings")
    op.drop_index("ix_gpulab_budget_team", table_name="gpulab_budget")
    op.drop_table("gpulab_budget")
