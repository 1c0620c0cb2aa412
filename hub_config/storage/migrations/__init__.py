"""Alembic migrations of gpulab's database (run by :mod:`hub_config.storage.migrate`)."""
