"""One time type, second half: the culler's records hold naive UTC datetimes, not epoch seconds.

Warnings (``warned_at``, ``reclaim_at``, ``held_at``), keep-alives (``until``)
and audit events (``at``) were ``FLOAT`` epoch seconds. Each column is copied
into a ``DateTime`` column row by row in Python (the same conversion on every
database: SQLite has no date type to cast to) and then takes the old name.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

#: table -> (primary key columns, [(column, nullable)])
TABLES: dict[str, tuple[tuple[str, ...], list[tuple[str, bool]]]] = {
    "gpulab_idle_warnings": (("user", "server"), [("warned_at", False), ("reclaim_at", False), ("held_at", True)]),
    "gpulab_idle_keepalives": (("user", "server"), [("until", True)]),
    "gpulab_idle_events": (("id",), [("at", False)]),
}
EVENTS_AT_INDEX = "ix_gpulab_idle_events_at"
BATCH = 5000


def _from_epoch(value: Any) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(float(value), timezone.utc).replace(tzinfo=None)


def _to_epoch(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):  # SQLite hands raw text back to a plain select
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=timezone.utc).timestamp()


def _convert(new_type: sa.types.TypeEngine, old_type: sa.types.TypeEngine, convert: Callable[[Any], Any]) -> None:
    bind = op.get_bind()
    for table, (keys, columns) in TABLES.items():
        with op.batch_alter_table(table) as batch:
            for name, _nullable in columns:
                batch.add_column(sa.Column(f"{name}_new", new_type, nullable=True))
        t = sa.table(
            table,
            *(sa.column(k) for k in keys),
            *(sa.column(n, old_type) for n, _ in columns),
            *(sa.column(f"{n}_new", new_type) for n, _ in columns),
        )
        rows = bind.execute(sa.select(*(t.c[k] for k in keys), *(t.c[n] for n, _ in columns))).all()
        update = (
            t.update()
            .where(*(t.c[k] == sa.bindparam(f"key_{k}") for k in keys))
            .values({f"{n}_new": sa.bindparam(f"value_{n}") for n, _ in columns})
        )
        for i in range(0, len(rows), BATCH):
            params = [
                {
                    **{f"key_{k}": row[j] for j, k in enumerate(keys)},
                    **{f"value_{n}": convert(row[len(keys) + j]) for j, (n, _) in enumerate(columns)},
                }
                for row in rows[i : i + BATCH]
            ]
            bind.execute(update, params)
        if table == "gpulab_idle_events":
            op.drop_index(EVENTS_AT_INDEX, table_name=table)
        with op.batch_alter_table(table) as batch:
            for name, nullable in columns:
                batch.drop_column(name)
                batch.alter_column(f"{name}_new", new_column_name=name, existing_type=new_type, nullable=nullable)
        if table == "gpulab_idle_events":
            op.create_index(EVENTS_AT_INDEX, table, ["at"])


def upgrade() -> None:
    _convert(sa.DateTime(), sa.Float(), _from_epoch)


def downgrade() -> None:
    _convert(sa.Float(), sa.DateTime(), _to_epoch)
