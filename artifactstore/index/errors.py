"""The index's errors, named for what a caller does about them.

Why: code outside index/ decides by these (retry later, drop a row, name the fix)
without importing SQLAlchemy, so that the database layer stays in one folder.
"""

from __future__ import annotations

from sqlalchemy.exc import (
    DataError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)

__all__ = ["ROW_REFUSED", "UNAVAILABLE", "DatabaseFailure"]

# Any failure of the index database (`index.diagnosis.diagnose` says what it means).
DatabaseFailure = SQLAlchemyError
# The database did not answer, or the connection broke: the index is unavailable now.
UNAVAILABLE: tuple[type[Exception], ...] = (OperationalError, InterfaceError)
# A row the database refused for its values (out of range, a constraint): it never goes in.
ROW_REFUSED: tuple[type[Exception], ...] = (DataError, IntegrityError)
