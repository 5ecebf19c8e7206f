"""Alembic migrations of the catalog schema (engine/catalog/models.py)."""
