"""Alembic migrations of the artifactstore index (installed as artifactstore.migrations)."""
