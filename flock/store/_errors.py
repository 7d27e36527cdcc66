"""What can go wrong with the allocation database, as types the caller can act on."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from flock import errors

# SQLite's primary result codes that mean the file is not a sound database
# (https://www.sqlite.org/rescode.html); extended codes keep them in the low byte.
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26


# Transitional: still a CniError (code 5, IO_ERROR) so that a store failure
# during ADD/DEL reaches the runtime exactly as before.  Once the pod layer
# maps domain errors to CNI codes in its one table at the CNI boundary, this
# base becomes a plain Exception and the code goes.
class StoreError(errors.CniError):
    """The allocation database could not do what was asked; ``path`` says which file.

    Catch this for "any store failure"; the subclasses say which kind."""

    def __init__(self, path: os.PathLike[str] | str, msg: str, details: str = "") -> None:
        self.path = Path(path)
        super().__init__(errors.IO_ERROR, msg, f"{path}: {details}" if details else str(path))


class StoreUnavailable(StoreError):
    """The database cannot be opened, migrated or written right now (I/O error,
    permissions, a full disk, a lock held too long, a refused write)."""


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
    """The typed error for an sqlite3 failure: corruption or anything else."""
    code = getattr(exc, "sqlite_errorcode", None)
    kind = StoreCorrupt if code is not None and code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB) else StoreUnavailable
    return kind(path, msg, f"{details}: {exc}" if details else str(exc))
