"""What can go wrong with the allocation database, as types the caller can act on.

Every one is a :class:`flock.faults.StoreUnavailable` (the pod layer's
protocol says so, and its one table at the CNI boundary turns that into
code 5); the kinds below let the agent and operators tell them apart.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from flock.faults import StoreUnavailable

# SQLite's primary result codes that mean the file is not a sound database
# (https://www.sqlite.org/rescode.html); extended codes keep them in the low byte.
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26


class StoreError(StoreUnavailable):
    """The allocation database could not do what was asked; ``path`` says which file.

    Raised as such when it cannot be opened, migrated or written (I/O error,
    permissions, a full disk, a lock held too long, a refused write); the
    subclasses name the other kinds."""

    def __init__(self, path: os.PathLike[str] | str, msg: str, details: str = "") -> None:
        self.path = Path(path)
        super().__init__(msg, f"{path}: {details}" if details else str(path))


class StoreCorrupt(StoreError):
    """The file is not a sound allocation database (damaged pages, not SQLite at
    all, no allocations table, a row that does not decode).  It is never
    replaced: an operator decides."""


class StoreTooNew(StoreError):
    """The database was written by a newer flock (a schema version this one
    does not know); this flock must not touch it."""


class AllocationNotFound(StoreError, LookupError):
    """No row for the container ID the call named (``container_id``)."""

    def __init__(self, path: os.PathLike[str] | str, msg: str, container_id: str) -> None:
        self.container_id = container_id
        super().__init__(path, msg, f"container {container_id!r}")


def from_sqlite(path: os.PathLike[str] | str, msg: str, exc: sqlite3.Error, details: str = "") -> StoreError:
    """The typed error for an sqlite3 failure: corruption, or a plain StoreError."""
    code = getattr(exc, "sqlite_errorcode", None)
    kind = StoreCorrupt if code is not None and code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB) else StoreError
    return kind(path, msg, f"{details}: {exc}" if details else str(exc))
