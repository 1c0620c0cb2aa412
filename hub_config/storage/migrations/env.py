"""Alembic environment: always run by hub_config.storage.migrate with a live connection."""

from alembic import context

from hub_config.storage.migrate import VERSION_TABLE

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    version_table=VERSION_TABLE,
    # SQLite alters tables by copying them; Alembic's batch mode does that for us.
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
