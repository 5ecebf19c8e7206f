"""The metadata catalog (SQLAlchemy; SQLite by default, PostgreSQL optional)."""

from engine.catalog.database import Catalog, CatalogUnavailable, CatalogUnreachable, from_outage
from engine.catalog.migrate import current_revision, downgrade, upgrade

__all__ = [
    "Catalog",
    "CatalogUnavailable",
    "CatalogUnreachable",
    "from_outage",
    "upgrade",
    "downgrade",
    "current_revision",
]
