"""The schema of release 0.1.0, the first one: every table gpulab created then.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpulab_audit",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=255), nullable=False),
        sa.Column("old", sa.Text(), nullable=True),
        sa.Column("new", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_gpulab_audit_at"), "gpulab_audit", ["at"], unique=False)
    op.create_table(
        "gpulab_catalog",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("file_digest", sa.String(length=64), nullable=False),
        sa.Column("edited", sa.Boolean(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("updated_by", sa.String(length=255), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "gpulab_idle_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("user", sa.String(length=255), nullable=False),
        sa.Column("server", sa.String(length=255), nullable=False),
        sa.Column("team", sa.String(length=255), nullable=False),
        sa.Column("profile", sa.String(length=255), nullable=False),
        sa.Column("gpu_milli", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("evidence", sa.Text(), nullable=False),
        sa.Column("gpu_hours_reclaimed", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_gpulab_idle_events_at"), "gpulab_idle_events", ["at"], unique=False)
    op.create_index(op.f("ix_gpulab_idle_events_user"), "gpulab_idle_events", ["user"], unique=False)
    op.create_table(
        "gpulab_idle_keepalives",
        sa.Column("user", sa.String(length=255), nullable=False),
        sa.Column("server", sa.String(length=255), nullable=False),
        sa.Column("used", sa.Integer(), nullable=False),
        sa.Column("until", sa.Float(), nullable=True),
        sa.Column("session", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("user", "server"),
    )
    op.create_table(
        "gpulab_idle_warnings",
        sa.Column("user", sa.String(length=255), nullable=False),
        sa.Column("server", sa.String(length=255), nullable=False),
        sa.Column("warned_at", sa.Float(), nullable=False),
        sa.Column("reclaim_at", sa.Float(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("evidence", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("user", "server"),
    )
    op.create_table(
        "gpulab_jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("user", sa.String(length=255), nullable=False),
        sa.Column("team", sa.String(length=63), nullable=False),
        sa.Column("profile", sa.String(length=63), nullable=False),
        sa.Column("job_class", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("gpu_milli", sa.Integer(), nullable=False),
        sa.Column("over_quota", sa.Boolean(), nullable=False),
        sa.Column("notebook", sa.Text(), nullable=False),
        sa.Column("output_path", sa.Text(), nullable=False),
        sa.Column("log_path", sa.Text(), nullable=False),
        sa.Column("parameters_json", sa.Text(), nullable=False),
        sa.Column("time_limit_seconds", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=128), nullable=True),
        sa.Column("rerun_of", sa.Integer(), nullable=True),
        sa.Column("backend", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("shares_json", sa.Text(), nullable=False),
        sa.Column("kube_namespace", sa.String(length=63), nullable=True),
        sa.Column("kube_name", sa.String(length=63), nullable=True),
        sa.Column("history_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("user", "idempotency_key", name="uq_gpulab_jobs_idempotency"),
    )
    op.create_index(op.f("ix_gpulab_jobs_state"), "gpulab_jobs", ["state"], unique=False)
    op.create_index(op.f("ix_gpulab_jobs_team"), "gpulab_jobs", ["team"], unique=False)
    op.create_index(op.f("ix_gpulab_jobs_user"), "gpulab_jobs", ["user"], unique=False)
    op.create_table(
        "gpulab_usage",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("team", sa.String(length=63), nullable=False),
        sa.Column("user", sa.String(length=255), nullable=False),
        sa.Column("profile", sa.String(length=63), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("gpu_milli", sa.Integer(), nullable=False),
        sa.Column("gpu_model", sa.String(length=64), nullable=True),
        sa.Column("over_quota", sa.Boolean(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_gpulab_usage_key"), "gpulab_usage", ["key"], unique=False)
    op.create_index(
        "ix_gpulab_usage_open_key",
        "gpulab_usage",
        ["key"],
        unique=True,
        sqlite_where=sa.text("ended_at IS NULL"),
        postgresql_where=sa.text("ended_at IS NULL"),
    )
    op.create_index(op.f("ix_gpulab_usage_started_at"), "gpulab_usage", ["started_at"], unique=False)
    op.create_index(op.f("ix_gpulab_usage_team"), "gpulab_usage", ["team"], unique=False)
    op.create_table(
        "gpulab_util_sample",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("team", sa.String(length=63), nullable=False),
        sa.Column("user", sa.String(length=255), nullable=False),
        sa.Column("util_pct", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_gpulab_util_sample_at"), "gpulab_util_sample", ["at"], unique=False)


def downgrade() -> None:
    op.drop_table("gpulab_util_sample")
    op.drop_table("gpulab_usage")
    op.drop_table("gpulab_jobs")
    op.drop_table("gpulab_idle_warnings")
    op.drop_table("gpulab_idle_keepalives")
    op.drop_table("gpulab_idle_events")
    op.drop_table("gpulab_catalog")
    op.drop_table("gpulab_audit")
