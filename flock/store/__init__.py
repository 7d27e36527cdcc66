"""Allocations on disk: SQLite at ``<state_dir>/flock.db`` (WAL, synchronous=FULL).

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
them in ONE transaction (one fsync), each inside its own savepoint, and
answers every caller only after that COMMIT has returned — so nothing is
acknowledged before it is on disk, and a call that fails is rolled back to
its savepoint without failing or losing the others.  If the group's
transaction itself is lost (COMMIT fails, or SQLite rolls the whole
transaction back on an I/O error), no caller has been answered yet: each
call is run again on its own, as if it had been queued alone.  A call
queued alone runs as a single autocommit statement, exactly as without
grouping.

Durability (a deliberate refinement of DESIGN's "WAL, synchronous=FULL"):
the connection runs at FULL, and every write that acknowledges something
the runtime relies on — :meth:`SyncStore.commit`, which ADD's reply waits
for, and a committed row put directly — is fsynced before it returns.  Two
writes are not: a *pending* row and a *delete* commit at synchronous=NORMAL
(the pragma is switched around that one transaction; a group made only of
such calls, :class:`LazyCall`, commits so too).  Their purpose is to
survive an agent crash, and a commit in WAL mode has written its frames to
the WAL file before it returns, so a killed process loses nothing: the
kernel holds the page cache.  Only a power loss (or kernel crash) can lose
them, and then no pod namespace or veth survives either: a lost pending row
explains nothing that is still there, and a lost delete brings back a row
for a pod that is gone, like every other row after a power loss (the
runtime's DEL/GC removes it).  Ordering is kept: the WAL is append-only and
an fsync covers the whole file, so the next FULL commit (the ADD's own
commit after its pending row) makes every earlier frame durable with it.
The pending row saves an fsync per ADD and the delete one per DEL, and
neither waits behind the other's disk flush.

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
from flock.store._schema import FILENAME, MIGRATIONS, Migration
from flock.store._sync import LazyCall, SyncStore
from flock.store._thread import MAX_GROUP

__all__ = [
    "FILENAME",
    "MAX_GROUP",
    "MIGRATIONS",
    "AllocationNotFound",
    "LazyCall",
    "Migration",
    "Store",
    "StoreCorrupt",
    "StoreError",
    "StoreTooNew",
    "SyncStore",
    "open_store",
]
