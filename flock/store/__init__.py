"""Allocations on disk: SQLite at ``<state_dir>/flock.db`` (WAL, synchronous=NORMAL).

Three rooms:

* ``_schema`` — the table, its migrations, the SQL, row ↔ Allocation;
* ``_sync`` — :class:`SyncStore`, the blocking core used by one thread only
  (the crash test's child process uses it directly), with group commit;
* ``_thread`` and ``_api`` — :func:`open_store` → :class:`Store`, the Trio
  face.  A dedicated thread owns the connection; every call is queued to it,
  so no sqlite call runs on the Trio thread and the connection never changes
  threads.  A call cannot be abandoned half-way: cancellation takes effect
  once the database has answered, so the caller always knows whether a write
  happened.

Group commit: the thread takes every call queued at that moment and runs
them in ONE transaction, each inside its own savepoint, and answers every
caller only after that COMMIT has returned — so nothing is acknowledged
before it is in the WAL file, and a call that fails is rolled back to
its savepoint without failing or losing the others.  If the group's
transaction itself is lost (COMMIT fails, or SQLite rolls the whole
transaction back on an I/O error), no caller has been answered yet: each
call is run again on its own, as if it had been queued alone.  A call
queued alone runs as a single autocommit statement, exactly as without
grouping.

Durability (a deliberate refinement of DESIGN's "WAL, synchronous=FULL"):
the connection runs at synchronous=NORMAL, so no write waits for an fsync
of its own.  In WAL mode a committed transaction has written its frames to
the WAL file before the call returns: a killed or crashed agent loses
nothing, because the kernel holds the page cache.  Only a power loss or a
kernel crash can lose the last transactions (never the database's
consistency: the WAL's checksums end it at the last whole commit), and
then no pod namespace and no veth survives either.  After a reboot every
row, whether lost or kept, describes a pod that is gone: a lost pending row
or commit explains nothing that is still there, a lost delete brings back a
row for a pod that is gone (the runtime's DEL or GC removes it, as it
removes every other row from before the reboot).  So an
fsync buys the runtime nothing, and it cost every ADD ~0.5-1 ms on the pod
start-up path and made a burst's callers queue behind disk flushes.
(Checkpoints still fsync the WAL before copying it into the database.)

Error handling: nothing is retried here.  A database that is unreadable or
corrupt (:class:`StoreCorrupt`), cannot be opened (:class:`StoreError`) or
was written by a newer flock (:class:`StoreTooNew`) raises at open — it is
never replaced — and the agent exits so an operator can look.  Failures of
later calls raise :class:`StoreError` or :class:`StoreCorrupt`; committing a
row that is not there raises :class:`AllocationNotFound`.  All are
:class:`StoreError`, a :class:`flock.faults.StoreUnavailable` (code 5 at the
CNI boundary).
"""

from flock.store._api import Store, open_store
from flock.store._errors import (
    AllocationNotFound,
    StoreCorrupt,
    StoreError,
    StoreTooNew,
)
from flock.store._schema import FILENAME, MIGRATIONS, Migration, backup_path
from flock.store._sync import SyncStore
from flock.store._thread import MAX_GROUP

__all__ = [
    "FILENAME",
    "MAX_GROUP",
    "MIGRATIONS",
    "AllocationNotFound",
    "Migration",
    "Store",
    "StoreCorrupt",
    "StoreError",
    "StoreTooNew",
    "SyncStore",
    "backup_path",
    "open_store",
]
