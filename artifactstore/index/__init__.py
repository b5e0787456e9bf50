"""The SQL index: typed models, engine and migrations, and the queries the store needs."""

from artifactstore.index.db import open_engine, schema_status, upgrade
from artifactstore.index.repo import EntryIndex, EntryInfo, NewEntry

__all__ = ["EntryIndex", "EntryInfo", "NewEntry", "open_engine", "schema_status", "upgrade"]
